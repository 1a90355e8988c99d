"""Domain models: run specs, runs, states and their transitions, failures, pools, workers.

Times are float seconds since the epoch (UTC); transports render them as ISO 8601.
"""

from __future__ import annotations

import re
import unicodedata
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)

from runplane.domain.units import MAX_SIZE, format_bytes, format_duration, parse_bytes, parse_duration

MAX_RUN_TIME = 30 * 86400.0
"""The longest time limit a run may ask for (30 days)."""
MAX_INPUTS = 64
MAX_UPSTREAMS = 32
"""The most runs one run may wait for in ``after`` (``run:`` inputs count apart, up to MAX_INPUTS)."""
SWEEP_PREFIX = "sweep:"
"""How a sweep is named among the runs a run waits for, or that wait for a run."""
MAX_DEPENDENTS = 1000
"""The most runs and sweeps that may wait for one run or sweep."""
MAX_ENV = 256

SCHEMA_VERSION = 1

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,47}$"
RUN_ID_PATTERN = r"[A-Za-z0-9-]{1,64}"
"""What a run id may look like (made ones are ``r-`` and 24 hex digits); anything else is no run."""
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_INPUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_INPUT_SOURCE = re.compile(rf"(s3://[a-z0-9][a-z0-9.-]{{1,62}}/\S+|run:{RUN_ID_PATTERN}(/\S*)?)")
# Characters a command or an environment value may not hold: C0 controls but tab, newline and
# carriage return, DEL, and lone surrogates (JSON can spell them; nothing can store them). A NUL
# cannot even reach exec(); the rest only hide what runs.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
# Variables that change how the dynamic loader or the C library behaves (what glibc strips for
# setuid programs): a run sets them in its image or its command, never through the API.
_LOADER_PREFIXES = ("LD_", "DYLD_")
_LOADER_NAMES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
    }
)


# Characters that change how text is shown without being seen: every format character (Unicode
# category Cf: the bidirectional marks, embeddings, overrides and isolates, the invisible spaces and
# joiners, the tag characters of hidden-text smuggling, the soft hyphen), the line and paragraph
# separators (a shell runs them as ordinary characters; a screen breaks the line) and the fillers that
# draw as blank. A name or a command holding one can read differently on a screen from what is stored
# and run ("Trojan Source"). Commands keep the two joiners (U+200C, U+200D): scripts such as Persian
# and emoji sequences need them.
_BLANK_FILLERS = frozenset("\u115f\u1160\u3164\uffa0")
_JOINERS = frozenset("\u200c\u200d")


def hidden_character(text: str, *, in_command: bool = False) -> str | None:
    """The first character of ``text`` that changes how it is shown without being seen (a format
    character, a line or paragraph separator, a blank filler; a command may hold the two joiners),
    as ``\\uNNNN`` (``\\UNNNNNNNN`` past the first plane), or None."""
    if text.isascii():
        return None
    for c in text:
        if c.isascii() or (in_command and c in _JOINERS):
            continue
        if unicodedata.category(c) in ("Cf", "Zl", "Zp") or c in _BLANK_FILLERS:
            code = ord(c)
            return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return None


def control_character(text: str) -> str | None:
    """The first control character (other than tab, newline, carriage return) or lone surrogate
    in ``text``, as ``\\xNN`` or ``\\uNNNN``, or None."""
    match = _CONTROL.search(text)
    if match is None:
        return None
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def check_env_name(key: str) -> None:
    """Raise ValueError when ``key`` may not be a run's environment variable: not a valid name,
    the reserved RUNPLANE_ prefix, or a variable that changes the dynamic loader."""
    if not _ENV_KEY.fullmatch(key):
        raise ValueError(f"environment variable name {key[:80]!r} is not valid")
    if key.upper().startswith("RUNPLANE_"):
        raise ValueError(f"environment variable {key!r}: the RUNPLANE_ prefix is reserved")
    if key.upper().startswith(_LOADER_PREFIXES) or key.upper() in _LOADER_NAMES:
        raise ValueError(f"environment variable {key!r} changes the dynamic loader; set it in the image or the command")


class RunState(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    UPLOADING = "uploading"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        """Held by a worker under a lease."""
        return self in ACTIVE_STATES


TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.KILLED, RunState.TIMED_OUT})
ACTIVE_STATES = frozenset({RunState.PREPARING, RunState.RUNNING, RunState.UPLOADING})
_ENDS = {RunState.FAILED, RunState.KILLED, RunState.TIMED_OUT}

