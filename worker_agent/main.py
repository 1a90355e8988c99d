"""``runplane-agent``: the command line of the worker agent. Its flags, and the environment
variables RUNPLANE_AGENT_<FLAG> that may stand for them, are the fields of ``AgentSettings``
(settings.py)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from runplane import __version__
from runplane.domain.accounting import Rates
from runplane.domain.errors import RunplaneError
from runplane.domain.units import format_bytes
from runplane.domain.workers import Worker
from runplane.extras import requirement
from worker_agent.gpu_access import GpuAccess, GpuModeError, Probe, choose, gather
from worker_agent.live import LiveLimits
from worker_agent.metrics import serve as serve_metrics
from worker_agent.preemption import PreemptionWatcher, make_probe
from worker_agent.resources import Gpu, detect_gpus, host_cpus, select_gpus
from worker_agent.settings import AgentSettings, UsageError, parse
from worker_agent.workdir import WorkDir, WorkDirError, engine_shares_our_mounts, prepare

if TYPE_CHECKING:
    import docker

    from runplane.bootstrap import Stack
    from runplane.domain.pools import Pool
    from runplane.domain.secrets import RegistryCredentials
    from worker_agent.agent import Agent
    from worker_agent.netcheck import NetworkCheck
    from worker_agent.registries import RegistryLogins
    from worker_agent.run_config import AgentConfig


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def main(argv: Sequence[str] | None = None) -> int:
    missing_extra = requirement("runplane-agent", ["agent"])  # `pip install runplane` is the client alone
    if missing_extra:
        print(f"runplane-agent: error: {missing_extra}", file=sys.stderr)
        return 2
    try:
        settings = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the Azure SDK logs every HTTP request at INFO: keep the agent's own log readable
    logging.getLogger("azure").setLevel(max(logging.WARNING, logging.getLogger().level))
    import docker  # after argument checks, so --help and bad flags answer fast

    from runplane.bootstrap import build_stack
    from runplane.services.admission import CachedQuotas
    from worker_agent.agent import Agent
    from worker_agent.container_spec import LABEL
    from worker_agent.images import ImageCache
    from worker_agent.inputs import InputCache
    from worker_agent.netcheck import check_network
    from worker_agent.prefetch import Prefetch
    from worker_agent.run_config import AgentPorts
    from worker_agent.selflog import LogUploader

    worker_id = settings.id or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    root = Path(settings.work_dir).expanduser()
    work_dir = root / worker_id
    if settings.prepare_work_dir:
        try:
            _prepare_work_dir(work_dir, root / "cache", settings.allow_suid_work_dir).leave_mounted()
        except WorkDirError as e:
            print(f"runplane-agent: error: {e}", file=sys.stderr)
            return 2
        return 0
    # configuration first (exit 2), then what the machine must offer (exit 1)
    try:
        stack = build_stack()
    except (ValueError, RunplaneError) as e:  # a bad RUNPLANE_* setting or pools file
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2
    pool = pool_or_status(stack, settings, worker_id)
    if isinstance(pool, int):
        return pool
    try:
        client = docker.from_env(max_pool_size=64)
        client.ping()
    except docker.errors.DockerException as e:
        print(f"runplane-agent: error: cannot reach the Docker engine: {e}", file=sys.stderr)
        return 1
    # run directories on a nosuid,nodev mount, found or made (workdir.py); else exit 2
    try:
        prepared = _prepare_work_dir(work_dir, root / "cache", settings.allow_suid_work_dir)
    except WorkDirError as e:
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2
    if prepared.warning:
        logging.getLogger("runplane.agent").warning("%s (--allow-suid-work-dir)", prepared.warning)
    network = check_network(
        client,
        settings.network_mode,
        pool.default_image,
        work_dir,
        pull=settings.pull == "missing",
        name="runplane-netcheck-" + re.sub(r"[^A-Za-z0-9_.-]", "-", worker_id),
        labels={f"{LABEL}.netcheck": worker_id, f"{LABEL}.stack": stack.settings.stack_id()},
    )
    _log_network(network, settings.network_mode)
    # after the network check, which pulls the pool's image: GPU modes are tried with it
    labels = {f"{LABEL}.gpucheck": worker_id, f"{LABEL}.stack": stack.settings.stack_id()}
    found = _gpus_or_status(settings, pool, client, _gpu_probe(client, pool.default_image, labels))
    if isinstance(found, int):
        return found
    gpus, gpu_access = found
    config = agent_config(
        settings, worker_id, work_dir, gpus, pool, stack.settings.stack_id(), prepared.inputs_view, gpu_access
    )
    _log_shortfalls(config, pool)
    agent = Agent(
        config,
        AgentPorts(
            stack.store,
            stack.queue,
            stack.objects,
            CachedQuotas(stack.quotas),
            secrets=stack.secrets,
            opener=stack.opener,
            sessions=stack.sessions,
        ),
        stack.workers,
        client,
        time.time,
        inputs=InputCache(
            root / "cache",
            stack.objects,
            stack.store,
            settings.max_work_dir_size,
            stack.ports.inputs,
            stack.settings.max_upload_bytes,
        ),
        images=ImageCache(client, root / f"images-{socket.gethostname()}.json", settings.max_image_cache_size),
        network=network,
        # the pool's images before its first run (a worker that never pulls runs what it has)
        prefetch=Prefetch(
            client,
            pool.prefetch_images,
            pool_logins(stack, pool, config),
            stall_seconds=settings.prefetch_stall_seconds,
            limit_seconds=settings.prefetch_limit_seconds,
        )
        if pool.prefetch_images and settings.pull != "never"
        else None,
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("runplane.agent").info("signal %d: stopping", signum)
        agent.stop()

    uploader = None
    if settings.log_upload_prefix:
        uploader = LogUploader(stack.objects, work_dir / "agent.log", settings.log_upload_prefix, worker_id)
        uploader.attach()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logging.getLogger("runplane.agent").info("worker %s serving pool %s", worker_id, settings.pool)
    _serve_metrics(settings, agent, prepared.release)
    if settings.preemption_watch:
        PreemptionWatcher(
            make_probe(settings.preemption_watch, settings.metadata_url),
            lambda notice: agent.stop(pass_down=True, reason=notice.text, preempted=True, leaves_at=notice.leaves_at),
        ).start()
    _say_exit(agent, worker_id, agent.run())
    if uploader is not None:
        uploader.stop()
    prepared.release()
    _exit_now(1 if agent.failed else 0)


def pool_or_status(stack: Stack, settings: AgentSettings, worker_id: str) -> Pool | int:
    """The pool this agent serves, or the exit status after saying why not: 2 for a pool the stack
    does not have; 1 for an agent whose version the control plane refuses (``stack_refusal``), its
    worker item saying so too, before anything of the machine is checked or pulled."""
    from worker_agent.reporting import stack_refusal  # with the stores' services: after argument checks

    pool = stack.pools.get(settings.pool)
    if pool is None:
        print(f"runplane-agent: error: unknown pool {settings.pool!r}", file=sys.stderr)
        return 2
    refused = stack_refusal(stack.objects, __version__)
    if refused is None:
        return pool
    now = time.time()
    worker = Worker(id=worker_id, pool=pool.name, status="offline", host=socket.gethostname(), started_at=now,
                    heartbeat_at=now, agent_version=__version__, refused=refused)  # fmt: skip
    with contextlib.suppress(RunplaneError):  # the exit says it all the same
        stack.workers.put(worker)
    print(f"runplane-agent: error: {refused}", file=sys.stderr)
    return 1


def pool_logins(stack: Stack, pool: Pool, config: AgentConfig) -> RegistryLogins:
    """The logins of the pool's own registries, for what the worker pulls for no run in particular."""
    from worker_agent.registries import RegistryLogins
    from worker_agent.secrets import RunSecrets

    providers = config.executor.registry_providers if config.executor is not None else {}
    return RegistryLogins(RunSecrets(stack.secrets, stack.opener), pool.registries, providers)


