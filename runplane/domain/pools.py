"""Pools: the classes of workers (shape, backend, queue), loading their configuration and
choosing a pool for a run."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runplane.domain.asks import Resources, RetryRule
from runplane.domain.common import MAX_RUN_TIME, NAME_PATTERN, read_duration, read_size
from runplane.domain.errors import InvalidRequest, UnknownName, Unschedulable
from runplane.domain.retention import Retention
from runplane.domain.sessions import DEFAULT_MAX_SESSIONS_PER_RUN, MAX_SESSIONS_PER_RUN
from runplane.domain.units import format_bytes, format_duration

Backend = Literal["local", "aws-batch", "azure-batch", "kubernetes", "slurm"]
"""The compute backends: the names of ``runplane.compute.registry.BACKENDS``, each with its options
model and builder there (tests/unit/test_backend_registry.py holds the two lists equal)."""


class RegistryLogin(BaseModel):
    """How a pool's workers log in to one registry for every run on it (docs/secrets.md): with a
    group's secret (``group/name``), or with the worker's own cloud identity (``ecr``: an ECR token
    its role fetches and refreshes; ``acr``: a token its node identity exchanges)."""

    model_config = ConfigDict(extra="forbid")

    server: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$")
    secret: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,47}/[a-z0-9][a-z0-9_.-]{0,62}$")
    ecr: bool = False
    acr: bool = False

    @model_validator(mode="after")
    def _one_way(self) -> RegistryLogin:
        if [self.secret is not None, self.ecr, self.acr].count(True) != 1:
            raise ValueError(f"registry {self.server}: give exactly one of secret (group/name), ecr: true, acr: true")
        return self


class Pool(BaseModel):
    """A class of workers with one shape, one backend and one queue."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    backend: Backend = "local"
    cpus: float = Field(gt=0)
    gpus: int = Field(default=0, ge=0)
    gpu_type: str | None = None
    memory: int
    disk: int = 100 * 1024**3
    slots: int = Field(default=1, ge=1, description="concurrent runs per worker")
    min_workers: int = Field(default=0, ge=0)
    max_workers: int = Field(default=1, ge=0)
    seconds_between_launches: float = Field(default=0, ge=0)
    max_launches_per_cycle: int | None = Field(default=None, ge=1, description="cap on workers started per pass")
    start_timeout_seconds: float = Field(
        default=900, gt=0, description="a started job whose agent has not registered by then is cancelled"
    )
    max_failed_launches: int = Field(
        default=3, ge=1, description="consecutive failed launches that disable the pool (with the reason)"
    )
    retry_disabled_seconds: float = Field(
        default=600, gt=0, description="a disabled pool tries one launch again after this long"
    )
    idle_seconds: float = Field(default=120, gt=0)
    runs_per_worker: int | None = Field(default=None, ge=1)
    default_image: str
    default_time: float = Field(default=24 * 3600, gt=0, le=MAX_RUN_TIME)
    max_time: float = Field(default=7 * 86400, gt=0, le=MAX_RUN_TIME, description="the longest time a run may ask")
    allow_root: bool = Field(
        default=False, description="runs may run as uid 0 (the image's root user); otherwise uid 0 becomes 65534"
    )
    max_output_files: int = Field(
        default=100_000, ge=1, description="files a run may write: output directory, home and container layer together"
    )
    max_log_size: int = Field(default=1024**3, ge=1024, description="bytes of stdout+stderr a run may write")
    max_image_size: int | None = Field(
        default=None,
        gt=0,
        description="the largest image a run may use, unpacked (as docker images shows); a larger one ends the run "
        "image_too_large, and its pull is given up once the layers announced pass it (none: any size)",
    )
    max_user_priority: int = Field(
        default=50, ge=0, le=100, description="the highest priority a user who is not an admin may give a run"
    )
    fair_share_half_life: float = Field(
        default=3600,
        gt=0,
        le=365 * 86400,
        description="seconds in which a user's lead over the others in this pool (runs submitted ahead of "
        "them) halves; docs/scheduling.md",
    )
    price_per_hour: float | None = Field(
        default=None, ge=0, le=1e6, description="what one worker of this pool costs an hour; runs record their cost"
    )
    retry: RetryRule | None = Field(
        default=None, description="the retry rule of runs that bring none of their own (docs/workflows.md)"
    )
    max_waiting_runs: int = Field(
        default=1000,
        ge=0,
        le=1000,  # what one check can count: the user's newest runs one listing examines (ports.LIST_BUDGET)
        description="runs of one user that may wait for other runs in this pool at once; docs/scheduling.md",
    )
    max_open_sweeps: int = Field(
        default=100,
        ge=0,
        le=500,  # what one check can count: the user's newest sweeps it reads (services.sweeps.OPEN_CAP_PAGES)
        description="unfinished sweeps one user may have in this pool at once",
    )
    registries: list[RegistryLogin] = Field(
        default_factory=list,
        max_length=32,
        description="registries the pool's workers log in to for every run (a group's secret, ecr or acr); a "
        "run's own image_pull_secret comes first",
    )
    prefetch_images: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="images a new worker pulls before it takes its first run",
    )
    allow_exec: bool = Field(
        default=True, description="owners may open sessions into their running runs (exec, shell, port-forward)"
    )
    allow_admin_exec: bool = Field(
        default=False, description="admins may open sessions into other users' runs (else: 404, as for anyone)"
    )
    max_sessions_per_run: int = Field(
        default=DEFAULT_MAX_SESSIONS_PER_RUN,
        ge=0,
        le=MAX_SESSIONS_PER_RUN,
        description="sessions one run may have at once",
    )
    max_idle_interactive: float = Field(
        default=1800,
        gt=0,
        le=MAX_RUN_TIME,
        description="an interactive run (run -it) that gets no input for this long is killed, saying so",
    )
    retention: Retention | None = Field(
        default=None,
        description="how long this pool's finished runs' outputs, logs and records are kept, field by field over "
        "the stack's RUNPLANE_RETENTION (docs/retention.md)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="backend-specific settings")

    _sizes = field_validator("memory", "disk", "max_log_size", "max_image_size", mode="before")(staticmethod(read_size))
    _times = field_validator(
        "default_time",
        "max_time",
        "idle_seconds",
        "start_timeout_seconds",
        "retry_disabled_seconds",
        "seconds_between_launches",
        "max_idle_interactive",
        mode="before",
    )(staticmethod(read_duration))

    @model_validator(mode="after")
    def _bounds(self) -> Pool:
        if self.min_workers > self.max_workers:
            raise ValueError(f"pool {self.name}: min_workers > max_workers")
        if self.retention is not None and self.retention.uploads is not None:
            raise ValueError(f"pool {self.name}: uploads' retention is the stack's (RUNPLANE_RETENTION), not a pool's")
        return self

    def kept(self, stack: Retention) -> Retention:
        """How long this pool's runs' outputs, logs and records are kept: its retention over the stack's."""
        return stack if self.retention is None else self.retention.over(stack)

    def with_defaults(self, resources: Resources) -> Resources:
        """Fill what a run left out: a share of one worker, capped at 1g memory and 10g disk."""
        return resources.model_copy(
            update={
                "memory": resources.memory or min(1024**3, self.memory // self.slots),
                "disk": resources.disk or min(10 * 1024**3, self.disk // self.slots),
                "time": resources.time or min(self.default_time, self.max_time),
            }
        )

    def shape(self) -> str:
        gpus = f", {self.gpus} gpu" + (f" ({self.gpu_type})" if self.gpu_type else "") if self.gpus else ""
        return (
            f"{self.name}: {self.cpus:g} cpus{gpus}, {format_bytes(self.memory)} memory, {format_bytes(self.disk)} disk"
        )

    def misfit(self, resources: Resources) -> str | None:
        """Why a run with ``resources`` can never run here, or None if it fits."""
        if resources.cpus > self.cpus:
            return f"asks {resources.cpus:g} cpus, pool has {self.cpus:g}"
        if resources.gpus > self.gpus:
            return f"asks {resources.gpus} gpus, pool has {self.gpus}"
        if resources.memory is not None and resources.memory > self.memory:
            return f"asks {format_bytes(resources.memory)} memory, pool has {format_bytes(self.memory)}"
        if resources.disk is not None and resources.disk > self.disk:
            return f"asks {format_bytes(resources.disk)} disk, pool has {format_bytes(self.disk)}"
        if resources.time is not None and resources.time > self.max_time:
            return f"asks {format_duration(resources.time)}, pool allows at most {format_duration(self.max_time)}"
        return None


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pools: Annotated[list[Pool], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique(self) -> PoolConfig:
        names = [p.name for p in self.pools]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate pool names: {sorted(dupes)}")
        return self

    def get(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)


def load_pools(text_or_path: str, check: Callable[[Pool], object] | None = None) -> PoolConfig:
    """Read pools from a YAML/JSON file path or an inline YAML/JSON document. ``check`` is run on
    each pool (its backend's check of its options: ``runplane.compute.registry.check_pool``) and
    may raise InvalidRequest.

    Raises ValueError with one line, the file and the first problem, when the config is not valid.
    """
    source = "inline pools"
    text = text_or_path
    if "\n" not in text_or_path and not text_or_path.lstrip().startswith(("{", "[")):
        path = Path(text_or_path).expanduser()
        source = str(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ValueError(f"cannot read pools file {path}: {e.strerror}") from e
    data: Any
    try:
        data = json.loads(text)  # what functions get in RUNPLANE_POOLS; no YAML parser needed
    except ValueError:
        import yaml  # only for YAML files: it costs the Lambda cold start otherwise

        try:
            data = yaml.load(text, Loader=_yaml_1_2_loader(yaml))  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as e:
            raise ValueError(f"{source}: not valid YAML/JSON: {e}") from e
    if isinstance(data, list):
        data = {"pools": data}
    try:
        config = PoolConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{source}: {_where(data, first['loc'])}: {message}") from e
    for pool in config.pools:
        try:
            if check is not None:
                check(pool)
        except InvalidRequest as e:
            raise ValueError(f"{source}: {e.message}") from e
    return config


def _where(data: Any, loc: tuple[int | str, ...]) -> str:
    """Where in the pools document an error is: ``pool NAME: field`` for a field of a pool with a
    valid name, else the path (``pools.0.memory``, ``pools``)."""
    pools = data.get("pools") if isinstance(data, dict) else None
    if len(loc) > 2 and loc[0] == "pools" and isinstance(loc[1], int) and isinstance(pools, list):
        pool = pools[loc[1]] if loc[1] < len(pools) else None
        name = pool.get("name") if isinstance(pool, dict) else None
        if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name):
            return f"pool {name}: " + ".".join(str(part) for part in loc[2:])
    return ".".join(str(part) for part in loc)


def dump_pools(config: PoolConfig) -> str:
    return json.dumps(config.model_dump(mode="json"))


def _size_key(pool: Pool) -> tuple[int, float, int]:
    return (pool.gpus, pool.cpus, pool.memory)


def choose_pool(config: PoolConfig, resources: Resources, queue: str | None) -> Pool:
    """The named pool if the request fits it, else the smallest pool that fits.

    Raises InvalidRequest for an unknown queue and Unschedulable when nothing can fit,
    naming the largest pool shape so the user knows what to ask for.
    """
    if queue is not None:
        pool = config.get(queue)
        if pool is None:
            names = ", ".join(p.name for p in config.pools)
            raise UnknownName(f"unknown queue {queue!r}; pools are: {names}")
        why = pool.misfit(resources)
        if why:
            raise Unschedulable(f"no worker of pool {pool.shape()} can run this: {why}")
        return pool
    fitting = [p for p in config.pools if p.misfit(resources) is None]
    if not fitting:
        largest = max(config.pools, key=_size_key)
        raise Unschedulable(
            f"no pool can run this request ({largest.misfit(resources) or 'too large'}); "
            f"the largest pool is {largest.shape()}"
        )
    return min(fitting, key=_size_key)


def _yaml_1_2_loader(yaml: Any) -> Any:
    """A SafeLoader whose booleans are YAML 1.2's (true, false): PyYAML reads YAML 1.1, where
    ``on``, ``off``, ``yes`` and ``no`` are booleans too, so that a retry rule's key ``on:`` would
    come out as True. The pools' models read "yes" or "on" as true where they want a boolean."""

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    return Loader
