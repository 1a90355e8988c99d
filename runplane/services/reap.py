"""The reaper: runs whose worker stopped renewing its lease go back to the queue (or fail),
queued runs whose hint may have been lost get a fresh one, and quota holds left behind by
attempts that are over are given back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from runplane.domain.errors import ConditionFailed, RunplaneError
from runplane.domain.expect import Expect
from runplane.domain.messages import RunMessage
from runplane.domain.runs import Run
from runplane.domain.states import ACTIVE_STATES, RunState
from runplane.ports import Ports
from runplane.services import fallback, sessions
from runplane.services.admission import heal
from runplane.services.lifecycle import requeue
from runplane.services.retention import RetentionReport

log = logging.getLogger(__name__)


@dataclass
class ReapReport:
    requeued: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    rehinted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    """Quota holds (``run#attempt``) given back because their attempt was over."""
    expired_sessions: list[str] = field(default_factory=list)
    """Sessions that were over in truth and now read so: asked and taken by no worker in time,
    or of an attempt that is over (``sessions.expire``)."""
    retention: RetentionReport | None = None
    """What the retention sweep that followed did (``handlers.run_reaper``); None: nothing."""
    fell_back: list[str] = field(default_factory=list)
    """Queued runs whose time on their pool was up, moved to their next pool here (their timer was lost)."""


REHINT_WINDOW = 32
"""The most queued runs of a pool one reaper pass re-hints: those first in line."""


def _runs(ports: Ports, queue: str, state: RunState) -> Iterator[Run]:
    cursor = None
    while True:
        page = ports.store.list(queue=queue, state=state, limit=100, cursor=cursor)
        yield from page.runs
        if not page.next_cursor:
            return
        cursor = page.next_cursor


def _lease(ports: Ports, run: Run, now: float, report: ReapReport) -> Run:
    """``run`` re-queued (or ended) if its lease expired, noted in ``report``; the run as it is now."""
    if run.lease_expires_at is None or run.lease_expires_at >= now:
        return run
    why = f"worker {run.worker_id} stopped renewing its lease"
    expect = Expect(states=frozenset({run.state}), attempt=run.attempt, worker_id=run.worker_id)
    try:
        # a preemptible machine that went silent was most likely taken away: a preemption of the run
        updated = requeue(
            ports, run, now, why, expect=expect, charge=not run.on_preemptible, preempted=run.on_preemptible
        )
    except ConditionFailed:
        return run  # the worker came back or another reaper got there first
    except RunplaneError as e:
        log.warning("could not reap run %s: %s", run.id, e)
        return run
    (report.requeued if updated.state == RunState.QUEUED else report.ended).append(run.id)
    return updated


def _fell_back(ports: Ports, run: Run, now: float, report: ReapReport) -> bool:
    """Whether ``run``, first in its pool's line, had its time there up (``Run.fallback_at``) and was
    moved to its next pool: what its timer on the dispatcher's queue would have done."""
    if run.fallback_at is None or run.fallback_at > now or run.waiting_on:
        return False
    try:
        moved = fallback.fall_back(ports, run, now)
    except RunplaneError as e:
        log.warning("could not move run %s to its next pool: %s", run.id, e)
        return False
    if moved is None:
        return False
    report.fell_back.append(run.id)
    return True


def reap(ports: Ports, rehint_after: float | None = None) -> ReapReport:
    """One pass: re-queue (or end) runs whose lease expired, re-hint the first REHINT_WINDOW runs
    in each pool's line not hinted for ``rehint_after`` seconds (default: the stack's
    ``rehint_seconds``) -- moving those whose time on their pool is up to their next one instead
    (``fallback.fall_back``) --, and release the quota holds of attempts that are over
    (``admission.heal``: a re-queued run's hold goes once it is older than the grace), and end the
    sessions that are over in truth: those no worker took in time, those of an attempt that is over
    (one read of a run's sessions for each active run ever asked one, and each it re-queued or
    ended, at most ``sessions.EXPIRE_RUNS_PER_PASS``)."""
    store, queue, now = ports.store, ports.queue, ports.clock()
    if rehint_after is None:
        rehint_after = ports.settings.rehint_seconds
    report = ReapReport()
    asked: list[Run] = []  # active runs asked for sessions (as the pass left them): theirs are read
    for pool in ports.pools.pools:
        for state in sorted(ACTIVE_STATES):
            for run in _runs(ports, pool.name, state):
                run = _lease(ports, run, now, report)
                if run.sessions_asked > 0:
                    asked.append(run)  # as this pass left it: a re-queued run's sessions end with the attempt
        # the head of the line only: an agent starts the first run in line it can take, whatever
        # run its hint names, so what keeps a pool moving is a hint for each free slot, not one for
        # every queued run; re-hinting a long backlog would flood the queue with stale hints
        for run in store.head(pool.name, REHINT_WINDOW):
            if _fell_back(ports, run, now, report):
                continue
            # a hint "sent" after now: the clock stepped back since, and it would look fresh for as long
            if run.hinted_at is not None and 0 <= now - run.hinted_at < rehint_after:
                continue
            try:
                store.update(run, Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt), {"hinted_at": now})
                queue.send(pool.name, RunMessage(run_id=run.id, attempt=run.attempt))
            except ConditionFailed:
                continue
            except RunplaneError as e:
                log.warning("could not re-hint run %s: %s", run.id, e)
                continue
            report.rehinted.append(run.id)
    try:
        report.expired_sessions = sessions.expire(ports, asked)
    except RunplaneError as e:
        log.warning("could not expire sessions: %s", e)
    try:
        report.released = heal(ports, now)
    except RunplaneError as e:
        log.warning("could not release stale quota holds: %s", e)
    return report
