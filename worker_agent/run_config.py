"""What the agent and each of its executors are given: their settings, and the stack's ports
runs use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runplane import __version__
from runplane.domain.accounting import Rates
from runplane.domain.pools import RegistryLogin
from runplane.domain.secrets import RegistryCredentials
from runplane.ports import ObjectStore, QuotaStore, RunQueue, RunStore, SecretOpener, SecretStore, SessionStore
from runplane.services.skew import STACK_CHECK_SECONDS
from worker_agent.gpu_access import GpuAccess
from worker_agent.live import LiveLimits
from worker_agent.resources import Gpu
from worker_agent.settings import default


@dataclass(frozen=True)
class ExecutorConfig:
    worker_id: str
    work_dir: Path
    kill_poll_seconds: float = default("kill_poll_seconds")
    tick_seconds: float = 0.2
    log_flush_seconds: float = 1.0
    usage_seconds: float = 2.0
    upload_deadline_seconds: float = default("upload_deadline_seconds")
    live: LiveLimits = field(default_factory=LiveLimits)  # outputs while the run goes (live.py)
    pids_limit: int = 4096
    shm_size: str | None = default("shm_size")
    run_user: str = default("run_user")
    stack_id: str = ""
    pull: str = default("pull")  # missing | never
    # the pool's containment (Pool.allow_root, max_output_files, max_log_size, max_image_size)
    allow_root: bool = False
    max_output_files: int = 100_000
    max_log_size: int = 1024**3
    max_image_size: int | None = None  # the pool's: larger images are refused (images.py)
    max_idle_interactive: float = 1800.0  # the pool's: an interactive run without input this long is killed
    rates: Rates = field(default_factory=Rates)  # the pool's shape and price: what runs are charged
    docker_log_size: str = default("docker_log_size")  # Docker's own json log of a run: two files of at most this
    inputs_view: Path | None = None  # the input cache's read-only nosuid,nodev view (workdir.py)
    disk_sample_share: float = 0.05  # the most of its time the agent spends walking a run's files
    max_disk_interval_seconds: float = 10.0  # and the longest a run goes between two disk checks
    stop_seconds: float = 30.0  # how long a killed container may take to exit; past it, nothing uploads
    remove_seconds: float = 600.0  # how long removing a container may take (a layer of millions of files)
    # a piece (checkpoint.exit_code) that ran less than short_piece_seconds is followed by a pause before
    # the next one: piece_backoff_seconds, doubled for each short one in a row, at most max_piece_backoff_seconds
    short_piece_seconds: float = 10.0
    piece_backoff_seconds: float = 5.0
    max_piece_backoff_seconds: float = 60.0
    # the most a stop (pass-down: the agent stopping) may take: a run's grace and its final sync together
    # (the systemd unit's TimeoutStopSec=120 leaves the rest for handing the runs back and the agent's exit)
    stop_budget_seconds: float = 100.0
    gpu_access: GpuAccess = field(default_factory=GpuAccess)  # how a run's GPUs reach its container
    registries: tuple[RegistryLogin, ...] = ()  # the pool's registry logins (worker_agent/registries.py)
    # the worker's own logins by kind ("ecr", "acr": worker_agent/ecr.py, acr.py), for those entries
    registry_providers: Mapping[str, Callable[[str], RegistryCredentials]] = field(default_factory=dict)

    def piece_pause(self, short: int) -> float:
        """Seconds to wait before the next piece after ``short`` short ones in a row."""
        doubled: float = self.piece_backoff_seconds * 2.0 ** min(short - 1, 16)
        return min(doubled, self.max_piece_backoff_seconds)


@dataclass(frozen=True)
class AgentPorts:
    """The ports of the control plane an agent reaches: narrower than the control plane's
    ``runplane.ports.Ports``, and, like it, a ``RunPorts`` for what writes a run's state."""

    store: RunStore
    queue: RunQueue
    objects: ObjectStore
    quotas: QuotaStore | None = None
    """Where claims reserve room under quotas (``services/admission.py``); None: no admission."""
    secrets: SecretStore | None = None
    """Where the secrets runs name are kept (sealed); None: runs naming one end secret_unavailable."""
    opener: SecretOpener | None = None
    """What opens them: only the workers' credentials can (worker_agent/secrets.py)."""
    sessions: SessionStore | None = None
    """Sessions into the runs it holds (``runplane exec``, ``shell``, ``port-forward``); None: none are taken."""


@dataclass(frozen=True)
class AgentConfig:
    pool: str
    worker_id: str
    work_dir: Path
    slots: int = default("slots")
    memory: int = 0  # bytes runs may set aside in all (0: uncounted); runplane-agent gives --memory or the pool's
    disk: int = 0  # bytes of disk runs may set aside in all (0: uncounted); runplane-agent gives --disk or the pool's
    idle_seconds: float | None = default("idle_seconds")
    exit_after_num_runs: int | None = default("exit_after_num_runs")
    heartbeat_seconds: float = default("heartbeat_seconds")
    skew_check_seconds: float = STACK_CHECK_SECONDS  # how often a heartbeat reads the stack's version window again
    lease_seconds: float = default("lease_seconds")
    poll_seconds: float = default("poll_seconds")
    pass_down_termination: bool = default("pass_down_termination")
    exit_on_exception: bool = default("exit_on_exception")
    preemptible: bool = default("preemptible")
    executor: ExecutorConfig | None = None  # None: the defaults, for this worker_id and work_dir
    cpuset: tuple[int, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    tag: str | None = default("tag")
    tag_exclusive: bool = default("tag_exclusive")
    group: str | None = default("group")
    version: str = __version__  # the version it reports, and is checked by when it registers