# The only allowed transitions. Going back to QUEUED is a re-queue (lease expired, worker
# terminated); terminal states have no way out.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.PREPARING, RunState.KILLED, RunState.FAILED}),
    RunState.PREPARING: frozenset({RunState.RUNNING, RunState.QUEUED, *_ENDS}),
    RunState.RUNNING: frozenset({RunState.UPLOADING, RunState.QUEUED, *_ENDS}),
    RunState.UPLOADING: frozenset({RunState.SUCCEEDED, RunState.QUEUED, *_ENDS}),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.KILLED: frozenset(),
    RunState.TIMED_OUT: frozenset(),
}


def can_transition(current: RunState, new: RunState) -> bool:
    return new in TRANSITIONS[current]


def states_leading_to(new: RunState) -> frozenset[RunState]:
    """Every state from which ``new`` may be entered."""
    return frozenset(s for s, targets in TRANSITIONS.items() if new in targets)


class FailureReason(StrEnum):
    """Machine-readable reasons a run did not succeed. README.md lists exactly these, and each is
    one that the control plane or the agent writes (tests/unit/test_failure_reasons.py)."""

    NONZERO_EXIT = "nonzero_exit"
    IMAGE_NOT_FOUND = "image_not_found"
    IMAGE_TOO_LARGE = "image_too_large"
    OUT_OF_MEMORY = "out_of_memory"
    TIME_LIMIT = "time_limit"
    DISK_LIMIT = "disk_limit"
    LOG_LIMIT = "log_limit"
    KILLED = "killed"
    WORKER_LOST = "worker_lost"
    INPUT_UNAVAILABLE = "input_unavailable"
    UPLOAD_FAILED = "upload_failed"
    CONTAINER_ERROR = "container_error"
    GPU_UNAVAILABLE = "gpu_unavailable"
    AGENT_ERROR = "agent_error"
    DEPENDENCY_FAILED = "dependency_failed"
    NOT_PERMITTED = "not_permitted"


NEVER_RETRIED = frozenset({FailureReason.KILLED, FailureReason.DEPENDENCY_FAILED})
"""Reasons no retry rule may name: a kill is the user's word, and a run whose upstream failed
never ran (running it again would wait on the same failure)."""
RETRY_REASONS = [r.value for r in FailureReason if r not in NEVER_RETRIED]
DEFAULT_MAX_ATTEMPTS = 3
"""Claims a run without a retry rule may take: a lost worker is retried twice."""


