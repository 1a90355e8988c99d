"""The worker agent's settings, ``AgentSettings``: each field is one flag of ``runplane-agent``
(``--kebab-name``) and one environment variable (``RUNPLANE_AGENT_<NAME>``, for AMIs, Batch
jobs, pods and Slurm jobs), with its type, default and help text; ``parser()`` is generated from
the fields, and ``parse`` reads a command line and the environment into one validated object."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NoReturn

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import SettingsConfigDict

from runplane.domain.common import NAME_PATTERN
from runplane.domain.units import parse_bytes, parse_duration
from runplane.settings import EnvironSource, Settings
from worker_agent.preemption import METADATA_URL, make_probe
from worker_agent.resources import host_cpus, parse_set

ENV_PREFIX = "RUNPLANE_AGENT_"
DESCRIPTION = (
    "The runplane worker agent: takes runs from one pool's queue and runs each in a Docker container. "
    "Every flag can also be set as the environment variable named after it (a flag beats its variable; "
    "a switch is on with 1, true or yes). The stack's own settings are RUNPLANE_* variables (README.md)."
)


class UsageError(Exception):
    """A bad flag or variable; its text is one line that names it (exit status 2)."""


def flag_name(name: str) -> str:
    """``work_dir`` (or ``work-dir``) -> ``--work-dir``."""
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    """``work_dir`` (or ``work-dir``) -> ``RUNPLANE_AGENT_WORK_DIR``."""
    return ENV_PREFIX + name.upper().replace("-", "_")


def _size(value: Any) -> int | None:
    return None if value is None else parse_bytes(value)


def _duration(value: Any) -> float | None:
    return None if value is None else parse_duration(value)


def _cores(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    cores = parse_set(value, "--cpuset")
    for core in cores:
        if not core.isdigit():
            raise ValueError(f"{core!r} is not a core index")
    return tuple(int(c) for c in cores)


def _available(cores: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if cores is not None:
        allowed = set(host_cpus())
        outside = sorted(set(cores) - allowed)
        if outside:
            raise ValueError(f"cores {_ranges(outside)} are not available here (available: {_ranges(allowed)})")
    return cores


def _ranges(cores: set[int] | list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    spans: list[list[int]] = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{low}-{high}" if high > low else str(low) for low, high in spans)


def _gpus(value: Any) -> Any:
    return tuple(parse_set(value, "--gpuset")) if isinstance(value, str) else value


def _name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(f"{value!r} is not a valid name (lower-case letters, digits and -)")
    return value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


Size = Annotated[int | None, BeforeValidator(_size)]
Duration = Annotated[float | None, BeforeValidator(_duration)]
Name = Annotated[str | None, AfterValidator(_name)]


class AgentSettings(Settings):
    """Everything ``runplane-agent`` is told. Field order is the order of ``--help``. Values given
    as text (flags, variables) are parsed here: sizes to bytes, durations to seconds, sets to
    tuples. Raises pydantic.ValidationError; ``parse`` turns it into a UsageError."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="forbid", frozen=True)

    pool: str = Field(description="pool whose queue this worker serves")
    id: str | None = Field(None, description="worker id (default: host name plus a random suffix)")
    slots: int = Field(1, ge=1, description="runs at the same time")
    tag: Name = Field(None, description="also take runs that ask for this tag (only those with --tag-exclusive)")
    tag_exclusive: bool = Field(False, description="take only runs that ask for --tag, none of the untagged ones")
    group: Name = Field(None, description="take only runs of members of this group (a group's own machines)")
    cpuset: Annotated[tuple[int, ...] | None, BeforeValidator(_cores), AfterValidator(_available)] = Field(
        None, description="CPU cores runs may use, e.g. 0-7,16 (default: all this process may use)"
    )
    gpuset: Annotated[tuple[str, ...] | None, BeforeValidator(_gpus)] = Field(
        None, description="GPUs runs may use, as indices or UUIDs, e.g. 0,1 (default: all detected)"
    )
    gpu_mode: Literal["auto", "nvidia-runtime", "cdi", "devices"] = Field(
        "auto",
        description="how runs get their GPUs: nvidia-runtime (the NVIDIA container toolkit), cdi (an engine that "
        "reads CDI specs), devices (no runtime: the run's /dev/nvidiaN and the driver's libraries, bound "
        "read-only), or auto (the first of these that works here)",
    )
    gpu_driver_dir: str | None = Field(
        None,
        description="for --gpu-mode devices: where the driver's libraries and tools are (default: the loader "
        "cache and PATH)",
    )
    memory: Size = Field(
        None,
        description="memory this worker's runs may set aside in all, each what it asks, e.g. 64g (default: the "
        "pool's memory)",
    )
    disk: Size = Field(
        None,
        description="disk this worker's runs may set aside in all, each what it asks (inputs and what it writes), "
        "e.g. 500g (default: the pool's disk)",
    )
    shm_size: str | None = Field(None, description="size of /dev/shm in run containers, e.g. 1g")
    work_dir: str = Field(
        "~/.runplane/agent", description="where run directories and the input cache live (may be shared)"
    )
    max_work_dir_size: Size = Field(
        None, description="evict cached inputs, least recently used first, above this size, e.g. 100g"
    )
    max_image_cache_size: Size = Field(
        None, description="remove images runs used, least recently used first, above this size"
    )
    allow_suid_work_dir: bool = Field(
        False,
        description="start even where run directories cannot be put on a nosuid,nodev mount (setuid files and "
        "device nodes runs leave there then work for users of this host)",
    )
    prepare_work_dir: bool = Field(
        False,
        description="only make this worker's nosuid,nodev work-dir mounts and exit, leaving them (for a privileged "
        "ExecStartPre of a sandboxed service, or a host's boot script)",
    )
    idle_seconds: Duration = Field(None, description="exit after this long with no run (e.g. 300, 5m)")
    exit_after_num_runs: int | None = Field(None, description="exit after taking this many runs")
    pass_down_termination: bool = Field(
        False, description="on SIGTERM stop running runs and re-queue them before exiting"
    )
    exit_on_exception: bool = Field(
        False, description="exit (status 1) on an unexpected error instead of retrying with backoff"
    )
    preemptible: bool = Field(
        False, description="this machine may vanish (spot): losing it does not use up one of a run's attempts"
    )
    preemption_watch: str | None = Field(
        None, description="watch for spot/preemption notices: ec2, azure or an http(s) URL"
    )
    metadata_url: str = Field(METADATA_URL, description="instance metadata endpoint for --preemption-watch")
    heartbeat_seconds: float = Field(5.0, gt=0, description="how often to renew leases and report")
    lease_seconds: float = Field(30.0, gt=0, description="how long a run stays ours without a heartbeat")
    poll_seconds: float = Field(5.0, gt=0, description="queue long-poll time")
    kill_poll_seconds: float = Field(1.0, gt=0, description="how often a running run checks for a kill request")
    upload_deadline_seconds: float = Field(300.0, gt=0, description="the most time outputs may take to upload")
    stop_budget_seconds: float = Field(
        100.0,
        gt=0,
        description="the most a run's stop may take when the agent stops (its checkpoint grace, three quarters at "
        "most, and its final sync): below the service manager's stop timeout (TimeoutStopSec=120)",
    )
    live_interval: Annotated[float, BeforeValidator(_duration)] = Field(
        15.0, gt=0, description="how often files a run writes under $RUNPLANE_OUTPUT/live/ are uploaded while it runs"
    )
    live_max_files: int = Field(100, ge=0, description="the most files of a run's live/ uploaded while it runs")
    live_max_file_bytes: Annotated[int, BeforeValidator(_size)] = Field(
        64 * 1024**2, ge=0, description="files of live/ larger than this are uploaded only when the run ends"
    )
    live_bytes_per_minute: Annotated[int, BeforeValidator(_size)] = Field(
        64 * 1024**2, gt=0, description="the most bytes of one run's live/ uploaded a minute while it runs"
    )
    live_max_total_bytes: Annotated[int, BeforeValidator(_size)] = Field(
        1024**3, ge=0, description="the most bytes of one run attempt's live/ uploaded while it runs, in all"
    )
    prefetch_stall_seconds: float = Field(
        120.0, gt=0, description="give up a prefetch pull the engine says nothing of for this long"
    )
    prefetch_limit_seconds: float = Field(
        1800.0, gt=0, description="the most time the pool's prefetch_images may take before the worker takes runs"
    )
    network_mode: str = Field(
        "runplane-runs",
        description="Docker network for runs that ask for a network, closed off from the cloud's metadata service "
        "and this host (runplane-runs: a bridge, made if missing); host or none: such runs are refused",
    )
    pull: Literal["missing", "never"] = Field(
        "missing", description="pull images that are missing ('missing') or never ('never')"
    )
    run_user: str = Field(
        "nobody",
        description="who runs commands, in numbers from the image's /etc/passwd and /etc/group: nobody (the "
        "image's USER unless it is root in any spelling, then 65534:65534), image (the image's USER, root too "
        "where the pool has allow_root), or UID[:GID]; uid 0 only where the pool has allow_root, gid 0 never for "
        "other uids",
    )
    docker_log_size: str = Field(
        "10m",
        description="cap of Docker's own log file of a run container (two are kept); the agent ships the output itself",
    )
    log_upload_prefix: str | None = Field(
        None, description="upload this agent's own log to object storage under this prefix"
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve this worker's figures as Prometheus text on this port (/metrics)"
    )
    metrics_address: str = Field("127.0.0.1", description="the address --metrics-port listens on")
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(_upper)] = Field(
        "INFO", description="DEBUG, INFO, WARNING or ERROR"
    )

    @field_validator("docker_log_size")
    @classmethod
    def _in_bytes(cls, value: str) -> str:
        # Docker reads fewer spellings of a size than parse_bytes: it gets the count of bytes
        return str(parse_bytes(value))

    @field_validator("run_user")
    @classmethod
    def _run_user(cls, value: str) -> str:
        if value not in ("nobody", "image") and not re.fullmatch(r"\d+(:\d+)?", value):
            raise ValueError("must be nobody, image, or UID[:GID]")
        return value

    @field_validator("preemption_watch")
    @classmethod
    def _watch(cls, value: str | None) -> str | None:
        if value is not None:
            make_probe(value)
        return value

    @model_validator(mode="after")
    def _together(self) -> AgentSettings:
        if self.heartbeat_seconds * 2 > self.lease_seconds:
            raise ValueError("--lease-seconds must be at least twice --heartbeat-seconds")
        if self.tag_exclusive and not self.tag:
            raise ValueError("--tag-exclusive needs --tag")
        return self


