"""The reaper: runs whose worker stopped renewing its lease go back to the queue (or fail),
queued runs whose hint may have been lost get a fresh one, and quota holds left behind by
attempts that are over are given back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import ValidationError

from runplane.domain.errors import BadRequest, ConditionFailed, RunplaneError
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
TIMER_GRACE = 30.0
"""Seconds past a queued run's ``fallback_at`` before the reaper takes its timer for lost and moves
it itself: a timer on time moves it first, and the two never race for it."""
FALLBACK_SCAN = 200
"""The most queued runs of a pool one reaper pass looks at for a time on the pool that is up (a
run whose fallback timer was lost), from where the pass before stopped: every queued run of a pool
is looked at within ``ceil(queued / FALLBACK_SCAN)`` passes."""
FALLBACK_RECORD = "@fallback"
"""The pool-state record (no pool's name) where the reaper keeps where its look at each pool's
queued runs stopped. A pool taken out of the pools file keeps its entry, and its queued runs are
looked at (and moved on to their next pool that is configured) until a whole look finds none."""


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
    """Whether queued ``run`` had its time on its pool up (``Run.fallback_at``) TIMER_GRACE ago, or
    is on a pool no longer configured, and was moved to its next pool: what its timer on the
    dispatcher's queue would have done."""
    if not run.spec.fallback or run.waiting_on or run.id in report.fell_back:
        return False
    late = run.fallback_at is not None and run.fallback_at + TIMER_GRACE <= now
    stranded = ports.pools.get(run.queue) is None
    if not late and not stranded:
        return False
    try:
        moved = fallback.fall_back(ports, run, now, by="" if stranded else "by the reaper: its timer did not come")
    except RunplaneError as e:
        log.warning("could not move run %s to its next pool: %s", run.id, e)
        return False
    if moved is None:
        return False
    report.fell_back.append(run.id)
    return True


def _look(ports: Ports, pool: str, cursor: str | None, now: float, report: ReapReport) -> tuple[str | None, bool]:
    """Up to FALLBACK_SCAN queued runs of ``pool`` from ``cursor`` on, those due moved on
    (``_fell_back``); where the look stopped (None: at the end) and whether it found any queued run."""
    seen, pages, found = 0, 0, False
    while seen < FALLBACK_SCAN and pages < 2 + FALLBACK_SCAN // 100:  # a filtered page may come back short
        pages += 1
        limit = min(100, FALLBACK_SCAN - seen)
        try:
            page = ports.store.list(queue=pool, state=RunState.QUEUED, limit=limit, cursor=cursor)
        except BadRequest:  # a cursor of another release: start over
            page = ports.store.list(queue=pool, state=RunState.QUEUED, limit=limit)
        seen += len(page.runs)
        found = found or bool(page.runs)
        for run in page.runs:
            _fell_back(ports, run, now, report)
        cursor = page.next_cursor
        if cursor is None:
            break
    return cursor, found


def _backstop(ports: Ports, now: float, report: ReapReport) -> None:
    """Move on the queued runs whose time on their pool is up beyond the first in line, and those
    on a pool no longer configured: a bounded look at each pool's queued runs, each pass going on
    where the one before stopped (``FALLBACK_RECORD``)."""
    try:
        record = ports.pool_states.get(FALLBACK_RECORD)
    except (RunplaneError, ValidationError) as e:  # unreadable: every look starts over
        log.warning("where the reaper's look for runs due to move on stopped is unknown: %s", e)
        record = None
    marks = dict(record.resume) if record is not None else {}
    configured = [pool.name for pool in ports.pools.pools]
    after: dict[str, str] = {}
    for pool in configured + sorted(set(marks) - set(configured)):
        try:
            cursor, found = _look(ports, pool, marks.get(pool) or None, now, report)
        except RunplaneError as e:
            log.warning("could not look at the queued runs of pool %s: %s", pool, e)
            after[pool] = marks.get(pool, "")
            continue
        if pool in configured or cursor is not None or found:
            after[pool] = cursor or ""
    if record is not None and after != record.resume:
        try:
            ports.pool_states.save(record.model_copy(update={"resume": after}))
        except RunplaneError as e:  # another pass wrote first: the next goes on from where it stopped
            log.info("where the reaper's look stopped was not kept: %s", e)


def reap(ports: Ports, rehint_after: float | None = None) -> ReapReport:
    """One pass: re-queue (or end) runs whose lease expired, re-hint the first REHINT_WINDOW runs
    in each pool's line not hinted for ``rehint_after`` seconds (default: the stack's
    ``rehint_seconds``) -- moving those whose time on their pool is up to their next one instead
    (``fallback.fall_back``) --, move on the others due beyond the line's head, a bounded look a
    pool (``_backstop``), and release the quota holds of attempts that are over
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
    _backstop(ports, now, report)
    try:
        report.expired_sessions = sessions.expire(ports, asked)
    except RunplaneError as e:
        log.warning("could not expire sessions: %s", e)
    try:
        report.released = heal(ports, now)
    except RunplaneError as e:
        log.warning("could not release stale quota holds: %s", e)
    return report