class RetryRule(BaseModel):
    """When a run that ended badly is queued again (docs/workflows.md). A lost worker is retried
    within ``attempts`` whatever ``on`` holds (it is never the run's doing), and a preempted
    worker's run is queued again without using one up."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    attempts: int = Field(ge=1, le=10, strict=True, description="the most times the run goes (1: never retried), 1..10")
    on: list[Literal[tuple(RETRY_REASONS)]] = Field(  # type: ignore[valid-type]
        default_factory=list,
        max_length=len(RETRY_REASONS),
        description="failure reasons that queue the run again (any but killed); worker_lost always does",
    )
    memory_factor: float | None = Field(
        default=None,
        gt=1,
        le=64,
        description="an out_of_memory attempt is retried with its memory limit times this, up to the pool's "
        "memory (out_of_memory need not be in on)",
    )

    @field_validator("on")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        return sorted(set(value))


_REASONS = frozenset(reason.value for reason in FailureReason)


def _known_reason(value: Any) -> Any:
    """A reason as another release stored or sent it: one a later release added reads as
    ``agent_error``."""
    if isinstance(value, str) and value not in _REASONS:
        return FailureReason.AGENT_ERROR
    return value


class Failure(BaseModel):
    """Why a run did not succeed, as stored. Read tolerantly: a reason a later release added reads
    as ``agent_error``, its own name put at the head of the message; a field this release does not
    know is ignored (users never send one: the API answers with ``RunFailure``)."""

    model_config = ConfigDict(extra="ignore")

    reason: FailureReason
    message: str

    @model_validator(mode="before")
    @classmethod
    def _from_a_later_release(cls, data: Any) -> Any:
        reason = data.get("reason") if isinstance(data, dict) else None
        if isinstance(reason, str) and reason not in _REASONS:
            return {**data, "reason": FailureReason.AGENT_ERROR, "message": f"{reason[:64]}: {data.get('message', '')}"}
        return data


def _size(value: Any) -> Any:
    return parse_bytes(value) if isinstance(value, str | int | float) else value


def _duration(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str | int | float) else value


SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*[kKmMgGtTpP]?[iI]?[bB]?\s*$"
"""The strings ``parse_bytes`` reads ("512m", "2g", "1.5GiB"), as a JSON Schema pattern."""
DURATION_PATTERN = r"^\s*(\d+(\.\d+)?|(\d+(\.\d+)?\s*([mM][sS]|[sSmMhHdD])\s*)+)\s*$"
"""The strings ``parse_duration`` reads ("90s", "1h30m", "2d", "3600"), as a JSON Schema pattern."""


def size_or_text(least: int, most: int, examples: list[Any]) -> WithJsonSchema:
    """The request schema of a size a ``_size`` validator reads: bytes (a fraction is dropped) or
    a string with a binary unit; ``least`` and ``most`` bound the bytes either way."""
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": least, "maximum": most},
                {"type": "string", "pattern": SIZE_PATTERN, "description": "k, m, g, t, p: powers of 1024"},
                {"type": "null"},
            ],
            "examples": examples,
        },
        mode="validation",
    )


def duration_or_text(least: float, most: float, examples: list[Any], *, exclusive: bool = False) -> WithJsonSchema:
    """The request schema of a duration a ``_duration`` validator reads: seconds or a string such
    as "90s" or "1h30m" (ms, s, m, h, d); ``least`` and ``most`` bound the seconds either way."""
    low = {"exclusiveMinimum": least} if exclusive else {"minimum": least}
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", **low, "maximum": most},
                {"type": "string", "pattern": DURATION_PATTERN, "description": "units ms, s, m, h, d"},
                {"type": "null"},
            ],
            "examples": examples,
        },
        mode="validation",
    )


class Resources(BaseModel):
    """What one run asks for. Sizes accept bytes or strings ("512m"); time accepts "90s", "1h"."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cpus: float = Field(default=1.0, ge=0.01, le=1024)
    gpus: int = Field(default=0, ge=0, le=64)
    # Requests may give sizes and times as text; the schemas say so (answers hold numbers).
    memory: Annotated[int | None, size_or_text(4 * 1024**2 + 1, MAX_SIZE, ["512m", "4g", 536870912])] = Field(
        default=None, gt=4 * 1024**2, le=MAX_SIZE, description="bytes, at least 4m; pool default when absent"
    )
    disk: Annotated[int | None, size_or_text(1, MAX_SIZE, ["10g", 10737418240])] = Field(
        default=None, gt=0, le=MAX_SIZE, description="bytes the run may write; pool default when absent"
    )
    time: Annotated[float | None, duration_or_text(1, MAX_RUN_TIME, ["90s", "2h", "1h30m", 3600])] = Field(
        default=None, ge=1, le=MAX_RUN_TIME, description="seconds, 1 to 30 days; pool default when absent"
    )

    _sizes = field_validator("memory", "disk", mode="before")(staticmethod(_size))
    _times = field_validator("time", mode="before")(staticmethod(_duration))