def default(name: str) -> Any:
    """The default of ``AgentSettings.<name>`` as written (before parsing): the defaults of the
    configurations built from the settings (``AgentConfig``, ``ExecutorConfig``)."""
    return AgentSettings.model_fields[name].default


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def _help(name: str) -> str:
    field = AgentSettings.model_fields[name]
    text = field.description or ""
    if field.is_required():
        text += " (required)"
    elif field.default not in (None, False) and f"default: {field.default}" not in text:
        text += f" (default: {field.default})"
    return f"{text} [env {env_name(name)}]".replace("%", "%%")


def parser() -> argparse.ArgumentParser:
    """``runplane-agent``'s command line, one flag per field; a flag not given is left out of the
    namespace (the environment or the default decides). ``error`` raises UsageError."""
    result = _Parser(prog="runplane-agent", description=DESCRIPTION)
    for name, field in AgentSettings.model_fields.items():
        if field.annotation is bool:
            result.add_argument(
                flag_name(name), dest=name, action="store_true", default=argparse.SUPPRESS, help=_help(name)
            )
        else:
            result.add_argument(flag_name(name), dest=name, default=argparse.SUPPRESS, help=_help(name))
    return result


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> AgentSettings:
    """The settings of ``argv`` and ``environ`` (``os.environ`` when None): a flag beats its
    variable, which beats the default; an empty variable counts as unset. Raises UsageError."""
    given = vars(parser().parse_args(list(argv)))
    from_env = EnvironSource(AgentSettings, os.environ if environ is None else environ)()
    try:
        return AgentSettings(**{**from_env, **given})
    except ValidationError as e:
        raise UsageError(_message(e.errors()[0], from_env.keys() - given.keys())) from None


def _message(error: ErrorDetails, from_env: set[str]) -> str:
    """One line for a validation error, naming the flag (and the variable, when it set the value)."""
    text = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return text  # a rule between fields, whose text names them
    name = str(error["loc"][0])
    flag = flag_name(name)
    if error["type"] == "missing":
        return f"{flag} is required (or set {env_name(name)})"
    where = f"{flag} ({env_name(name)})" if name in from_env else flag
    ctx = error.get("ctx", {})
    given = error.get("input")
    text = {
        "int_parsing": f"{given!r} is not a whole number",
        "int_from_float": f"{given!r} is not a whole number",
        "float_parsing": f"{given!r} is not a number",
        "bool_parsing": f"{given!r} is not a switch value (1, true, yes or 0, false, no)",
        "greater_than": "must be positive" if ctx.get("gt") == 0 else f"must be more than {ctx.get('gt')}",
        "greater_than_equal": f"must be at least {ctx.get('ge')}",
        "less_than_equal": f"must be at most {ctx.get('le')}",
        "literal_error": f"must be {ctx.get('expected')}",
    }.get(error["type"], text)
    # messages of shared parsers may name the flag already
    return f"{where}: {text.removeprefix(flag).lstrip(': ')}"
