"""Sweeps: many runs from one template, one per point of a parameter grid (times ``count``).

A sweep is one record. Its members become runs only when they are released (in step with the
capacity of their pool, or ``max_parallel``), so that a sweep of 10,000 is one write and never
10,000 waiting queue messages. The record keeps one status character per member (``status``):
whether it waits for release, is out as a run, or how its latest try ended. Counts are read from
it, never from a scan of the runs.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from runplane.domain.checkpoints import CheckpointSource
from runplane.domain.common import (
    ENV_NAME_PATTERN,
    NO_CONTROL_PATTERN,
    SCHEMA_VERSION,
    WHOLE,
    check_env_name,
    control_character,
    hidden_character,
    shown_text,
)
from runplane.domain.runs import MAX_DEPENDENTS, MAX_ENV, Event, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.wire import Record, Since

MAX_SWEEP = 10_000
"""The most members one sweep may have."""
MAX_PARAMETERS = 32
MAX_VALUE_CHARS = 1000
MAX_RECORD_BYTES = 340 * 1024
"""The largest a sweep's record may grow (DynamoDB holds 400 KB an item): checked at create with
room for every member's next tries and a full timeline."""
MAX_EVENTS = 50
"""A sweep's timeline keeps its first event and the latest ones, this many in all."""

PENDING = "."
"""Not released yet: no run exists for the member's current try."""
OPEN = "o"
"""Released: its run exists and has not finished."""
SUCCEEDED = "s"
# How a member's latest try ended, by failure reason (the reason decides the state: see
# ``state_of``). Letters are stored: never reuse one.
_REASON_CODES: dict[FailureReason, str] = {
    FailureReason.NONZERO_EXIT: "a",
    FailureReason.IMAGE_NOT_FOUND: "b",
    FailureReason.OUT_OF_MEMORY: "c",
    FailureReason.TIME_LIMIT: "d",
    FailureReason.DISK_LIMIT: "e",
    FailureReason.LOG_LIMIT: "f",
    FailureReason.KILLED: "g",
    FailureReason.WORKER_LOST: "h",
    FailureReason.INPUT_UNAVAILABLE: "i",
    FailureReason.UPLOAD_FAILED: "j",
    FailureReason.CONTAINER_ERROR: "k",
    FailureReason.GPU_UNAVAILABLE: "l",
    FailureReason.AGENT_ERROR: "m",
    FailureReason.DEPENDENCY_FAILED: "n",
    FailureReason.NOT_PERMITTED: "q",  # "o" is OPEN, "s" SUCCEEDED
    FailureReason.IMAGE_TOO_LARGE: "p",
    FailureReason.SECRET_UNAVAILABLE: "r",
    FailureReason.IMAGE_UNAUTHORIZED: "t",
}
_CODE_REASONS = {code: reason for reason, code in _REASON_CODES.items()}


def ended_code(state: RunState, reason: FailureReason | None) -> str:
    """The status character of a member whose run ended in ``state`` with ``reason``."""
    if state == RunState.SUCCEEDED:
        return SUCCEEDED
    if reason is None:
        reason = {RunState.KILLED: FailureReason.KILLED, RunState.TIMED_OUT: FailureReason.TIME_LIMIT}.get(
            state, FailureReason.AGENT_ERROR
        )
    return _REASON_CODES[reason]


def reason_of(code: str) -> FailureReason | None:
    """The failure reason a finished member's code stands for; a letter a later release added (a
    reason this one does not know) reads as ``agent_error``, as such a reason does in a run."""
    if code in (PENDING, OPEN, SUCCEEDED):
        return None
    return _CODE_REASONS.get(code, FailureReason.AGENT_ERROR)


def state_of(code: str) -> RunState | None:
    """The state a finished member's code stands for (None: not finished)."""
    if code == SUCCEEDED:
        return RunState.SUCCEEDED
    reason = reason_of(code)
    if reason is None:
        return None
    return {FailureReason.KILLED: RunState.KILLED, FailureReason.TIME_LIMIT: RunState.TIMED_OUT}.get(
        reason, RunState.FAILED
    )


ParamValue = StrictBool | StrictInt | Annotated[float, StrictFloat] | Annotated[str, Field(max_length=MAX_VALUE_CHARS)]


