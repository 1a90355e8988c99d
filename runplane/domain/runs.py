"""Runs: what a user submits (``RunSpec``) and the run as stored (``Run``), with its failure,
usage, timeline and rank among its pool's queued runs.

Times are float seconds since the epoch (UTC); transports render them as ISO 8601.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from runplane.domain.asks import MAX_FALLBACK, MIN_FALLBACK_AFTER, QUEUE_SCHEMA, Resources, RetryRule
from runplane.domain.checkpoints import CheckpointRule, CheckpointSource, CheckpointStatus
from runplane.domain.common import (
    ENV_NAME_PATTERN,
    MAX_RUN_TIME,
    NAME_PATTERN,
    NO_CONTROL_PATTERN,
    RUN_ID_PATTERN,
    SCHEMA_VERSION,
    WHOLE,
    check_env_name,
    control_character,
    duration_or_text,
    hidden_character,
    read_duration,
    shown_text,
)
from runplane.domain.ranks import rank_key
from runplane.domain.retention import RunRetention
from runplane.domain.secrets import MAX_RUN_SECRETS, SECRET_REF_PATTERN, SecretRef
from runplane.domain.states import DEFAULT_MAX_ATTEMPTS, REASONS, FailureReason, RunState
from runplane.domain.uploads import UPLOAD_SOURCE_PATTERN, upload_sha
from runplane.domain.wire import Record, Since

MAX_INPUTS = 64
MAX_UPSTREAMS = 32
"""The most runs one run may wait for in ``after`` (``run:`` inputs count apart, up to MAX_INPUTS)."""
SWEEP_PREFIX = "sweep:"
"""How a sweep is named among the runs a run waits for, or that wait for a run."""
MAX_DEPENDENTS = 1000
"""The most runs and sweeps that may wait for one run or sweep."""
MAX_ENV = 256
MAX_LABELS = 32
MAX_LABEL_VALUE = 128
LABEL_KEY_PATTERN = r"^[a-z0-9][a-z0-9._/-]{0,62}$"
"""A label's key: lower-case letters, digits and ``. _ / -``, starting with a letter or digit, at most 63."""


INPUT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_INPUT_NAME = re.compile(INPUT_NAME_PATTERN)
_SEGMENT = r"(?:[^\s/.\x00-\x1f\x7f]|\.[^\s/.\x00-\x1f\x7f]|\.\.[^\s/\x00-\x1f\x7f])[^\s/\x00-\x1f\x7f]*"
_PATH = rf"{_SEGMENT}(?:/{_SEGMENT})*/?"
INPUT_SOURCE_PATTERN = (
    rf"^(?:s3://[a-z0-9][a-z0-9.-]{{1,62}}/{_PATH}|run:{RUN_ID_PATTERN}(?:/(?:{_PATH})?)?|{UPLOAD_SOURCE_PATTERN})$"
)
"""What ``RunSpec`` takes as an input's source, as a JSON Schema pattern: no '.', '..' or empty
segment in its path, no space or control character; or an upload of the caller's, ``upload:<sha256>``."""
_INPUT_SOURCE = re.compile(
    rf"(s3://[a-z0-9][a-z0-9.-]{{1,62}}/\S+|run:{RUN_ID_PATTERN}(/\S*)?|{UPLOAD_SOURCE_PATTERN})"
)
MAX_WORKDIR = 1024
WORKDIR_PATTERN = r"^/[^\x00-\x1f\x7f]*$"
"""A run's working directory: an absolute path of printable characters (no '..' segment, checked apart)."""


def _line_break(text: str) -> str | None:
    found = next((c for c in text if c in "\n\r\t"), None)
    return None if found is None else f"\\x{ord(found):02x}"