def _say_exit(agent: Agent, worker_id: str, reason: str) -> None:
    logging.getLogger("runplane.agent").info("worker %s exiting: %s", worker_id, reason)
    if agent.reporter.refused:  # outside the control plane's version window: one line, as for a bad flag
        print(f"runplane-agent: error: {reason}", file=sys.stderr)


def _serve_metrics(settings: AgentSettings, agent: Agent, release: Callable[[], None]) -> None:
    """Serve the agent's metrics when --metrics-port asks; if it cannot, say why, ``release`` the
    work directory and exit 2 before any run is taken."""
    if settings.metrics_port is None:
        return
    try:
        server = serve_metrics(agent.metrics, agent.gauges, settings.metrics_address, settings.metrics_port)
    except OSError as e:
        print(
            f"runplane-agent: error: cannot serve metrics on {settings.metrics_address}:{settings.metrics_port}: {e}",
            file=sys.stderr,
        )
        release()
        raise SystemExit(2) from e
    host, port = server.server_address[:2]
    logging.getLogger("runplane.agent").info("metrics on http://%s:%s/metrics", host, port)


def _log_network(network: NetworkCheck, mode: str) -> None:
    if network.refused:
        logging.getLogger("runplane.agent").warning(
            "runs that ask for a network are refused: %s (checked in %.2fs)", network.refused, network.seconds
        )
    else:
        logging.getLogger("runplane.agent").info(
            "runs that ask for a network get Docker network %s, closed off from metadata and this host "
            "(checked in %.2fs)",
            mode,
            network.seconds,
        )


