"""What other threads ask of a run while it goes, and what the store says of it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from runplane.domain.errors import LeaseLost, NotFound, RunplaneError
from runplane.domain.runs import Run
from runplane.ports import RunStore
from worker_agent.run_state import RunStateWriter

log = logging.getLogger(__name__)


class RunControl:
    """The flags a run's executor acts on: ``kill`` (asked for in the store), ``requeue`` (this
    worker was told to stop and hand its runs back) and ``lease_lost`` (the store says this
    worker no longer holds the attempt). They are set by the agent's heartbeat (``observe``,
    ``lease_lost``), by the agent (``requeue``) and by the executor's own polls (``poll``), and
    are never cleared. ``state`` keeps the freshest copy of the run read."""

    def __init__(self, state: RunStateWriter, store: RunStore, worker_id: str) -> None:
        self.state = state
        self.kill = threading.Event()
        self.lease_lost = threading.Event()
        self.requeue = threading.Event()
        self.stop_by: float | None = None
        """When a hand-back must be over (grace and final sync), on the executor's clock: a preemption
        notice's moment less a margin (None: no notice said when)."""
        self._store = store
        self._worker_id = worker_id
        self.on_observe: Callable[[Run], None] | None = None
        """Told of every fresher copy of the run this attempt still holds (the run's sessions)."""

    @property
    def run(self) -> Run:
        return self.state.run

    def observe(self, run: Run) -> None:
        """Take in a fresher copy of the stored run (from a heartbeat or a poll)."""
        if run.attempt != self.run.attempt or run.worker_id != self._worker_id or run.state.terminal:
            self.lease_lost.set()
            return
        if run.kill_requested:
            self.kill.set()
        self.state.seen(run)
        if self.on_observe is not None:
            self.on_observe(run)

    def poll(self) -> None:
        """Read the run for a kill or a lost lease (the heartbeat does it too, less often). A read
        that fails is logged. Raises LeaseLost once the lease is lost."""
        try:
            self.observe(self._store.get(self.run.id))
        except NotFound:
            self.lease_lost.set()
        except RunplaneError as e:
            log.warning("run %s: control poll failed: %s", self.run.id, e)
        if self.lease_lost.is_set():
            raise LeaseLost(f"run {self.run.id} attempt {self.run.attempt} was taken away")

    def stopping(self) -> bool:
        """Whether the run is to stop: killed, handed back or taken away."""
        return self.kill.is_set() or self.requeue.is_set() or self.lease_lost.is_set()

    def pause(self, seconds: float, poll_seconds: float) -> bool:
        """Wait ``seconds`` unless the run is to stop meanwhile, the store polled every ``poll_seconds``
        (raises LeaseLost). Whether it is to stop."""
        deadline = time.monotonic() + seconds
        while not self.stopping():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not self.requeue.wait(min(left, poll_seconds)):
                self.poll()
        return True