class RunSpec(BaseModel):
    """A run submission as the API accepts it."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, max_length=65536)
    image: str | None = Field(default=None, min_length=1, max_length=512)
    name: str | None = Field(default=None, max_length=200)
    queue: str | None = Field(default=None, pattern=NAME_PATTERN)
    resources: Resources = Field(default_factory=Resources)
    env: dict[str, str] = Field(default_factory=dict)
    inputs: dict[str, str] = Field(default_factory=dict)
    network: bool = False
    tag: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="only workers started with --tag <tag> take this run (e.g. a reserved machine)",
    )
    group: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="the group the run is charged to, besides its owner (one of the caller's groups; "
        "default: the caller's only group, if there is exactly one)",
    )
    priority: int = Field(
        default=50,
        ge=0,
        le=100,
        strict=True,  # a JSON integer: no text, no fraction, no boolean
        description="0..100: in a pool, a run starts before every waiting run of lower priority; above the "
        "pool's max_user_priority (default 50) only for admins",
    )

    retry: RetryRule | None = Field(
        default=None,
        description="when the run is queued again after it failed; default: the pool's rule, else a lost "
        "worker is retried up to 3 attempts and nothing else is",
    )
    after: list[Annotated[str, Field(pattern=f"^{RUN_ID_PATTERN}$")]] = Field(
        default_factory=list,
        max_length=MAX_UPSTREAMS,
        description="runs of yours this run waits for: it stays queued, holding no worker and no quota, until "
        "each has succeeded, and ends failed (dependency_failed) if one does not. A run:<id> input waits "
        "the same way",
    )
    after_sweep: str | None = Field(
        default=None,
        pattern=f"^{RUN_ID_PATTERN}$",
        description="a sweep of yours this run waits for: released once every member has succeeded, "
        "failed (dependency_failed) once the sweep finishes otherwise",
    )

    def upstreams(self) -> list[str]:
        """The runs (and sweep) this run waits for, each once, in the order given: its ``run:``
        inputs, ``after``, then ``after_sweep`` (as ``sweep:<id>``)."""
        found = [source[4:].partition("/")[0] for source in self.inputs.values() if source.startswith("run:")]
        found += self.after
        if self.after_sweep is not None:
            found.append(SWEEP_PREFIX + self.after_sweep)
        return list(dict.fromkeys(found))

    @field_validator("command")
    @classmethod
    def _command(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("command is blank")
        bad = control_character(value)
        if bad:
            raise ValueError(f"command holds the control character {bad}")
        hidden = hidden_character(value, in_command=True)
        if hidden:
            raise ValueError(f"command holds {hidden}, a character that changes how text is shown without being seen")
        return value

    @field_validator("name", "image")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and (control_character(value) or "\n" in value or "\r" in value or "\t" in value):
            raise ValueError("must be printable text on one line")
        hidden = None if value is None else hidden_character(value)
        if hidden:
            raise ValueError(f"holds {hidden}, a character that changes how text is shown without being seen")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV:
            raise ValueError(f"at most {MAX_ENV} environment variables")
        for key, text in value.items():
            check_env_name(key)
            bad = control_character(text)
            if bad:
                raise ValueError(f"environment variable {key!r} holds the control character {bad}")
        return value

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs")
        for name, source in value.items():
            if not _INPUT_NAME.fullmatch(name):
                raise ValueError(f"input name {name!r} is not valid (letters, digits, . _ -)")
            if not _INPUT_SOURCE.fullmatch(source) or control_character(source):
                raise ValueError(f"input {name!r}: source must be 's3://bucket/key' or 'run:<id>[/path]'")
            path = source.removeprefix("s3://").partition("/")[2]
            if any(part in (".", "..") for part in path.split("/")) or "//" in path or control_character(path):
                raise ValueError(f"input {name!r}: the path may not hold '.', '..' or empty segments")
        return value


class Usage(BaseModel):
    """Resource use, reported while the run goes and at its end."""

    model_config = ConfigDict(extra="forbid")

    cpu_seconds: float | None = None
    """CPU time of the run's processes, all attempts together."""
    gpu_seconds: float | None = None
    """Its GPUs times the seconds its container ran, all attempts together (``accounting.charge``)."""
    cost: float | None = None
    """Its pool's ``price_per_hour`` times the hours its container ran times its share of a worker,
    all attempts together; None on a pool without a price."""
    memory_peak: int | None = None
    disk: int | None = None
    timings: dict[str, float] = Field(default_factory=dict)


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: float
    state: RunState | None = None
    message: str


class Run(BaseModel):
    """A run as stored. ``attempt`` counts claims: 0 before the first worker takes it."""

    model_config = ConfigDict(extra="forbid")

    v: int = SCHEMA_VERSION
    id: str
    owner: str
    owner_groups: list[str] = Field(default_factory=list)
    """The owner's groups when it was submitted: workers started with --group take only these."""
    group: str | None = None
    """The group the run is charged to (its quotas apply), resolved at submit; None: the owner only."""
    spec: RunSpec
    queue: str
    sweep_id: str | None = None
    """The sweep the run is a member of (docs/workflows.md), and its index there."""
    sweep_index: int | None = None
    state: RunState = RunState.QUEUED
    attempt: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    worker_id: str | None = None
    lease_expires_at: float | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    failure: Failure | None = None
    usage: Usage = Field(default_factory=Usage)
    kill_requested: bool = False
    kill_reason: str | None = None
    """Why a kill was asked for, when not by a user (written with ``kill_requested``, e.g. "the
    local stack stopped"); the worker's final message says it."""
    on_preemptible: bool = False
    waiting_reason: str | None = None
    waiting_on: list[str] = Field(default_factory=list)
    """The runs (and sweep) it waits for that had not succeeded when last looked at: while any is
    left, the run is queued but out of its pool's line (``listed_state``: ``waiting``)."""
    dependents: list[str] = Field(default_factory=list)
    """Runs and sweeps that wait for this run, told when it ends."""
    request_hash: str | None = None
    hinted_at: float | None = None
    fair_tag: float = 0.0
    """The run's place among the queued runs of its pool and priority (start-time fair queueing:
    docs/scheduling.md), set at submit; ``rank_key`` orders a pool's queued runs by it."""
    events: list[Event] = Field(default_factory=list)