class Failure(Record):
    """Why a run did not succeed, as stored. A reason a later release added reads as
    ``agent_error``, its own name put at the head of the message (users never send one: the API
    answers with ``RunFailure``)."""

    reason: FailureReason
    message: str

    @model_validator(mode="before")
    @classmethod
    def _from_a_later_release(cls, data: Any) -> Any:
        reason = data.get("reason") if isinstance(data, dict) else None
        if isinstance(reason, str) and reason not in REASONS:
            return {**data, "reason": FailureReason.AGENT_ERROR, "message": f"{reason[:64]}: {data.get('message', '')}"}
        return data


class RunSpec(Record):
    """A run submission as the API accepts it."""

    model_config = ConfigDict(
        json_schema_extra={  # what _secret_names_apart and _queue_list say: tty only with interactive; a list
            "allOf": [  # of queues with no fallback
                {
                    "if": {"properties": {"tty": {"const": True}}, "required": ["tty"]},
                    "then": {"properties": {"interactive": {"const": True}}, "required": ["interactive"]},
                },
                {
                    "if": {"properties": {"queue": {"type": "array"}}, "required": ["queue"]},
                    "then": {"properties": {"fallback": {"maxItems": 0}}},
                },
            ]
        }
    )

    command: str = Field(min_length=1, max_length=65536, json_schema_extra=shown_text(command=True))
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Docker image (default: the pool's)",
        json_schema_extra=shown_text(),
    )
    name: str | None = Field(
        default=None, max_length=200, description="a name for the run", json_schema_extra=shown_text()
    )
    queue: Annotated[str | None, WithJsonSchema(QUEUE_SCHEMA, mode="validation")] = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="pool to run on (default: the smallest that fits); a list names the pools to fall back to "
        "after the first, in order (the same as queue: the first, fallback: the rest)",
    )
    resources: Resources = Field(default_factory=Resources)
    env: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={
            "propertyNames": {"pattern": ENV_NAME_PATTERN},
            "additionalProperties": {"type": "string", "pattern": NO_CONTROL_PATTERN},
            "maxProperties": MAX_ENV,
        },
    )
    inputs: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={
            "propertyNames": {"pattern": INPUT_NAME_PATTERN},
            "additionalProperties": {"type": "string", "pattern": INPUT_SOURCE_PATTERN},
            "maxProperties": MAX_INPUTS,
        },
    )
    network: bool = Field(default=False, description="give the run a network")
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
    priority: Annotated[int, WHOLE] = Field(
        default=50,
        ge=0,
        le=100,
        strict=True,  # a JSON integer (71.0 is one): no text, no fraction, no boolean
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
    labels: Annotated[
        dict[
            Annotated[str, Field(pattern=LABEL_KEY_PATTERN)],
            Annotated[str, Field(max_length=MAX_LABEL_VALUE, json_schema_extra=shown_text())],
        ],
        Since("0.2"),
    ] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        json_schema_extra={"additionalProperties": False},
        description=f"up to {MAX_LABELS} labels of your own (key: value), shown with the run and a filter of the "
        f"listing (label=key=value); a value is at most {MAX_LABEL_VALUE} characters of printable text",
        examples=[{"project": "vision", "experiment": "lr-sweep"}],
    )

    secrets: Annotated[dict[str, str], Since("0.3")] = Field(
        default_factory=dict,
        json_schema_extra={
            "propertyNames": {"pattern": ENV_NAME_PATTERN},
            "additionalProperties": {"type": "string", "pattern": SECRET_REF_PATTERN},
            "maxProperties": MAX_RUN_SECRETS,
        },
        description="environment variables whose values are secrets (ENV: 'name', yours, or 'group/name', a "
        "group's): the run stores these names only; the worker that runs it reads the values when it starts, "
        "and masks them in the run's logs",
        examples=[{"WANDB_API_KEY": "wandb", "HF_TOKEN": "vision/hf-token"}],
    )
    image_pull_secret: Annotated[str | None, Since("0.3")] = Field(
        default=None,
        pattern=SECRET_REF_PATTERN,
        description="a secret ('name' or 'group/name') holding the login for the image's registry: "
        '{"username": ..., "password": ...} or a Docker config auths entry',
    )

    workdir: Annotated[str | None, Since("0.3")] = Field(
        default=None,
        max_length=MAX_WORKDIR,
        pattern=WORKDIR_PATTERN,
        description="the container's working directory, an absolute path without '..' (e.g. /inputs/code, "
        "where an upload named code is); default: the run's output directory, /runplane/output",
        examples=["/inputs/code"],
    )
    interactive: Annotated[bool, Since("0.3")] = Field(
        default=False,
        description="the run's command takes its input from whoever attaches to it (runplane run -i, runplane "
        "attach); killed after the pool's max_idle_interactive without input; not in a sweep",
    )
    tty: Annotated[bool, Since("0.3")] = Field(
        default=False,
        description="with interactive: the command has a terminal (runplane run -it), its output one stream",
    )

    checkpoint: Annotated[CheckpointRule | None, Since("0.3")] = Field(
        default=None,
        description="the run checkpoints: it writes to $RUNPLANE_CHECKPOINT_DIR (counted in its disk), which "
        "every attempt starts from as it was last synced (docs/checkpoints.md)",
    )
    from_checkpoint: Annotated[str | None, Since("0.3")] = Field(
        default=None,
        pattern=f"^{RUN_ID_PATTERN}$",
        description="a run of yours whose newest checkpoint (when this run is submitted) this run starts from, "
        "until it has one of its own",
    )

    fallback: Annotated[list[Annotated[str, Field(pattern=NAME_PATTERN)]], Since("0.3")] = Field(
        default_factory=list,
        max_length=MAX_FALLBACK,
        description=f"up to {MAX_FALLBACK} pools the run moves on to, in order, when it has not started on its "
        "queue within fallback_after or was preempted fallback_after_preemptions times there (docs/scheduling.md)",
    )
    fallback_after: Annotated[
        float | None, Since("0.3"), duration_or_text(MIN_FALLBACK_AFTER, MAX_RUN_TIME, ["20m", 1200])
    ] = Field(
        default=None,
        ge=MIN_FALLBACK_AFTER,
        le=MAX_RUN_TIME,
        description="with fallback: how long the run waits queued on a pool before it moves to the next one",
    )
    fallback_after_preemptions: Annotated[int | None, Since("0.3"), WHOLE] = Field(
        default=None,
        ge=1,
        le=100,
        strict=True,
        description="with fallback: after this many preemptions on a pool, the run is queued on the next one",
    )

    _fallback_after = field_validator("fallback_after", mode="before")(staticmethod(read_duration))

    def upstreams(self) -> list[str]:
        """The runs (and sweep) this run waits for, each once, in the order given: its ``run:``
        inputs, ``after``, then ``after_sweep`` (as ``sweep:<id>``)."""
        found = [source[4:].partition("/")[0] for source in self.inputs.values() if source.startswith("run:")]
        found += self.after
        if self.after_sweep is not None:
            found.append(SWEEP_PREFIX + self.after_sweep)
        return list(dict.fromkeys(found))

    @model_validator(mode="before")
    @classmethod
    def _queue_list(cls, data: Any) -> Any:
        """``queue: [a, b, c]`` is ``queue: a`` with ``fallback: [b, c]``."""
        if not isinstance(data, dict) or not isinstance(data.get("queue"), list):
            return data
        pools = data["queue"]
        if not pools or len(pools) > MAX_FALLBACK + 1:
            raise ValueError(f"queue: name 1 to {MAX_FALLBACK + 1} pools (the first, then those to fall back to)")
        if wrong := [p for p in pools if not isinstance(p, str) or not re.fullmatch(NAME_PATTERN, p)]:
            raise ValueError(f"queue: {str(wrong[0])[:80]!r} is not a pool name (a-z, 0-9, -)")
        if data.get("fallback"):
            raise ValueError("give the pools to fall back to in queue or in fallback, not both")
        return {**data, "queue": pools[0], "fallback": pools[1:]}

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
        if value is None:
            return value
        if control_character(value) or _line_break(value):
            raise ValueError("must be printable text on one line")
        hidden = hidden_character(value)
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

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_RUN_SECRETS:
            raise ValueError(f"at most {MAX_RUN_SECRETS} secrets")
        for key, ref in value.items():
            check_env_name(key)
            SecretRef.parse(ref)
        return value

    @model_validator(mode="after")
    def _secret_names_apart(self) -> RunSpec:
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(f"{', '.join(both)[:200]} is both in env and in secrets: name each variable once")
        if self.tty and not self.interactive:
            raise ValueError("tty is for an interactive run: give interactive too (runplane run -it)")
        return self

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        for key, text in value.items() if isinstance(value, dict) else ():
            bad = isinstance(text, str) and (control_character(text) or hidden_character(text) or _line_break(text))
            if bad:
                raise ValueError(f"label {str(key)[:80]!r} holds {bad}: a value is printable text on one line")
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
                raise ValueError(
                    f"input {name!r}: source must be 's3://bucket/key', 'run:<id>[/path]' or 'upload:<sha256>'"
                )
            path = source.removeprefix("s3://").partition("/")[2]
            if any(part in (".", "..") for part in path.split("/")) or "//" in path or control_character(path):
                raise ValueError(f"input {name!r}: the path may not hold '.', '..' or empty segments")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith("/") or control_character(value) or _line_break(value):
            raise ValueError("workdir must be an absolute path of printable characters")
        if ".." in value.split("/"):
            raise ValueError("workdir may not hold a '..' segment")
        hidden = hidden_character(value)
        if hidden:
            raise ValueError(f"workdir holds {hidden}, a character that changes how text is shown without being seen")
        return value

    def uploads(self) -> list[str]:
        """The SHA-256 of each upload this run names as an input, each once, in the order given."""
        return list(dict.fromkeys(sha for sha in map(upload_sha, self.inputs.values()) if sha is not None))


