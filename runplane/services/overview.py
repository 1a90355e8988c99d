"""What the API shows beyond a stored record: why a queued run waits, a run's logs and outputs,
each pool's figures, and a page of workers. Read only; a record that adds a courtesy (a pool's
dispatcher record) never makes a read fail when it cannot be read."""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass, field

from runplane.domain import errors
from runplane.domain.common import RUN_ID_PATTERN
from runplane.domain.pools import Pool
from runplane.domain.retention import Retention
from runplane.domain.runs import Run
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.domain.workers import PoolRecord, Worker
from runplane.ports import Ports
from runplane.services import dependencies, fallback, runs, skew, sweeps
from runplane.services.dispatch import FIGURES_STALE_SECONDS, explain_wait, fresh
from runplane.services.logs import (
    LogPage,
    OutputsPage,
    Stream,
    asked_attempt,
    attempt_over,
    read_logs,
    read_outputs,
)

log = logging.getLogger(__name__)

WORKER_CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,344}$"
"""What a workers ``next_cursor`` looks like (base64url of a worker id, unpadded)."""


@dataclass(frozen=True)
class PoolFigures:
    """One pool as the pools view shows it."""

    pool: Pool
    backlog: int
    workers: dict[str, int]
    """Live workers by status (idle, busy, starting, draining)."""
    record: PoolRecord
    stack_retention: Retention = field(default_factory=Retention)
    """The stack's retention, which the pool's is over."""


def pool_record(ports: Ports, pool: str) -> PoolRecord | None:
    """The dispatcher's record of ``pool``; None if unreadable."""
    try:
        return ports.pool_states.get(pool)
    except errors.RunplaneError as e:
        log.warning("pool record of %s unreadable: %s", pool, e)
        return None


def why_waiting(ports: Ports, run: Run) -> str | None:
    """Why ``run`` has not started, in words (None: it is not queued)."""
    if run.state != RunState.QUEUED:
        return None
    if run.waiting_on:
        return dependencies.describe(ports, run)
    known, now = ports.workers.list(run.queue), ports.clock()
    workers = fresh(known, now, ports.settings.worker_stale_seconds)
    pool = ports.pools.get(run.queue)
    record = pool_record(ports, pool.name) if pool is not None else None
    why = explain_wait(pool, [*workers, *skew.refused_lately(known, workers, now)], run.waiting_reason, record, run)
    return why + fallback.when_words(run, now)  # and when it moves on to its next pool


def sweep_members(
    ports: Ports,
    principal: Principal,
    sweep_id: str,
    state: RunState | None,
    label: str | None,
    limit: int,
    cursor: str | None,
    *,
    owner: str | None = None,
    queue: str | None = None,
) -> tuple[list[Run], str | None]:
    """The members of the caller's sweep released so far (of ``state``, carrying ``label``, of
    ``owner`` and in ``queue`` when given: none when the sweep's are others), in index order, and
    the cursor after them. Raises NotFound (no such sweep, another user's, or an id that cannot be
    one), BadRequest (a cursor no listing gave) and, for ``owner``, as ``runs.check_listing_owner``."""
    if not re.fullmatch(RUN_ID_PATTERN, sweep_id):
        raise errors.NotFound(f"sweep {sweep_id[:80]!r} not found")
    if owner is not None:
        owner = runs.check_listing_owner(principal, owner)
    sweep = sweeps.get_sweep(ports, principal, sweep_id)
    if (owner is not None and owner != sweep.owner) or (queue is not None and queue != sweep.queue):
        return [], None
    found, after = sweeps.members(ports, sweep, state, limit, cursor)
    return runs.labelled(found, runs.label_filter(label)), after


def run_logs(
    ports: Ports, principal: Principal, run_id: str, stream: Stream, offset: int, attempt: int | None
) -> LogPage:
    """A page of the caller's run's ``stream`` of ``attempt`` (None: the latest) from ``offset``.
    Raises NotFound (no such run, or another user's) and InvalidRequest (an attempt it has not had)."""
    run = runs.get_run(ports, principal, run_id)
    return read_logs(ports.objects, run, stream, offset, attempt=asked_attempt(run, attempt))