def render(value: Any) -> str:
    """A parameter value as its member's environment variable holds it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


class SweepSpec(Record):
    """A sweep as the API accepts it (POST /v1/sweeps)."""

    model_config = ConfigDict(allow_inf_nan=False)

    name: str | None = Field(default=None, max_length=200, json_schema_extra=shown_text())
    run: RunSpec = Field(description="the template of every member: a POST /v1/runs body")
    parameters: dict[str, list[ParamValue]] = Field(
        default_factory=dict,
        description="the grid: each name is an environment variable of every member, and the sweep has one "
        "member per combination of values",
        json_schema_extra={
            "propertyNames": {"pattern": ENV_NAME_PATTERN},
            "maxProperties": MAX_PARAMETERS,
            "additionalProperties": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_SWEEP,
                "items": {
                    "anyOf": [
                        {"type": "boolean"},
                        {"type": "number"},
                        {"type": "string", "maxLength": MAX_VALUE_CHARS, "pattern": NO_CONTROL_PATTERN},
                    ]
                },
            },
        },
    )
    count: Annotated[int | None, WHOLE] = Field(
        default=None, ge=1, le=MAX_SWEEP, strict=True, description="members per point of the grid (default 1)"
    )
    max_parallel: Annotated[int | None, WHOLE] = Field(
        default=None,
        ge=1,
        le=MAX_SWEEP,
        strict=True,
        description="the most members out at once (queued for a worker or running); default: as many as the "
        "pool can run",
    )

    @field_validator("name")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and (control_character(value) or any(c in value for c in "\n\r\t")):
            raise ValueError("must be printable text on one line")
        hidden = None if value is None else hidden_character(value)
        if hidden:
            raise ValueError(f"holds {hidden}, a character that changes how text is shown without being seen")
        return value

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if len(value) > MAX_PARAMETERS:
            raise ValueError(f"at most {MAX_PARAMETERS} parameters")
        for name, values in value.items():
            try:  # a parameter is an environment variable: the same names are allowed
                check_env_name(name)
            except ValueError as e:
                raise ValueError(f"parameter {name[:80]!r}: {e}") from None
            if not values:
                raise ValueError(f"parameter {name!r} has no values")
            if len(values) > MAX_SWEEP:
                raise ValueError(f"parameter {name!r} has more than {MAX_SWEEP} values")
            for v in values:
                if isinstance(v, str) and control_character(v):
                    raise ValueError(f"parameter {name!r}: a value holds the control character {control_character(v)}")
        return value

    @model_validator(mode="after")
    def _size(self) -> SweepSpec:
        clash = sorted(set(self.parameters) & set(self.run.env))
        if clash:
            raise ValueError(f"parameters {clash} are also in run.env; give each once")
        if len(self.parameters) + len(self.run.env) > MAX_ENV:
            raise ValueError(f"run.env and parameters hold more than {MAX_ENV} environment variables together")
        return self  # its size (at most MAX_SWEEP members) is the service's to judge: sweeps.create_sweep

    @property
    def grid(self) -> int:
        return math.prod(len(v) for v in self.parameters.values()) if self.parameters else 1

    @property
    def size(self) -> int:
        return self.grid * (self.count or 1)

    def point(self, index: int) -> dict[str, str]:
        """Member ``index``'s parameters. Members go through the grid once, then again for each
        further ``count``; within the grid the last parameter changes fastest."""
        rest = index % self.grid
        values: dict[str, str] = {}
        for name in reversed(list(self.parameters)):
            choices = self.parameters[name]
            rest, digit = divmod(rest, len(choices))
            values[name] = render(choices[digit])
        return dict(reversed(list(values.items())))


class Sweep(Record):
    """A sweep as stored. ``version`` counts its writes; each is conditional on it."""

    v: int = SCHEMA_VERSION
    id: str
    owner: str
    owner_groups: list[str] = Field(default_factory=list)
    group: str | None = None
    spec: SweepSpec
    """As submitted, with the template's pool, image, resources and retry rule filled in."""
    queue: str
    created_at: float
    finished_at: float | None = None
    max_parallel: int | None = None
    status: str
    """One character per member: ``PENDING``, ``OPEN``, or how its latest try ended."""
    tries: dict[str, int] = Field(default_factory=dict)
    """Member index -> its latest try, for members run again (absent: 1)."""
    killed: bool = False
    waiting_on: list[str] = Field(default_factory=list)
    """The runs (and sweep) it waits for that had not succeeded when last looked at: no member is
    released while any is left."""
    dependents: list[str] = Field(default_factory=list)
    """Runs and sweeps that wait for this sweep, told when it finishes."""
    request_hash: str | None = None
    version: int = 0
    events: list[Event] = Field(default_factory=list)
    restore_from: Annotated[CheckpointSource | None, Since("0.3")] = None
    """The template's ``from_checkpoint`` pinned when the sweep was submitted: what each member starts from."""

    @property
    def size(self) -> int:
        return len(self.status)

    def member_id(self, index: int) -> str:
        """The run id of member ``index``'s latest try."""
        tries = self.tries.get(str(index), 1)
        return f"{self.id}-{index}" + (f"-{tries}" if tries > 1 else "")

    def largest_bytes(self) -> int:
        """How big its record can grow: as it is, plus a try count for every member and a full
        timeline."""
        return len(self.model_dump_json().encode()) + self.size * 14 + MAX_EVENTS * 300 + MAX_DEPENDENTS * 80

    def with_event(self, event: Event) -> list[Event]:
        """Its events with ``event`` added: the first kept, then the latest (``MAX_EVENTS``)."""
        events = [*self.events, event]
        return events if len(events) <= MAX_EVENTS else [events[0], *events[-(MAX_EVENTS - 1) :]]

    def indices(self, code: str) -> list[int]:
        return [i for i, c in enumerate(self.status) if c == code]

    def tally(self) -> tuple[dict[str, int], dict[str, int]]:
        """(members by state of their latest try, finished members by failure reason), where a
        member not released yet or out counts as queued (the caller may split the ones out)."""
        counts: dict[str, int] = {}
        failures: dict[str, int] = {}
        for code, n in Counter(self.status).items():
            state = state_of(code)
            key = str(state) if state is not None else str(RunState.QUEUED)
            counts[key] = counts.get(key, 0) + n
            reason = reason_of(code)
            if reason is not None:
                failures[str(reason)] = failures.get(str(reason), 0) + n
        return counts, failures