class Usage(Record):
    """Resource use, reported while the run goes and at its end."""

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


class Event(Record):
    at: float
    state: RunState | None = None
    message: str


class Run(Record):
    """A run as stored. ``attempt`` counts claims: 0 before the first worker takes it."""

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
    kept: Annotated[bool, Since("0.3")] = False
    """Its owner keeps it (``runplane keep``): the retention sweep deletes nothing of it."""
    retention: Annotated[RunRetention | None, Since("0.3")] = None
    """Once it has ended: when its outputs, logs and record are deleted (the retention sweep's)."""
    fallback_at: Annotated[float | None, Since("0.3")] = None
    """While it is queued on a pool it may fall back from (``spec.fallback_after``): when it moves to the
    next one if it has not started by then."""
    preemptions: Annotated[int, Since("0.3")] = 0
    """Its preemptions on the pool it is queued on now (``spec.fallback_after_preemptions``)."""
    checkpoint: Annotated[CheckpointStatus | None, Since("0.3")] = None
    """Its newest checkpoint, as the worker that synced it recorded it."""
    restore_from: Annotated[CheckpointSource | None, Since("0.3")] = None
    """``spec.from_checkpoint`` pinned at submit: what its first attempt restores."""
    pieces: Annotated[int, Since("0.3")] = 0
    """The pieces it has ended with ``spec.checkpoint.exit_code`` (started again), all attempts together."""
    sessions_asked: Annotated[int, Since("0.3")] = 0
    """Bumped by the API with each session asked of it (runplane.domain.sessions): the agent's look
    at the run's control state notices it and reads the run's sessions."""


WAITING = "waiting"
"""How a queued run that waits for other runs is listed in its pool: apart from the line."""


def listed_state(run: Run) -> str:
    """Where a run is filed in its pool's listings: its state, or ``WAITING`` for a queued run
    that still waits for other runs (no worker may take it, and it is no one's backlog)."""
    return WAITING if run.state == RunState.QUEUED and run.waiting_on else str(run.state)


def run_rank(run: Run) -> str:
    return rank_key(run.spec.priority, run.fair_tag, run.created_at, run.id)
