"""How long what a run leaves is kept.

An operator sets a retention for the stack (``RUNPLANE_RETENTION``) and, field by field, for a pool
(``retention:`` in pools.yaml): how long after a run ends its outputs, its logs and its record are
kept, and (the stack's alone) how long an upload is kept after its last use. Nothing set: kept for
good, as before retention existed.

A finished run carries what the retention sweep (``services/retention.py``) worked out for it
(``RunRetention``: the dates, and what is already deleted) and whether its owner keeps it
(``Run.kept``). ``purge_due`` derives from both when the sweep must look at a run next; each store
indexes that time (DynamoDB: the sparse index ``by_purge``; Table storage: a ``p:`` row in the run's
partition; SQLite: the ``run_purges`` table), so that a pass reads only the runs that are due.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runplane.domain.units import parse_duration
from runplane.domain.wire import Record

if TYPE_CHECKING:
    from runplane.domain.runs import Run

FOREVER = "forever"
"""What a retention field says to keep for good (in a pool: whatever the stack says)."""

MAX_RETENTION = 100 * 366 * 86400.0
"""The longest retention that is a time: a century."""

TTL_GRACE_SECONDS = 2 * 86400.0
"""How long after a record's date DynamoDB's own TTL deletes it, should the sweep not have: the sweep
deletes a run's objects before its record, and a record gone first would leave them behind."""

TOUCH_AFTER_SECONDS = 86400.0
"""An upload is marked used again (its time renewed, which its expiry counts from) when a run names it
and its last mark is older than this: at most one write an upload a day."""

OUTPUTS, LOGS = "outputs", "logs"
"""What ``RunRetention.deleted`` lists."""
WITH_OUTPUTS = ("checkpoints",)
"""The kinds of a run's objects deleted at its outputs' date, with them (its checkpoints: they are as
big, and a run's record outlives them by far)."""

_DAYS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*d\s*$", re.IGNORECASE)


