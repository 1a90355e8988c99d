"""What users and groups may hold (quotas), what they hold and used (holds, usage records), and
their place in the fair share of a pool (lanes)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from runplane.domain.common import NAME_PATTERN, SCHEMA_VERSION
from runplane.domain.tenancy import USER_PATTERN
from runplane.domain.wire import Record

QuotaKind = Literal["user", "group"]
Period = Literal["day", "week", "month"]


class Quota(Record):
    """What one user or group may hold of the pools: concurrent caps and budgets per period.

    A limit that is None does not apply. Budgets are in hours of the resource held (requested
    gpus or cpus times wall-clock time), per calendar ``period`` (UTC).
    """

    model_config = ConfigDict(allow_inf_nan=False)

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


class Hold(Record):
    """What one claimed attempt of a run holds of a user's or group's quota, until it ends."""

    model_config = ConfigDict(allow_inf_nan=False)

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


class UsageRecord(Record):
    """What a user or group holds now and has used this period. Every write is conditional on
    ``version`` (0: the record must not exist yet), so two workers claiming at once never both
    take the last of a cap: the second one's write fails and it reads again."""

    model_config = ConfigDict(allow_inf_nan=False)

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


class Lane(Record):
    """A user's place in the fair share of one pool at one priority (docs/scheduling.md; each
    priority is a line of its own, with its own virtual time): the fair tag the user's
    next run would take, ``tag``, and the ``lead`` over the pool's line that the user had at
    ``at``, which halves every ``Pool.fair_share_half_life``. Every write is conditional on
    ``version`` (0: the record must not exist yet), like a usage record's."""

    model_config = ConfigDict(allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    pool: str
    priority: int = Field(ge=0, le=100)
    user: str
    tag: float = 0.0
    lead: float = 0.0
    at: float = 0.0
    version: int = 0
