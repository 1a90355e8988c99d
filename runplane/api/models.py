"""Request and response bodies of the HTTP API that are pydantic models: the OpenAPI document
takes their schemas from here, so what is documented is what is checked."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema

from runplane.domain.asks import RetryRule
from runplane.domain.pools import Backend
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.sweeps import SweepSpec
from runplane.domain.uploads import SHA256_PATTERN, UPLOAD_SOURCE_PATTERN
from runplane.domain.wire import Extensible, Since
from runplane.domain.workers import WorkerStatus


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


Timestamp = Annotated[
    datetime,
    PlainSerializer(_iso, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time", "examples": ["2026-11-23T09:30:00.125Z"]}),
]
"""A moment in UTC: ISO 8601 with milliseconds and ``Z`` on the wire, an aware datetime in Python."""


def timestamp(ts: float | None) -> datetime | None:
    """A Unix time as the wire model's datetime (None stays None)."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


REVISION_HELP = (
    "opaque; changes whenever the {what} does: pass it as since (with wait) to be answered when it next changes"
)


class WireModel(BaseModel):
    """A response body: unknown fields are ignored when read (a newer server may add some). The SDK
    reads answers with ``wire.read_answer``: unknown fields are ignored at every depth (in a run's spec
    too), and a state, reason, status or backend a newer server may add is kept as its text."""

    model_config = ConfigDict(extra="ignore")


class ErrorDetail(WireModel):
    code: str = Field(description="machine-readable, e.g. not_found, conflict, invalid_request")
    message: str = Field(description="what is wrong, for a person")