MAX_FAIR_TAG = 9_999_999_999_999.0
"""The largest fair tag a rank holds (13 digits before the point)."""


def rank_key(priority: int, fair_tag: float, created_at: float, run_id: str) -> str:
    """The order in which a pool's queued runs start, as a string that sorts the same way: the
    higher priority first, then the smaller fair tag, then the older run, then the id. The tag is
    held within its fixed width (0 to ``MAX_FAIR_TAG``) so that the strings always sort as the
    numbers do."""
    tag = min(max(fair_tag, 0.0), MAX_FAIR_TAG)
    return f"{100 - priority:03d}#{tag:020.6f}#{created_at:017.6f}#{run_id}"


WAITING = "waiting"
"""How a queued run that waits for other runs is listed in its pool: apart from the line."""


def listed_state(run: Run) -> str:
    """Where a run is filed in its pool's listings: its state, or ``WAITING`` for a queued run
    that still waits for other runs (no worker may take it, and it is no one's backlog)."""
    return WAITING if run.state == RunState.QUEUED and run.waiting_on else str(run.state)


def run_rank(run: Run) -> str:
    return rank_key(run.spec.priority, run.fair_tag, run.created_at, run.id)


def rank_prefix(priority: int) -> str:
    """How the rank of every run of ``priority`` begins (``rank_key``)."""
    return f"{100 - priority:03d}#"


class RunMessage(BaseModel):
    """A hint on a pool queue that a run is waiting at ``attempt``. The store is the truth."""

    model_config = ConfigDict(extra="forbid")

    v: int = SCHEMA_VERSION
    run_id: str
    attempt: int


class RunEnd(BaseModel):
    """How a run ended, as its end event carries it to the dispatcher's metrics."""

    model_config = ConfigDict(extra="forbid")

    state: RunState
    reason: Annotated[FailureReason | None, BeforeValidator(_known_reason)] = None
    """A reason a later release added reads as ``agent_error``."""
    to_running: float | None = Field(default=None, ge=0)
    """Seconds from its submit to its last start (``Run.started_at``); None when it never started."""


