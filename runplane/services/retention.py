"""What a finished run leaves, kept only as long as its pool's retention says: the owner's pin
(``keep``), what a run's view shows of its dates (``shown``), and the sweep that deletes what is due
(``sweep``, once a reaper pass)."""

from __future__ import annotations

import logging

from runplane.domain.errors import ConditionFailed
from runplane.domain.retention import Retention, RunRetention, dates
from runplane.domain.runs import Run
from runplane.domain.tenancy import Principal
from runplane.ports import Expect, Ports
from runplane.services.runs import get_run

log = logging.getLogger(__name__)

KEEP_TRIES = 5
"""How many times a pin is written again when the run changed under it."""


def keep(ports: Ports, principal: Principal, run_id: str, keep: bool) -> Run:
    """Pin (``keep``) or let go the caller's run (an admin: anyone's): while pinned, the retention
    sweep deletes nothing of it. A run that has not ended may be pinned: the pin holds once it ends.
    Raises NotFound (also for another user's run, and for one deleted meanwhile)."""
    run = get_run(ports, principal, run_id)
    for _ in range(KEEP_TRIES - 1):
        if run.kept == keep:
            return run
        try:
            return ports.store.update(run, Expect(), {"kept": keep})
        except ConditionFailed as e:
            stored = e.details.get("run")
            run = stored if isinstance(stored, Run) else ports.store.get(run_id)
    return run if run.kept == keep else ports.store.update(run, Expect(), {"kept": keep})


def retention_of(ports: Ports, queue: str) -> Retention:
    """The retention of a pool's runs: its own over the stack's (a pool no longer configured: the
    stack's)."""
    stack = ports.settings.kept()
    pool = ports.pools.get(queue)
    return stack if pool is None else pool.kept(stack)


def shown(ports: Ports, run: Run) -> RunRetention | None:
    """When ``run``'s outputs, logs and record are deleted, as its view shows it: what the sweep
    worked out once it has looked, else what the settings now give; None while it has not ended."""
    if run.retention is not None:
        return run.retention
    if not run.state.terminal:
        return None
    ended = run.finished_at if run.finished_at is not None else run.created_at
    return dates(ended, retention_of(ports, run.queue), ports.clock())