class ErrorBody(WireModel):
    """Every answer that is not a success: ``{"error": {"code", "message"}}``."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"error": {"code": "not_found", "message": "run 'r-1' not found"}}]}
    )

    error: ErrorDetail


class Health(WireModel):
    status: Literal["ok"] = "ok"


class RunFailure(WireModel):
    reason: Annotated[FailureReason, Extensible] = Field(description="one of the reasons README.md lists")
    message: str


class RunUsage(WireModel):
    cpu_seconds: float | None = Field(default=None, description="CPU time used by the run's processes, all attempts")
    gpu_seconds: float | None = Field(
        default=None, description="its GPUs times the seconds its container ran, all attempts (null: it never ran)"
    )
    cost: float | None = Field(
        default=None,
        description="its pool's price_per_hour times the hours its container ran times its share of a worker "
        "(the larger of its part of the worker's GPUs and of its cpus), all attempts; null on a pool without a price",
    )
    memory_peak: int | None = Field(default=None, description="bytes, the most the run's container held")
    disk: int | None = Field(default=None, description="bytes written to outputs and scratch")
    timings: dict[str, float] = Field(default_factory=dict, description="seconds spent in each phase (pull, upload…)")


class RunEvent(WireModel):
    at: Timestamp
    state: Annotated[RunState, Extensible] | None = Field(
        default=None, description="the state entered, if the event is a transition"
    )
    message: str


class RetentionView(WireModel):
    """How long what a run leaves is kept: its owner's pin, and when its pool's retention deletes its
    outputs, its logs and its record (docs/retention.md)."""

    kept: bool = Field(
        description="its owner keeps it (POST /v1/runs/{run_id}/keep): nothing of it is deleted, and the dates "
        "say when each part would be once it is let go (at once, for a date that has passed)"
    )
    outputs_until: Timestamp | None = Field(description="when its output files are deleted (null: kept for good)")
    logs_until: Timestamp | None = Field(description="when its logs are deleted (null: kept for good)")
    record_until: Timestamp | None = Field(
        description="when the run itself is deleted, with whatever of it is left (null: kept for good)"
    )
    deleted: list[str] = Field(description="what is deleted already: outputs, logs")


class RunCheckpoint(WireModel):
    """The newest checkpoint of a run (docs/checkpoints.md): its files with ``GET /v1/runs/{id}/checkpoint``."""

    seq: int = Field(description="its number in the run's series (1, 2, ...)")
    attempt: int = Field(description="the attempt that synced it")
    files: int = Field(description="how many files it holds")
    bytes: int = Field(description="their size together")
    synced_at: Timestamp
    series: str | None = Field(
        default=None, description="the run whose series holds it when not this one (from_checkpoint, not synced since)"
    )


class RunView(WireModel):
    """A run as the API shows it to its owner (or an admin)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "id": "r-01jd7x0c5v3m9k2q8e4t6w1yzb",
                    "name": "train",
                    "state": "queued",
                    "owner": "ada",
                    "queue": "cpu",
                    "spec": {
                        "command": "python train.py",
                        "image": "python:3.12",
                        "name": "train",
                        "queue": "cpu",
                        "resources": {"cpus": 2, "gpus": 0, "memory": 4294967296, "disk": None, "time": 7200},
                        "env": {"EPOCHS": "10"},
                        "inputs": {},
                        "network": False,
                        "tag": None,
                        "group": "vision",
                        "priority": 50,
                        "retry": {"attempts": 3, "on": ["nonzero_exit"], "memory_factor": None},
                        "after": [],
                        "after_sweep": None,
                        "labels": {"project": "vision"},
                    },
                    "group": "vision",
                    "attempt": 0,
                    "max_attempts": 3,
                    "worker_id": None,
                    "created_at": "2026-11-23T09:30:00.125Z",
                    "started_at": None,
                    "finished_at": None,
                    "exit_code": None,
                    "failure": None,
                    "waiting_reason": "no idle worker in pool cpu; starting one",
                    "waiting_on": [],
                    "priority": 50,
                    "kill_requested": False,
                    "usage": {
                        "cpu_seconds": None,
                        "gpu_seconds": None,
                        "cost": None,
                        "memory_peak": None,
                        "disk": None,
                        "timings": {},
                    },
                    "events": [{"at": "2026-11-23T09:30:00.125Z", "state": "queued", "message": "submitted"}],
                    "sweep_id": None,
                    "sweep_index": None,
                    "revision": "4f1c2b9e07d3a856",
                }
            ]
        },
    )

    id: str
    name: str | None = Field(description="the name given at submit, if any")
    state: Annotated[RunState, Extensible]
    owner: str
    queue: str = Field(description="the pool it runs in")
    group: str | None = Field(description="the group it is charged to besides its owner (its quotas apply)")
    spec: RunSpec = Field(description="what was submitted, with the pool's defaults not filled in")
    attempt: int = Field(description="how many times a worker has claimed it (0: never yet)")
    max_attempts: int = Field(
        description="the most attempts: its retry rule's, else 3 (a worker handing it back, preempted or told to "
        "stop, adds one)"
    )
    worker_id: str | None
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    exit_code: int | None = Field(description="the command's exit status, once it has one")
    failure: RunFailure | None = Field(description="why it did not succeed (failed, killed, timed_out)")
    waiting_reason: str | None = Field(description="queued only: why it is still waiting")
    waiting_on: list[str] = Field(
        default_factory=list,
        description="queued only: the runs (and sweep, as sweep:<id>) it still waits for before it can start; "
        "while any is left it holds no worker and no quota",
    )
    priority: int = Field(description="0..100: in its pool, it starts before every waiting run of lower priority")
    kill_requested: bool
    usage: RunUsage
    events: list[RunEvent] = Field(description="its timeline, oldest first")
    sweep_id: str | None = Field(default=None, description="the sweep it is a member of, if any")
    sweep_index: int | None = Field(default=None, description="its index in that sweep (0-based)")
    revision: str = Field(default="", description=REVISION_HELP.format(what="run"))
    retention: Annotated[RetentionView | None, Since("0.3")] = Field(
        default=None,
        description="how long its outputs, logs and record are kept: left out while it has not ended and is not kept",
    )
    checkpoint: Annotated[RunCheckpoint | None, Since("0.3")] = Field(
        default=None, description="its newest checkpoint, once one is synced (spec.checkpoint, spec.from_checkpoint)"
    )
    pieces: Annotated[int, Since("0.3")] = Field(
        default=0, description="the pieces it has ended with spec.checkpoint.exit_code and started again"
    )
    preemptions: Annotated[int, Since("0.3")] = Field(
        default=0,
        description="its preemptions on the pool it is on now (queue): at spec.fallback_after_preemptions it moves "
        "to the next pool and this starts again from 0",
    )
    fallback_at: Annotated[Timestamp | None, Since("0.3")] = Field(
        default=None,
        description="queued with a pool to fall back to and spec.fallback_after: when it moves to the next pool if "
        "it has not started by then",
    )


