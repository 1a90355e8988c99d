"""Workers as their agents report them, and the dispatcher's record of each pool."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from runplane.domain.common import SCHEMA_VERSION
from runplane.domain.runs import Run
from runplane.domain.units import format_progress
from runplane.domain.wire import Record, Since


class StartingJob(Record):
    """A worker the dispatcher launched whose agent has not registered yet."""

    worker_id: str
    launched_at: float
    running_since: float | None = None
    """When a dispatcher pass first saw the engine run it (start timeouts count from here)."""


class PoolRecord(Record):
    """The dispatcher's memory of one pool. Every write is conditional on ``version``, so two
    dispatchers acting at once never both launch: the second one's write fails and it backs off.
    Written with ``resume`` only when it holds something, so that the previous release reads it too."""

    v: int = SCHEMA_VERSION
    pool: str
    version: int = 0
    launching_since: float | None = None
    """Set while a dispatcher is between claiming a launch and recording its jobs."""
    last_launch_at: float | None = None
    launched: int = 0
    failed_launches: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    disabled_reason: str | None = None
    disabled_at: float | None = None
    starting: dict[str, StartingJob] = Field(default_factory=dict)
    """Backend job id -> the launched worker, until its agent registers or the job ends."""
    last_decision: str | None = None
    decided_at: float | None = None
    backlog: int | None = None
    """Runs queued for the pool when a dispatcher last counted (None: never counted)."""
    workers: dict[str, int] = Field(default_factory=dict)
    """Workers by status at that count: starting, idle, busy, draining, offline."""
    counted_at: float | None = None
    """When ``backlog`` and ``workers`` were counted; a pass rewrites them when they change, and
    at least every ``FIGURES_REFRESH_SECONDS`` (runplane.services.dispatch) while they do not."""
    agent_versions: Annotated[dict[str, int], Since("0.2")] = Field(default_factory=dict)
    """Live workers by the version of their agent, at that count."""
    refused: Annotated[dict[str, str], Since("0.2")] = Field(default_factory=dict)
    """Worker id -> why this control plane refuses its agent (the version skew policy), at that count."""
    resume: dict[str, str] = Field(default_factory=dict)
    """Only in the schedule's own record (``SCHEDULE_RECORD``): where its bounded passes over
    waiting runs and sweeps stopped, so that the next one goes on from there; and in the retention
    sweep's (``services.retention.RESUME_RECORD``): where its walks over ended runs and its look at
    the uploads stopped, and the retention each pool's runs were last dated under; and in the
    reaper's (``services.reap.FALLBACK_RECORD``): where its look at each pool's queued runs stopped."""

    @field_validator("resume", mode="before")
    @classmethod
    def _readable_marks(cls, value: Any) -> dict[str, str]:
        """Only text marks are kept: a mark that is not (written by another release, or damaged)
        is dropped, and the pass it belonged to starts over, rather than the record being unreadable
        and every scheduled pass failing on it."""
        if not isinstance(value, dict):
            return {}
        return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}

    @model_serializer(mode="wrap")
    def _written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.resume:
            data.pop("resume", None)
        return data

    def starting_among(self, registered: set[str]) -> int:
        """Launched workers whose agent is not among ``registered`` yet."""
        return len([s for s in self.starting.values() if s.worker_id not in registered])


class Pulling(Record):
    """An image a new worker pulls before it takes its first run (its pool's ``prefetch_images``),
    and how far it is: bytes of the layers the registry announced so far, and of those downloaded."""

    image: str
    done: int = 0
    total: int = 0

    def describe(self) -> str:
        """'worker pulling image X (1.2 of 4.5 GB)'."""
        if self.total <= 0:
            return f"worker pulling image {self.image}"
        return f"worker pulling image {self.image} ({format_progress(min(self.done, self.total), self.total)})"


WorkerStatus = Literal["starting", "idle", "busy", "draining", "offline"]


class Worker(Record):
    """What a worker agent reports at each heartbeat."""

    v: int = SCHEMA_VERSION
    id: str
    pool: str
    status: WorkerStatus = "idle"
    host: str = ""
    slots: int = 1
    free_slots: int = 1
    cpus: float = 0
    gpus: int = 0
    memory: int = 0
    free_cpus: float = 0
    free_gpus: int = 0
    gpu_ids: list[str] = Field(default_factory=list)
    cached_inputs: int = 0
    runs: list[str] = Field(default_factory=list)
    run_owners: dict[str, str] = Field(default_factory=dict)
    """Run id -> its owner, for the runs held: users are shown only their own runs' ids."""
    runs_done: int = 0
    runs_left: int | None = None
    started_at: float
    heartbeat_at: float
    backend_job_id: str | None = None
    agent_version: str = ""
    tag: str | None = None
    tag_exclusive: bool = False
    group: str | None = None
    network_refused: str | None = None
    """Why this worker takes no runs that ask for a network (None: it takes them)."""
    refused: Annotated[str | None, Since("0.2")] = None
    """Why the control plane refused this worker's agent at registration (its version is outside the
    window of runplane.domain.versions): it took no runs and exited. None: it was not refused."""
    pulling: Annotated[Pulling | None, Since("0.3")] = None
    """The image it pulls before it takes runs, while it does (its status is then ``starting``)."""

    def refuses(self, run: Run) -> str | None:
        """Why this worker does not take ``run`` (its tag, group or network), or None if it does."""
        return refuses(self.tag, self.tag_exclusive, self.group, run, network_refused=self.network_refused)


def refuses(
    tag: str | None, tag_exclusive: bool, group: str | None, run: Run, *, network_refused: str | None = None
) -> str | None:
    """Why a worker with ``tag``/``group`` does not take ``run``, or None if it does.

    A tagged run goes only to workers with that tag; a worker with a tag also takes untagged runs
    unless it is tag-exclusive; a worker with a group takes only runs charged to that group (a
    member's run charged to another of their groups, or to none, is not the group's to pay for); a
    worker that cannot keep runs from the metadata service and the host (``network_refused``, why)
    takes no run that asks for a network.
    """
    if group is not None and group not in run.owner_groups:
        return f"this worker serves group {group} only and {run.owner} is not in it"
    if group is not None and run.group != group:
        charged = f"group {run.group}" if run.group is not None else "no group"
        return f"this worker serves group {group} only and the run is charged to {charged}"
    if run.spec.tag is not None and run.spec.tag != tag:
        return f"the run asks for a worker tagged {run.spec.tag}"
    if run.spec.tag is None and tag_exclusive:
        return f"this worker takes only runs tagged {tag}"
    if run.spec.network and network_refused:
        return f"this worker takes no runs that ask for a network: {network_refused}"
    return None
