"""What a run asks for besides its command: the pools it runs on (``RunSpec.queue``, ``fallback``), its
resources and its retry rule (``RunSpec.resources``, ``RunSpec.retry``; a pool's defaults of both)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from runplane.domain.common import (
    MAX_RUN_TIME,
    NAME_PATTERN,
    WHOLE,
    duration_or_text,
    read_duration,
    read_size,
    size_or_text,
)
from runplane.domain.states import RETRY_REASONS
from runplane.domain.units import MAX_SIZE
from runplane.domain.wire import Extensible, Record

MAX_FALLBACK = 4
"""The most pools a run may fall back to after its first (``RunSpec.fallback``)."""
MIN_FALLBACK_AFTER = 1.0
QUEUE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": NAME_PATTERN},
        {
            "type": "array",
            "items": {"type": "string", "pattern": NAME_PATTERN},
            "minItems": 1,
            "maxItems": MAX_FALLBACK + 1,
        },
        {"type": "null"},
    ],
    "examples": ["gpu", ["gpu-spot", "gpu-ondemand"]],
}
"""What ``RunSpec.queue`` takes: a pool, or the pools to run on in order (the first, then its fallback)."""


class RetryRule(Record):
    """When a run that ended badly is queued again (docs/workflows.md). A lost worker is retried
    within ``attempts`` whatever ``on`` holds (it is never the run's doing), and a preempted
    worker's run is queued again without using one up."""

    model_config = ConfigDict(allow_inf_nan=False)

    attempts: Annotated[int, WHOLE] = Field(
        ge=1, le=10, strict=True, description="the most times the run goes (1: never retried), 1..10"
    )
    on: list[Annotated[Literal[tuple(RETRY_REASONS)], Extensible]] = Field(  # type: ignore[valid-type]
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


class Resources(Record):
    """What one run asks for. Sizes accept bytes or strings ("512m"); time accepts "90s", "1h"."""

    model_config = ConfigDict(allow_inf_nan=False)

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

    _sizes = field_validator("memory", "disk", mode="before")(staticmethod(read_size))
    _times = field_validator("time", mode="before")(staticmethod(read_duration))