def retention_seconds(value: object) -> float | None:
    """A retention field read: seconds, a duration ("30d", "12h"), or "forever" (``math.inf``);
    None stays None (not set). Raises ValueError naming what is wrong."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == FOREVER:
        return math.inf
    if isinstance(value, str) and (days := _DAYS.match(value)):  # "400d": past parse_duration's year
        seconds = float(days.group(1)) * 86400
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        seconds = float(value) if isinstance(value, int | float) else parse_duration(value)
    else:
        raise ValueError("a retention is a duration such as '30d' or '12h', or 'forever'")
    if math.isinf(seconds):
        return math.inf
    if not 3600 <= seconds <= MAX_RETENTION:
        raise ValueError("a retention is at least an hour ('1h') and at most a century, or 'forever'")
    return seconds


class Retention(BaseModel):
    """How long what runs leave is kept, in seconds after a run ends (``math.inf``: for good; None:
    not set here, so the stack's, or for good). Written as durations ("30d") or "forever"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    outputs: float | None = Field(default=None, description="a finished run's output files and its checkpoints")
    logs: float | None = Field(default=None, description="a finished run's logs")
    runs: float | None = Field(
        default=None, description="a finished run's record, and whatever of the run is left with it"
    )
    uploads: float | None = Field(
        default=None, description="an uploaded directory, after the last run that named it was submitted (stack only)"
    )

    @field_validator("outputs", "logs", "runs", "uploads", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float | None:
        return retention_seconds(value)

    @model_validator(mode="after")
    def _record_outlives(self) -> Retention:
        for kind in ("outputs", "logs"):
            kept = getattr(self, kind)
            if self.runs is not None and kept is not None and kept > self.runs:
                raise ValueError(f"{kind} cannot be kept longer than the run's record ('runs'): they go with it")
        return self

    def over(self, stack: Retention) -> Retention:
        """This (a pool's) retention where it sets a field, the stack's where it does not."""
        return Retention.model_construct(
            **{name: value if (value := getattr(self, name)) is not None else getattr(stack, name) for name in FIELDS}
        )

    def seconds(self, kind: str) -> float | None:
        """How long ``kind`` is kept after a run ends; None: for good."""
        value: float | None = getattr(self, kind)
        return None if value is None or math.isinf(value) else value

    @property
    def sets_any(self) -> bool:
        """Whether anything is ever deleted under it."""
        return any(self.seconds(name) is not None for name in FIELDS)


FIELDS = ("outputs", "logs", "runs", "uploads")


def read_retention(text: str) -> Retention:
    """The stack's retention from its setting (JSON, e.g. ``{"outputs": "30d", "runs": "180d"}``; empty:
    none). Raises ValueError naming what is wrong."""
    if not text.strip():
        return Retention()
    return Retention.model_validate_json(text)


class RunRetention(Record):
    """What the retention sweep worked out for a finished run, and what it has deleted. Written by the
    sweep alone (the owner's pin is ``Run.kept``)."""

    checked_at: float
    """When the sweep worked the dates out (from the run's end and its pool's retention then)."""
    outputs_at: float | None = None
    """When its outputs, and its checkpoints, are (were) deleted; None: kept for good."""
    logs_at: float | None = None
    record_at: float | None = None
    deleted: list[str] = Field(default_factory=list)
    """What is gone already: ``outputs``, ``logs``."""


def dates(finished_at: float, retention: Retention, now: float) -> RunRetention:
    """The dates of a run that ended at ``finished_at`` under ``retention`` (its pool's over the stack's),
    worked out at ``now``. What outlives the record goes with it."""
    record = retention.seconds("runs")
    record_at = None if record is None else finished_at + record

    def at(kind: str) -> float | None:
        kept = retention.seconds(kind)
        date = None if kept is None else finished_at + kept
        if record_at is not None:
            date = record_at if date is None else min(date, record_at)
        return date

    return RunRetention(checked_at=now, outputs_at=at(OUTPUTS), logs_at=at(LOGS), record_at=record_at)


def purge_due(run: Run) -> float | None:
    """When the retention sweep must look at ``run`` next; None: never (not finished, kept, or
    nothing of it is left to delete: its dates keep the rest for good). A finished run not looked at
    yet is due from its end. Every store indexes this time; a run that leaves the index comes back
    when the sweep dates it afresh (its pool's retention changed, or its owner let it go)."""
    if not run.state.terminal or run.kept:
        return None
    checked = run.retention
    if checked is None:
        return run.finished_at if run.finished_at is not None else run.created_at
    due = [
        date
        for kind, date in ((OUTPUTS, checked.outputs_at), (LOGS, checked.logs_at), ("record", checked.record_at))
        if date is not None and kind not in checked.deleted
    ]
    return min(due) if due else None


def ttl_at(run: Run) -> int | None:
    """The time (whole seconds) a store's own expiry (DynamoDB TTL) may delete ``run``'s record: some
    days after its date (or after it was dated, if later), as a backstop to the sweep; None: never
    (kept, or no date)."""
    if run.kept or run.retention is None or run.retention.record_at is None or not run.state.terminal:
        return None
    # never sooner than some days after the dates were worked out: a run dated late (one that ended
    # before the index, say) must leave the sweep its days to delete the objects before the record
    return math.ceil(max(run.retention.record_at, run.retention.checked_at) + TTL_GRACE_SECONDS)


def run_prefix(run_id: str) -> str:
    """Every object of a run: its logs, its outputs, anything else."""
    return f"runs/{run_id}/"


def kind_prefix(run_id: str, kind: str) -> str:
    """The objects of a run's ``outputs`` or ``logs``, all attempts (or of another kind: its checkpoints)."""
    return f"runs/{run_id}/{kind}/"


def kind_prefixes(run_id: str, kind: str) -> list[str]:
    """What the retention of a run's ``outputs`` or ``logs`` deletes: the outputs' its checkpoints too."""
    return [kind_prefix(run_id, kind), *(kind_prefix(run_id, k) for k in WITH_OUTPUTS if kind == OUTPUTS)]