class SweepView(WireModel):
    """A sweep and where its members are; counts are kept on the sweep, not counted from its runs."""

    id: str
    name: str | None
    owner: str
    group: str | None = Field(
        default=None, description="the group its members are charged to besides their owner (its quotas apply)"
    )
    queue: str = Field(description="the pool its members run in")
    size: int = Field(description="members")
    max_parallel: int | None = Field(description="the most members out at once (null: what the pool can run)")
    counts: dict[Annotated[RunState, Extensible], int] = Field(
        description="members by the state of their latest try (members not released yet count as queued)"
    )
    failures: dict[Annotated[FailureReason, Extensible], int] = Field(
        description="members whose latest try did not succeed, by reason"
    )
    waiting: int = Field(description="members not released to their pool yet (held by max_parallel or capacity)")
    waiting_for: str | None = Field(
        default=None,
        description="why no member is released yet: the run or sweep it waits for (after, after_sweep, run: inputs)",
    )
    killed: bool
    created_at: Timestamp
    finished_at: Timestamp | None = Field(description="when every member's latest try had ended")
    spec: SweepSpec = Field(description="what was submitted, with the template's pool defaults filled in")
    events: list[RunEvent] = Field(description="its timeline: made, killed, members run again, finished")
    revision: str = Field(default="", description=REVISION_HELP.format(what="sweep"))


class SweepRetried(SweepView):
    retried: int = Field(description="members run again by this request")


class SweepPage(WireModel):
    sweeps: list[SweepView]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null: this was the last")


class RunPage(WireModel):
    runs: list[RunView]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null: this was the last")


class LogPage(WireModel):
    data: str = Field(description="the bytes from offset on, as UTF-8 text")
    next_offset: int = Field(description="where the next read starts")
    complete: bool = Field(description="the run has ended and every byte of this stream has been read")


class OutputFile(WireModel):
    path: str = Field(description="relative to the run's /outputs")
    size: int = Field(description="bytes")
    url: str = Field(description="a presigned URL that downloads it for a limited time")


class OutputPage(WireModel):
    files: list[OutputFile]
    next_cursor: str | None
    complete: bool = Field(description="the run has ended: no more files will appear")


class PoolShape(WireModel):
    cpus: float
    gpus: int
    gpu_type: str | None
    memory: int = Field(description="bytes")
    disk: int = Field(description="bytes")
    slots: int = Field(description="runs a worker takes at once")


class PoolWorkerCounts(WireModel):
    idle: int
    busy: int
    starting: int
    draining: int


class PoolLaunches(WireModel):
    launched: int
    failed: int
    failed_in_a_row: int
    last_launch_at: Timestamp | None


class PoolRetention(WireModel):
    """How long a pool keeps what its runs leave once they end (its retention over the stack's, docs/retention.md)."""

    outputs: float | None = Field(description="seconds a run's output files are kept after it ends (null: for good)")
    logs: float | None = Field(description="seconds a run's logs are kept after it ends (null: for good)")
    runs: float | None = Field(
        description="seconds a finished run's record is kept, with whatever of it is left (null: for good)"
    )


class PoolSessions(WireModel):
    """Who may open sessions (exec, shell, port-forward) into the pool's running runs (docs/sessions.md)."""

    allow_exec: bool = Field(description="owners may open sessions into their running runs")
    allow_admin_exec: bool = Field(description="admins may open sessions into other users' runs")
    max_sessions_per_run: int = Field(description="sessions one run may have at once")


