"""The conditions of a conditional write of a run: what every store checks against the stored run
before it writes (``RunStore.update``)."""

from __future__ import annotations

from dataclasses import dataclass

from runplane.domain.runs import Run
from runplane.domain.states import RunState


@dataclass(frozen=True)
class Expect:
    """Conditions for a conditional write; None means "do not check"."""

    states: frozenset[RunState] | None = None
    attempt: int | None = None
    worker_id: str | None = None
    unkilled: bool = False
    """True: only while no kill was requested (a retry must not queue a run its owner killed)."""
    waiting: bool | None = None
    """True: only while the run still waits for other runs (``waiting_on`` not empty); False: only
    while it does not (a claim never takes a waiting run)."""
    queue: str | None = None
    """Only while the run is in this pool (a worker's claim: never of a run that moved to another)."""

    def holds(self, run: Run) -> bool:
        """Whether ``run`` meets these conditions."""
        return (
            (self.states is None or run.state in self.states)
            and (self.attempt is None or run.attempt == self.attempt)
            and (self.worker_id is None or run.worker_id == self.worker_id)
            and not (self.unkilled and run.kill_requested)
            and (self.waiting is None or bool(run.waiting_on) == self.waiting)
            and (self.queue is None or run.queue == self.queue)
        )
