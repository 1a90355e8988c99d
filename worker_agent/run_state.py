"""The one writer of a run's state on this worker: every state an attempt moves through here,
and its end, is written by ``RunStateWriter``."""

from __future__ import annotations

import threading
from typing import Any

from runplane.domain import retries
from runplane.domain.checkpoints import CheckpointStatus
from runplane.domain.errors import ConditionFailed, LeaseLost, NotFound
from runplane.domain.expect import Expect
from runplane.domain.runs import Event, Run, Usage
from runplane.domain.states import ACTIVE_STATES, FailureReason, RunState
from runplane.ports import Clock, RunPorts
from runplane.services import lifecycle
from worker_agent.container_spec import holds
from worker_agent.outcome import Outcome


class RunStateWriter:
    """One attempt's record as this worker last read or wrote it (``run``), and its writes. Each
    write is conditional on the attempt and this worker (``lifecycle``): one that fails raises
    LeaseLost, and nothing is written. ``memory_cap`` is the most memory a worker of the run's
    pool has (an out_of_memory retry grows the limit at most to it)."""

    def __init__(
        self,
        run: Run,
        ports: RunPorts,
        clock: Clock,
        memory_cap: int | None = None,
    ) -> None:
        self._run = run
        self._ports = ports
        self._clock = clock
        self._memory_cap = memory_cap
        self._lock = threading.Lock()

    @property
    def run(self) -> Run:
        with self._lock:
            return self._run

    def seen(self, run: Run) -> None:
        """Take in a fresher copy of the stored run (from a heartbeat or a poll)."""
        with self._lock:
            self._run = run

    def holds_attempt(self, worker_id: str) -> bool:
        """Whether the store, read now, says ``worker_id`` holds this attempt."""
        run = self.run
        try:
            stored = self._ports.store.get(run.id)
        except NotFound:
            return False
        return holds(stored, worker_id, run.attempt)

    def running(self, now: float, message: str) -> None:
        self.seen(lifecycle.advance(self._ports.store, self.run, RunState.RUNNING, now, message))

    def note(self, now: float, message: str) -> None:
        """Add ``message`` to the timeline of the attempt while this worker holds it (a session's
        end). Raises LeaseLost."""
        self.seen(lifecycle.note(self._ports.store, self.run, now, message))

    def checkpointed(self, status: CheckpointStatus, message: str | None = None) -> None:
        """Record the run's newest checkpoint (``Run.checkpoint``), with an event only when ``message``
        says one (a sync has none). Raises LeaseLost."""
        self._record({"checkpoint": status}, None if message is None else Event(at=self._clock(), message=message))

    def piece_ended(self, pieces: int, message: str) -> None:
        """Record that ``pieces`` pieces of the run have ended to be started again (``Run.pieces``), with
        ``message`` on its timeline (a record keeps its first events and its latest). Raises LeaseLost."""
        self._record({"pieces": pieces}, Event(at=self._clock(), message=message))

    def _record(self, changes: dict[str, Any], event: Event | None = None) -> None:
        run = self.run
        expect = Expect(states=ACTIVE_STATES, attempt=run.attempt, worker_id=run.worker_id)
        try:
            self.seen(self._ports.store.update(run, expect, changes, event))
        except ConditionFailed as e:
            raise LeaseLost(f"run {run.id} attempt {run.attempt} is no longer held: {e.message}") from e

    def uploading(self, message: str) -> None:
        self.seen(lifecycle.advance(self._ports.store, self.run, RunState.UPLOADING, self._clock(), message))

    def requeue(self, why: str, usage: Usage, *, preempted: bool = False) -> None:
        """Hand the run back to its queue, not charged to it (``lifecycle.requeue``; ``preempted``: its
        machine is being taken away, counted in the run's preemptions on its pool)."""
        lifecycle.requeue(self._ports, self.run, self._clock(), why, charge=False, usage=usage, preempted=preempted)

    def finish(self, outcome: Outcome, usage: Usage) -> None:
        """Write how the attempt ended: ``outcome.state``, or, for a failure its retry rule names
        (``retries.decide``), the run queued again for its next attempt. Then tell what waits
        for the run that it ended."""
        run = self.run
        if outcome.state == RunState.SUCCEEDED:
            new = lifecycle.advance(
                self._ports.store,
                run,
                RunState.SUCCEEDED,
                self._clock(),
                outcome.message,
                exit_code=outcome.exit_code,
                usage=usage,
            )
        else:
            new = self._fail(run, outcome, usage)
        self.seen(new)
        lifecycle.ended(self._ports.queue, new)

    def _fail(self, run: Run, outcome: Outcome, usage: Usage) -> Run:
        reason = outcome.reason or FailureReason.AGENT_ERROR
        decision = retries.decide(run, reason, self._memory_cap)
        if decision is not None and decision.retry:
            return lifecycle.retry(
                self._ports,
                run,
                reason,
                outcome.message,
                decision.note,
                self._clock(),
                memory=decision.memory,
                usage=usage,
                exit_code=outcome.exit_code,
                state=outcome.state,
            )
        message = outcome.message if decision is None else f"{outcome.message}; {decision.note}"
        return lifecycle.fail(
            self._ports.store,
            run,
            reason,
            message,
            self._clock(),
            state=outcome.state,
            exit_code=outcome.exit_code,
            usage=usage,
        )
