"""The reaper: runs whose worker stopped renewing its lease go back to the queue (or fail),
and queued runs whose hint may have been lost get a fresh one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from runplane.domain.errors import ConditionFailed, RunplaneError
from runplane.domain.models import ACTIVE_STATES, PoolConfig, Run, RunMessage, RunState
from runplane.ports import Expect, RunQueue, RunStore
from runplane.services.lifecycle import requeue

log = logging.getLogger(__name__)


@dataclass
class ReapReport:
    requeued: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    rehinted: list[str] = field(default_factory=list)


def _runs(store: RunStore, queue: str, state: RunState) -> Iterator[Run]:
    cursor = None
    while True:
        page = store.list(queue=queue, state=state, limit=100, cursor=cursor)
        yield from page.runs
        if not page.next_cursor:
            return
        cursor = page.next_cursor


def reap(store: RunStore, queue: RunQueue, pools: PoolConfig, now: float, rehint_after: float) -> ReapReport:
    report = ReapReport()
    for pool in pools.pools:
        for state in sorted(ACTIVE_STATES):
            for run in _runs(store, pool.name, state):
                if run.lease_expires_at is None or run.lease_expires_at >= now:
                    continue
                why = f"worker {run.worker_id} stopped renewing its lease"
                expect = Expect(states=frozenset({run.state}), attempt=run.attempt, worker_id=run.worker_id)
                try:
                    updated = requeue(store, queue, run, now, why, expect=expect, charge=not run.on_preemptible)
                except ConditionFailed:
                    continue  # the worker came back or another reaper got there first
                except RunplaneError as e:
                    log.warning("could not reap run %s: %s", run.id, e)
                    continue
                (report.requeued if updated.state == RunState.QUEUED else report.ended).append(run.id)
        for run in _runs(store, pool.name, RunState.QUEUED):
            if run.hinted_at is not None and now - run.hinted_at < rehint_after:
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
    return report