def agent_config(
    settings: AgentSettings,
    worker_id: str,
    work_dir: Path,
    gpus: Sequence[Gpu],
    pool: Pool,
    stack_id: str,
    inputs_view: Path | None,
    gpu_access: GpuAccess | None = None,
) -> AgentConfig:
    """The agent's configuration: ``settings`` and what was found out at start (the worker's id
    and directory, the GPUs, the pool's containment, the stack, the input cache's view)."""
    from worker_agent.run_config import AgentConfig, ExecutorConfig

    return AgentConfig(
        pool=settings.pool,
        worker_id=worker_id,
        work_dir=work_dir,
        slots=settings.slots,
        memory=settings.memory or pool.memory,
        disk=settings.disk or pool.disk,
        cpuset=settings.cpuset or tuple(host_cpus()),
        gpus=tuple(gpus),
        idle_seconds=settings.idle_seconds,
        exit_after_num_runs=settings.exit_after_num_runs,
        heartbeat_seconds=settings.heartbeat_seconds,
        lease_seconds=settings.lease_seconds,
        poll_seconds=settings.poll_seconds,
        pass_down_termination=settings.pass_down_termination,
        exit_on_exception=settings.exit_on_exception,
        preemptible=settings.preemptible,
        tag=settings.tag,
        tag_exclusive=settings.tag_exclusive,
        group=settings.group,
        executor=ExecutorConfig(
            worker_id=worker_id,
            work_dir=work_dir,
            kill_poll_seconds=settings.kill_poll_seconds,
            upload_deadline_seconds=settings.upload_deadline_seconds,
            stop_budget_seconds=settings.stop_budget_seconds,
            live=LiveLimits(
                settings.live_interval,
                settings.live_max_files,
                settings.live_max_file_bytes,
                settings.live_bytes_per_minute,
                settings.live_max_total_bytes,
            ),
            pull=settings.pull,
            shm_size=settings.shm_size,
            run_user=settings.run_user,
            stack_id=stack_id,
            allow_root=pool.allow_root,
            max_output_files=pool.max_output_files,
            max_log_size=pool.max_log_size,
            max_image_size=pool.max_image_size,
            max_idle_interactive=pool.max_idle_interactive,
            rates=Rates(cpus=pool.cpus, gpus=pool.gpus, memory=pool.memory, price_per_hour=pool.price_per_hour),
            docker_log_size=settings.docker_log_size,
            inputs_view=inputs_view,
            gpu_access=gpu_access or GpuAccess(),
            registries=tuple(pool.registries),
            registry_providers=cloud_logins(pool),
        ),
    )


def cloud_logins(pool: Pool) -> dict[str, Callable[[str], RegistryCredentials]]:
    """The worker's own logins for its pool's ``ecr`` and ``acr`` registries (one of each, shared
    by all its runs: tokens are kept and fetched again before they expire)."""
    from worker_agent.acr import AcrLogins
    from worker_agent.ecr import EcrLogins

    logins: dict[str, Callable[[str], RegistryCredentials]] = {}
    if any(r.ecr for r in pool.registries):
        logins["ecr"] = EcrLogins()
    if any(r.acr for r in pool.registries):
        logins["acr"] = AcrLogins()
    return logins


def _log_shortfalls(config: AgentConfig, pool: Pool) -> None:
    for shortfall in shape_shortfalls(config, pool, _total_memory()):  # once, at start
        logging.getLogger("runplane.agent").warning("%s", shortfall)