def run_outputs(
    ports: Ports, principal: Principal, run_id: str, cursor: str | None, limit: int, attempt: int | None
) -> tuple[OutputsPage, bool]:
    """A page of the output files of the caller's run's ``attempt`` (None: the latest), and whether
    that attempt is over. Raises as ``run_logs`` does, and BadRequest for a cursor no listing gave."""
    run = runs.get_run(ports, principal, run_id)
    attempt = asked_attempt(run, attempt)
    return read_outputs(ports.objects, run, cursor, limit, attempt=attempt), attempt_over(run, attempt)


def live_counts(workers: list[Worker], record: PoolRecord) -> dict[str, int]:
    """A pool's live workers by status, counting launched ones not registered yet as starting."""
    counts = {"idle": 0, "busy": 0, "starting": 0, "draining": 0}
    for worker in workers:
        if worker.status in counts:
            counts[worker.status] += 1
    counts["starting"] += record.starting_among({w.id for w in workers})
    return counts


def pool_figures(ports: Ports) -> list[PoolFigures]:
    """Each pool's backlog and workers as its dispatcher last counted them (one read per pool,
    whatever the number of runs and workers); a pool no pass has counted, or none lately (its
    dispatcher failing, say), is counted here."""
    out, stack = [], ports.settings.kept()
    for pool in ports.pools.pools:
        record = pool_record(ports, pool.name) or PoolRecord(pool=pool.name)
        counted = record.counted_at is not None and ports.clock() - record.counted_at <= FIGURES_STALE_SECONDS
        if counted and record.backlog is not None:
            out.append(PoolFigures(pool, record.backlog, dict(record.workers), record, stack))
            continue
        known, now = ports.workers.list(pool.name), ports.clock()
        workers = fresh(known, now, ports.settings.worker_stale_seconds)
        versions, refused = skew.census(known, workers, now)
        backlog = ports.store.count(pool.name, RunState.QUEUED)
        uncounted = record.model_copy(update={"counted_at": None, "agent_versions": versions, "refused": refused})
        out.append(PoolFigures(pool, backlog, live_counts(workers, record), uncounted, stack))
    return out


def workers_page(
    ports: Ports, principal: Principal, pool: str | None, limit: int, cursor: str | None
) -> tuple[list[Worker], str | None]:
    """A page of workers (of ``pool``) from where ``cursor`` left off, as ``principal`` may see
    them (``seen_worker``), and the next cursor. Raises BadRequest for a cursor that is not a
    ``next_cursor`` of this listing."""
    found, after = ports.workers.page(pool, limit, None if cursor is None else _worker_after(cursor))
    next_cursor = None if after is None else base64.urlsafe_b64encode(after.encode()).decode().rstrip("=")
    now, stale = ports.clock(), ports.settings.worker_stale_seconds
    return [seen_worker(w, now, stale, principal) for w in found], next_cursor


def seen_worker(worker: Worker, now: float, stale_after: float, viewer: Principal) -> Worker:
    """``worker`` as ``viewer`` may see it: offline when its last heartbeat is older than
    ``stale_after``, and the runs it holds only those of ``viewer``'s (an admin: all)."""
    changes: dict[str, object] = {}
    if not viewer.admin:
        owners = {r: o for r, o in worker.run_owners.items() if o == viewer.user}
        changes.update(run_owners=owners, runs=[r for r in worker.runs if r in owners])
    if now - worker.heartbeat_at > stale_after:
        changes["status"] = "offline"
    return worker.model_copy(update=changes)


def _worker_after(cursor: str) -> str:
    """The worker id a workers cursor carries (base64url, so any id travels in a query string)."""
    try:
        if not re.fullmatch(WORKER_CURSOR_PATTERN, cursor):
            raise ValueError(cursor)
        after = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not after or not after.isprintable():
            raise ValueError(after)
    except ValueError as e:
        raise errors.BadRequest("cursor must be the next_cursor of the previous page") from e
    return after
