"""The room a claim reserves under its owner's and group's quotas, and its release when the
attempt ends (``services/admission.py``)."""

from __future__ import annotations

import logging

from runplane.domain.errors import ConditionFailed, RunplaneError
from runplane.domain.expect import Expect
from runplane.domain.runs import Run
from runplane.domain.states import RunState
from runplane.ports import Clock
from runplane.services import admission
from worker_agent.run_config import AgentPorts

log = logging.getLogger(__name__)


class QuotaHolds:
    def __init__(self, ports: AgentPorts, clock: Clock) -> None:
        self.ports = ports
        self.clock = clock

    def reserve(self, run: Run) -> bool | None:
        """Reserve room for the attempt the claim makes under its owner's and group's quotas:
        True when there is room (or no quota store); False when there is none, recorded as the
        run's waiting reason; None when the quota store failed."""
        if self.ports.quotas is None:
            return True
        try:
            reason = admission.reserve(self.ports.quotas, run, run.attempt + 1, self.clock())
        except Exception as e:  # whatever the quota store met: not now, and never the agent's end
            log.warning("run %s: cannot reserve its quota now: %s", run.id, e)
            return None
        if reason is None:
            return True
        log.info("run %s waits: %s", run.id, reason)
        if run.waiting_reason != reason:
            try:
                self.ports.store.update(
                    run,
                    Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt, queue=run.queue),
                    {"waiting_reason": reason},
                )
            except ConditionFailed:
                pass  # claimed or ended meanwhile
            except RunplaneError as e:
                log.warning("run %s: could not record why it waits: %s", run.id, e)
        return False

    def release(self, run: Run, attempt: int) -> None:
        """Give back what attempt ``attempt`` of ``run`` holds under quotas, and re-send the hints
        of runs that waited for that room. A failure is logged: the reaper releases what is left."""
        if self.ports.quotas is None:
            return
        try:
            blocked = admission.release(self.ports.quotas, run, attempt, self.clock())
            if blocked:
                admission.rehint(self.ports, blocked)
        except Exception as e:  # whatever the quota store met: the slot is given back all the same
            log.warning("run %s: could not release its quota hold (the reaper will): %s", run.id, e)
