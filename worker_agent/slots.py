"""What this worker holds now, shared by its duties (intake, reporting, recovery, the loop): the
runs under way and their room, its counters, and the one lock over them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker_agent.resources import Allocator

if TYPE_CHECKING:
    from worker_agent.executor import RunExecutor


@dataclass
class Slots:
    """``active``, ``leaving`` and the counters are read and written under ``lock``;
    ``allocator`` (the room runs hold) has a lock of its own. ``stopping`` is set once the
    worker takes no more runs; ``freed`` each time a slot is given back."""

    allocator: Allocator
    exit_after_num_runs: int | None = None
    active: dict[str, RunExecutor] = field(default_factory=dict)
    leaving: list[RunExecutor] = field(
        default_factory=list
    )  # runs over whose container and directory may still be going
    claimed: int = 0
    finished: int = 0
    cached_inputs: int = 0  # counted between runs, not at every heartbeat
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    freed: threading.Event = field(default_factory=threading.Event)

    def runs_left(self) -> int | None:
        """How many more runs this worker may claim (None: no limit)."""
        if self.exit_after_num_runs is None:
            return None
        return max(0, self.exit_after_num_runs - self.claimed)

    def ending_here(self, run_id: str) -> bool:
        """Whether an attempt of ``run_id`` is under way on this worker."""
        with self.lock:
            return run_id in self.active

    def executors(self) -> list[RunExecutor]:
        with self.lock:
            return list(self.active.values())

    def owners(self) -> dict[str, str]:
        """The owner of each run under way, by run id."""
        with self.lock:
            return {run_id: executor.run.owner for run_id, executor in self.active.items()}