def shape_shortfalls(config: AgentConfig, pool: Pool, machine_memory: int) -> list[str]:
    """What to say at start when this worker offers less than its pool's shape (the API admits
    runs up to that shape, and this worker never takes one that asks more than it has), and when
    the machine has less memory than the worker offers its runs."""
    shape = [
        ("cpus", len(config.cpuset), math.ceil(pool.cpus), False),
        ("gpus", len(config.gpus), pool.gpus, False),
        ("memory", config.memory, pool.memory, True),
        ("disk", config.disk, pool.disk, True),
    ]
    short = [
        f"{name} {format_bytes(has) if size else has} of {format_bytes(wanted) if size else wanted}"
        for name, has, wanted, size in shape
        if has < wanted
    ]
    said = []
    if short:
        said.append(
            f"this worker offers less than pool {pool.name}'s shape ({', '.join(short)}): a run that asks more than "
            "it has is never taken here; it waits for a worker of the pool that has it"
        )
    if machine_memory < config.memory:
        said.append(
            f"this machine has {format_bytes(machine_memory)} of memory, less than the {format_bytes(config.memory)} "
            "its runs may set aside (--memory, default the pool's): runs that use all they ask may meet the "
            "machine's out-of-memory killer"
        )
    return said


def _gpus_or_status(
    settings: AgentSettings, pool: Pool, client: docker.DockerClient, probe: Probe | None
) -> tuple[list[Gpu], GpuAccess | None] | int:
    """``_gpus``, or the exit status after saying why not: 1 for a GPU mode this host cannot
    serve (or a GPU pool's worker that can serve none), 2 for a ``--gpuset`` GPU not here."""
    try:
        return _gpus(settings, pool, client, probe)
    except GpuModeError as e:
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2


def _gpus(
    settings: AgentSettings, pool: Pool, client: docker.DockerClient, probe: Probe | None
) -> tuple[list[Gpu], GpuAccess | None]:
    """The GPUs runs may use (``--gpuset`` of those detected) and how they get them here
    (gpu_access.py), said in the log. Where ``--gpu-mode auto`` finds no way to give them, a
    worker of a pool without GPUs offers none, and says why. Raises ValueError for a ``--gpuset``
    GPU not here, and GpuModeError for a named mode this host cannot serve, or for a GPU pool's
    worker that can serve none (exiting, it counts as a failed launch, so the pool is not filled
    with workers that take no run)."""
    log = logging.getLogger("runplane.agent")
    gpus = select_gpus(detect_gpus(), settings.gpuset)
    if not gpus:
        return [], None
    info, version = client.info(), client.version().get("Version", "")
    facts = gather(info, version, driver_dir=settings.gpu_driver_dir)
    try:
        access = choose(settings.gpu_mode, gpus, facts, probe)
    except GpuModeError as e:
        if settings.gpu_mode != "auto" or pool.gpus:
            raise
        log.warning("%s: this worker offers no GPU (start it with --gpu-mode to insist on one)", e)
        return [], None
    log.info("GPU mode %s for %d GPU(s): %s", access.describe(), len(gpus), ", ".join(g.uuid for g in gpus))
    return gpus, access


def _gpu_probe(client: docker.DockerClient, image: str, labels: dict[str, str]) -> Probe | None:
    """Starts ``true`` in ``image`` with a GPU mode's arguments (None: the image is not here, so
    modes are chosen by what the host shows alone)."""
    import docker.errors
    import requests

    from worker_agent.containers import explain

    try:
        client.images.get(image)
    except docker.errors.DockerException:
        logging.getLogger("runplane.agent").warning("no image %s to try GPU modes with: chosen unstarted", image)
        return None

    def probe(extra: dict[str, Any]) -> str | None:
        container = None
        try:
            container = client.containers.create(
                image, ["true"], entrypoint=["/bin/sh", "-c"], network_mode="none", labels=labels, **extra
            )
            container.start()
            status = container.wait(timeout=60).get("StatusCode")
            return None if status == 0 else f"the test container exited {status}"
        except (docker.errors.DockerException, requests.RequestException) as e:
            return explain(e)
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
                    container.remove(force=True, v=True)

    return probe


def _exit_now(status: int) -> NoReturn:
    """Exit with ``status`` once the agent is done, without the interpreter's own wait for threads
    at exit: every run has ended, but an upload that outlasted its deadline may still hang on its
    threads (the upload pool's and boto3's, which ``concurrent.futures`` joins at exit), and would
    hold the process, and the machine, until the object store answered or the client gave up."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _prepare_work_dir(work_dir: Path, cache: Path, allow_suid: bool) -> WorkDir:
    """This worker's directories, run directories on a nosuid,nodev mount (workdir.py). Raises
    WorkDirError."""
    why_not = None
    if os.geteuid() != 0:
        why_not = f"it runs as uid {os.geteuid()}, not root"
    elif not engine_shares_our_mounts(os.environ.get("DOCKER_HOST")):
        why_not = "the Docker engine is in another mount namespace: this agent runs in a container or a sandbox"
    return prepare(work_dir, cache, why_not=why_not, allow_suid=allow_suid)