class DispatchEvent(BaseModel):
    """A nudge for the dispatcher that a pool's backlog changed, or that a run ended. Read
    tolerantly: an event another release wrote, with fields this one does not know, is still the
    nudge it was (dropping it would leave its sweep or waiting runs to the schedule)."""

    model_config = ConfigDict(extra="ignore")

    v: int = SCHEMA_VERSION
    pool: str
    reason: str = "submitted"
    sweep: str | None = None
    """A member of this sweep ended: the sweep may release its next members."""
    member: int | None = Field(default=None, ge=0)
    """With ``sweep``: which member ended (its sweep reads that one first)."""
    upstream: str | None = None
    """This run or sweep ended: the runs and sweeps waiting for it may go (or fail)."""
    ended: RunEnd | None = None
    """A run ended thus (its metrics)."""
    skip: int = Field(default=0, ge=0)
    """With ``upstream``: how many of what waits for it earlier events told already (the rest is
    told in bounded chunks, one event each)."""

    @model_serializer(mode="wrap")
    def _written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``member`` and ``skip`` are written only when set: the previous release's dispatcher
        refuses an event with a field it does not know, and would drop every event otherwise."""
        data: dict[str, Any] = handler(self)
        if self.member is None:
            data.pop("member", None)
        if self.skip == 0:
            data.pop("skip", None)
        return data


Backend = Literal["local", "aws-batch", "azure-batch", "kubernetes", "slurm"]


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
    options: dict[str, Any] = Field(default_factory=dict, description="backend-specific settings")

    _sizes = field_validator("memory", "disk", "max_log_size", "max_image_size", mode="before")(staticmethod(_size))
    _times = field_validator(
        "default_time",
        "max_time",
        "idle_seconds",
        "start_timeout_seconds",
        "retry_disabled_seconds",
        "seconds_between_launches",
        mode="before",
    )(staticmethod(_duration))

    @model_validator(mode="after")
    def _bounds(self) -> Pool:
        if self.min_workers > self.max_workers:
            raise ValueError(f"pool {self.name}: min_workers > max_workers")
        return self

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


class StartingJob(BaseModel):
    """A worker the dispatcher launched whose agent has not registered yet. Read tolerantly, as
    the record holding it is."""

    model_config = ConfigDict(extra="ignore")

    worker_id: str
    launched_at: float
    running_since: float | None = None
    """When a dispatcher pass first saw the engine run it (start timeouts count from here)."""


class PoolRecord(BaseModel):
    """The dispatcher's memory of one pool. Every write is conditional on ``version``, so two
    dispatchers acting at once never both launch: the second one's write fails and it backs off.
    Read tolerantly (another release may have written fields this one does not know), and written
    with ``resume`` only when it holds something, so that the previous release reads it too."""

    model_config = ConfigDict(extra="ignore")

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
    resume: dict[str, str] = Field(default_factory=dict)
    """Only in the schedule's own record (``SCHEDULE_RECORD``): where its bounded passes over
    waiting runs and sweeps stopped, so that the next one goes on from there."""

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


WorkerStatus = Literal["starting", "idle", "busy", "draining", "offline"]


class Worker(BaseModel):
    """What a worker agent reports at each heartbeat."""

    model_config = ConfigDict(extra="forbid")

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

    def refuses(self, run: Run) -> str | None:
        """Why this worker does not take ``run`` (its tag, group or network), or None if it does."""
        return refuses(self.tag, self.tag_exclusive, self.group, run, network_refused=self.network_refused)


Scope = Literal["runs:read", "runs:write", "admin"]
SCOPES: tuple[Scope, ...] = ("runs:read", "runs:write", "admin")
DEFAULT_SCOPES: tuple[Scope, ...] = ("runs:read", "runs:write")
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"
TOKEN_ID_PATTERN = r"^tok-[0-9a-f]{16}$"  # noqa: S105 - a pattern, not a secret


class Principal(BaseModel):
    """An authenticated caller."""

    model_config = ConfigDict(extra="forbid")

    user: str
    scopes: list[str] = Field(default_factory=list)
    """None unless given: a caller holds only what its token grants."""
    groups: list[str] = Field(default_factory=list)
    token_id: str | None = None
    default_group: str | None = None
    """The group a run of this caller is charged to when it names none and the caller is in
    several (an administrator's setting, ``UserRecord``); only while it is one of ``groups``."""

    def can(self, scope: str) -> bool:
        """Whether the caller holds ``scope``; ``admin`` holds every scope."""
        return scope in self.scopes or "admin" in self.scopes

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


class ApiToken(BaseModel):
    """An API token as stored, under the SHA-256 of its secret (never the secret itself).

    A record that does not validate is no token: a store reading one answers as if it were absent,
    so a damaged or hand-written record fails closed.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    id: str = Field(pattern=TOKEN_ID_PATTERN)
    user: str = Field(pattern=USER_PATTERN)
    groups: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(default_factory=list, max_length=32)
    scopes: list[Scope]
    created_at: float = Field(ge=0, lt=1e11)
    expires_at: float | None = Field(default=None, ge=0, lt=1e11)
    created_by: str | None = Field(default=None, max_length=200)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def principal(self) -> Principal:
        return Principal(user=self.user, scopes=list(self.scopes), groups=list(self.groups), token_id=self.id)


class UserRecord(BaseModel):
    """What an administrator set for a user (``PUT /v1/users/{user}``), stored beside the tokens.

    Read tolerantly (another release may have written it); a record that does not validate is
    read as none: the user has no default group."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    user: str = Field(pattern=USER_PATTERN)
    default_group: str | None = Field(default=None, pattern=NAME_PATTERN)
    """The group the user's runs and sweeps are charged to when they name none and their token
    carries several groups (one of them: a default the token does not carry is not used)."""
    updated_at: float = Field(default=0.0, ge=0, lt=1e11)
    updated_by: str | None = Field(default=None, max_length=200)

    @classmethod
    def read(cls, doc: str | None) -> UserRecord | None:
        """The record stored as ``doc`` (JSON); None for none, or for one that does not validate."""
        if doc is None:
            return None
        try:
            return cls.model_validate_json(doc)
        except ValueError:
            return None


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


QuotaKind = Literal["user", "group"]
Period = Literal["day", "week", "month"]


class Quota(BaseModel):
    """What one user or group may hold of the pools: concurrent caps and budgets per period.

    A limit that is None does not apply. Budgets are in hours of the resource held (requested
    gpus or cpus times wall-clock time), per calendar ``period`` (UTC).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    kind: QuotaKind
    name: str = Field(pattern=USER_PATTERN, max_length=64)
    max_running: int | None = Field(default=None, ge=0, le=1_000_000)
    max_gpus: int | None = Field(default=None, ge=0, le=1_000_000)
    max_cpus: float | None = Field(default=None, ge=0, le=1_000_000)
    gpu_hours: float | None = Field(default=None, ge=0, le=1e9)
    cpu_hours: float | None = Field(default=None, ge=0, le=1e9)
    period: Period = "month"
    updated_at: float = Field(ge=0, lt=1e11)
    updated_by: str | None = Field(default=None, max_length=200)

    @model_validator(mode="after")
    def _name(self) -> Quota:
        if self.kind == "group" and not re.fullmatch(NAME_PATTERN, self.name):
            raise ValueError(f"group name {self.name[:80]!r} is not valid (a-z, 0-9, -)")
        return self

    @property
    def key(self) -> str:
        return quota_key(self.kind, self.name)

    @property
    def label(self) -> str:
        """How messages name it: ``alice`` or ``group vision``."""
        return self.name if self.kind == "user" else f"group {self.name}"


def quota_key(kind: QuotaKind, name: str) -> str:
    """The one key of a user's or group's quota and usage records: ``user:alice``, ``group:vision``."""
    return f"{kind}:{name}"


class Hold(BaseModel):
    """What one claimed attempt of a run holds of a user's or group's quota, until it ends."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    run_id: str
    attempt: int
    """The attempt the claim makes (the run's ``attempt`` once claimed)."""
    gpus: int = 0
    cpus: float = 0
    at: float
    """When it was reserved: what ends is charged from here."""
    gpu_seconds: float = 0
    """The most this attempt may use: gpus x its time limit (reserved against the budget)."""
    cpu_seconds: float = 0

    @property
    def key(self) -> str:
        return hold_key(self.run_id, self.attempt)


def hold_key(run_id: str, attempt: int) -> str:
    return f"{run_id}#{attempt}"


MAX_BLOCKED = 100
"""Queued runs a usage record remembers as waiting for room (their hints are re-sent when room
frees); more wait for the reaper's re-hint."""


class UsageRecord(BaseModel):
    """What a user or group holds now and has used this period. Every write is conditional on
    ``version`` (0: the record must not exist yet), so two workers claiming at once never both
    take the last of a cap: the second one's write fails and it reads again."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    kind: QuotaKind
    name: str
    version: int = 0
    holds: dict[str, Hold] = Field(default_factory=dict)
    """hold_key(run, attempt) -> what that attempt holds."""
    period: str = ""
    """The budget period the settled use below belongs to (``period_key``)."""
    gpu_seconds: float = 0
    """GPU-seconds settled in ``period`` by attempts that ended."""
    cpu_seconds: float = 0
    blocked: dict[str, int] = Field(default_factory=dict)
    """Queued runs waiting for room here (run id -> its queued attempt), at most MAX_BLOCKED."""

    @property
    def key(self) -> str:
        return quota_key(self.kind, self.name)

    @property
    def running(self) -> int:
        return len(self.holds)

    @property
    def gpus(self) -> int:
        return sum(h.gpus for h in self.holds.values())

    @property
    def cpus(self) -> float:
        return sum(h.cpus for h in self.holds.values())


class Lane(BaseModel):
    """A user's place in the fair share of one pool at one priority (docs/scheduling.md; each
    priority is a line of its own, with its own virtual time): the fair tag the user's
    next run would take, ``tag``, and the ``lead`` over the pool's line that the user had at
    ``at``, which halves every ``Pool.fair_share_half_life``. Every write is conditional on
    ``version`` (0: the record must not exist yet), like a usage record's."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    pool: str
    priority: int = Field(ge=0, le=100)
    user: str
    tag: float = 0.0
    lead: float = 0.0
    at: float = 0.0
    version: int = 0