class PoolView(WireModel):
    name: str
    backend: Annotated[Backend, Extensible]
    shape: PoolShape
    min_workers: int
    max_workers: int
    default_image: str
    default_time: float = Field(description="seconds a run gets when it names no time")
    max_time: float = Field(description="the longest time a run may ask, in seconds")
    max_user_priority: int = Field(description="the highest priority a user who is not an admin may give its runs")
    max_waiting_runs: int | None = Field(
        default=None,
        description="runs of one user that may wait for other runs in this pool at once (null: a server that "
        "does not tell)",
    )
    max_open_sweeps: int | None = Field(
        default=None,
        description="unfinished sweeps one user may have in this pool at once (null: a server that does not tell)",
    )
    fair_share_half_life: float = Field(description="seconds in which a user's lead over the others halves")
    price_per_hour: float | None = Field(description="what one worker costs an hour, if the pool has a price")
    retry: RetryRule | None = Field(description="the retry rule of runs that bring none of their own")
    backlog: int = Field(description="runs queued for this pool, as of counted_at")
    workers: PoolWorkerCounts = Field(description="its workers by status, as of counted_at")
    counted_at: Timestamp | None = Field(
        description="when the dispatcher last counted backlog and workers (on every pass that saw them change, "
        "and at least once a minute); null: counted by this request, as no pass has in the last 3 minutes"
    )
    launches: PoolLaunches
    last_error: str | None = Field(description="the last launch error, if any")
    last_error_at: Timestamp | None
    disabled: str | None = Field(description="why launches are paused (too many failures), if they are")
    last_decision: str | None = Field(description="what the dispatcher last decided for this pool")
    agent_versions: dict[str, int] = Field(
        default_factory=dict,
        description="its live workers by the version of their agent, as of counted_at (empty: a server that "
        "does not tell)",
        examples=[{"0.2.0": 3, "0.1.0": 1}],
    )
    refused_workers: dict[str, str] = Field(
        default_factory=dict,
        description="worker id -> why this stack refuses its agent (agents may be of the stack's minor release "
        "or the one before, never newer): live workers it refuses, and those refused when they registered (they "
        "took no runs and exited) within the last hour; at most 20, the latest",
        examples=[{"w-17": "agent 0.4.2 is older than this stack allows (>= 0.5)"}],
    )
    retention: Annotated[PoolRetention | None, Since("0.3")] = Field(
        default=None,
        description="how long what its runs leave is kept once they end; null: a server that does not tell",
    )
    sessions: Annotated[PoolSessions | None, Since("0.3")] = Field(
        default=None, description="who may open sessions into its running runs; null: a server that does not tell"
    )


class PoolList(WireModel):
    pools: list[PoolView]


class PullingView(WireModel):
    image: str
    done: int = Field(description="bytes of its layers downloaded so far")
    total: int = Field(description="bytes of the layers the registry announced so far")


class WorkerView(WireModel):
    id: str
    pool: str
    status: Annotated[WorkerStatus, Extensible] = Field(description="offline: no heartbeat for a while")
    host: str
    slots: int
    free_slots: int
    cpus: float
    gpus: int
    memory: int
    free_cpus: float
    free_gpus: int
    gpu_ids: list[str]
    cached_inputs: int
    runs: list[str] = Field(description="the runs it holds (only yours, unless you are an admin)")
    run_owners: dict[str, str]
    runs_done: int
    runs_left: int | None
    started_at: Timestamp
    heartbeat_at: Timestamp
    backend_job_id: str | None
    agent_version: str
    tag: str | None
    tag_exclusive: bool
    group: str | None
    network_refused: str | None = Field(description="why it takes no runs that ask for a network, if it does not")
    pulling: PullingView | None = Field(
        default=None,
        description="while it is starting: the image it pulls before it takes its first run (its pool's "
        "prefetch_images), and how far",
    )


class WorkerList(WireModel):
    workers: list[WorkerView]
    next_cursor: str | None = Field(
        default=None, description="pass as cursor for the next page; null: this was the last"
    )


class UploadView(WireModel):
    """``POST /v1/uploads``: the archive is there already (``present``: send nothing), or the URL to
    PUT its bytes to, with the headers to send, before ``expires_at``."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "source": "upload:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                    "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                    "size": 48213,
                    "present": False,
                    "url": "https://bucket.s3.amazonaws.com/uploads/alice/9f86...?X-Amz-Signature=...",
                    "headers": {"Content-MD5": "1B2M2Y8AsgTpgAmY7PhCfg==", "Content-Length": "48213"},
                    "expires_at": 1795426200.125,
                }
            ]
        },
    )

    source: str = Field(pattern=f"^{UPLOAD_SOURCE_PATTERN}$", description="how a run names it in inputs")
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(gt=0, description="its length in bytes")
    present: bool = Field(description="true: the stack holds it already, nothing to send")
    url: str | None = Field(default=None, description="where to PUT the archive's bytes (null when present)")
    headers: dict[str, str] | None = Field(
        default=None, description="the headers to send with the PUT (the MD5 the store checks among them)"
    )
    expires_at: float | None = Field(default=None, description="when the URL stops working (Unix seconds)")
