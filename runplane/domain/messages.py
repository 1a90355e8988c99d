"""What travels on the queues: a run's hint on its pool queue and the dispatcher's events."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, SerializerFunctionWrapHandler, model_serializer

from runplane.domain.common import SCHEMA_VERSION
from runplane.domain.states import FailureReason, RunState, known_reason
from runplane.domain.wire import Record


class RunMessage(Record):
    """A hint on a pool queue that a run is waiting at ``attempt``. The store is the truth."""

    v: int = SCHEMA_VERSION
    run_id: str
    attempt: int


class RunEnd(Record):
    """How a run ended, as its end event carries it to the dispatcher's metrics."""

    state: RunState
    reason: Annotated[FailureReason | None, BeforeValidator(known_reason)] = None
    """A reason a later release added reads as ``agent_error``."""
    to_running: float | None = Field(default=None, ge=0)
    """Seconds from its submit to its last start (``Run.started_at``); None when it never started."""


class DispatchEvent(Record):
    """A nudge for the dispatcher that a pool's backlog changed, or that a run ended. An event
    another release wrote, with fields this one does not know, is still the nudge it was (read with
    ``stored``: dropping it would leave its sweep or waiting runs to the schedule)."""

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
    fallback: str | None = None
    """This run's time on ``pool`` (``RunSpec.fallback_after``) is up at ``due``: if it is still queued
    there, it moves to its next pool. Sent with a delay; one that comes early is sent again. A 0.2
    dispatcher reads it tolerantly, as a nudge of ``pool``, and acknowledges it: the timer is lost,
    and the reaper's backstop moves the run (``services.reap.TIMER_GRACE`` past its time)."""
    due: float | None = None
    skip: int = Field(default=0, ge=0)
    """With ``upstream``: how many of what waits for it earlier events told already (the rest is
    told in bounded chunks, one event each)."""

    @model_serializer(mode="wrap")
    def _written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``member``, ``skip``, ``fallback`` and ``due`` are written only when set: a 0.1 dispatcher
        refused an event with a field it did not know (0.2 reads one as the nudge it was, ``stored``),
        and an event stays as small as the release before wrote it."""
        data: dict[str, Any] = handler(self)
        if self.member is None:
            data.pop("member", None)
        if self.skip == 0:
            data.pop("skip", None)
        for field in ("fallback", "due"):
            if data.get(field) is None:
                data.pop(field, None)
        return data
