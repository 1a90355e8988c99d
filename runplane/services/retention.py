"""What a finished run leaves, kept only as long as its pool's retention says: the owner's pin
(``keep``), what a run's view shows of its dates (``shown``), and the sweep that deletes what is due
(``sweep``, once a reaper pass)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from runplane.domain.errors import BadRequest, ConditionFailed, Conflict, NotFound, RunplaneError
from runplane.domain.pools import Pool
from runplane.domain.retention import (
    LOGS,
    OUTPUTS,
    Retention,
    RunRetention,
    dates,
    kind_prefix,
    purge_due,
    run_prefix,
)
from runplane.domain.runs import Run
from runplane.domain.states import TERMINAL_STATES
from runplane.domain.tenancy import Principal
from runplane.domain.uploads import UPLOADS_PREFIX
from runplane.domain.workers import PoolRecord
from runplane.ports import MAX_DELETE, Expect, ObjectInfo, Ports
from runplane.services.runs import get_run

log = logging.getLogger(__name__)

SWEEP_RUNS = 200
"""The most runs one pass of the sweep looks at; the others stay due for the next."""
SWEEP_OBJECTS = 20_000
"""The most objects one pass deletes; a run whose objects are not all gone stays due."""
SWEEP_UPLOADS = 5_000
"""The most uploads one pass looks at; the next pass goes on after the last one."""
SWEEP_BACKFILL = 500
"""The most ended runs one pass reads to date those ended before the stores indexed them."""
BACKFILLED = "-"
"""What ``RESUME_RECORD`` holds for a pool whose earlier runs are all dated."""
RESUME_RECORD = "@retention"
"""The pool-state record where the sweep keeps where its look at the uploads stopped (no pool's name)."""
TIME_LEFT_MARGIN = 15.0
"""Seconds a host's invocation keeps in hand: no run is begun with less left."""
ENDED = Expect(states=TERMINAL_STATES)
RUN_KINDS = ("outputs", "logs", "runs")

KEEP_TRIES = 5
"""How many times a pin is written again when the run changed under it."""


def keep(ports: Ports, principal: Principal, run_id: str, keep: bool) -> Run:
    """Pin (``keep``) or let go the caller's run (an admin: anyone's): while pinned, the retention
    sweep deletes nothing of it. A run that has not ended may be pinned: the pin holds once it ends.
    Raises NotFound (also for another user's run, and for one deleted meanwhile)."""
    run = get_run(ports, principal, run_id)
    for tries in range(1, KEEP_TRIES + 1):
        if run.kept == keep:
            return run
        try:
            # let go: dated afresh by the next pass (what is past its date goes then), so that no
            # store's own expiry counts from dates worked out before the pin
            changes = {"kept": True} if keep else {"kept": False, "retention": None}
            return ports.store.update(run, Expect(), changes)
        except ConditionFailed as e:  # a store that checks its own version: the run changed meanwhile
            if tries == KEEP_TRIES:
                raise Conflict(f"run {run_id} changed too often; try again") from None
            stored = e.details.get("run")
            run = stored if isinstance(stored, Run) else ports.store.get(run_id)
    return run


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


def deletes_runs(retention: Retention) -> bool:
    """Whether ``retention`` ever deletes anything of a run (its uploads' setting aside)."""
    return any(retention.seconds(kind) is not None for kind in RUN_KINDS)


@dataclass
class RetentionReport:
    """What one pass of the sweep did."""

    dated: list[str] = field(default_factory=list)
    """Runs whose dates it worked out and wrote."""
    outputs: list[str] = field(default_factory=list)
    """Runs whose outputs it deleted."""
    logs: list[str] = field(default_factory=list)
    """Runs whose logs it deleted."""
    records: list[str] = field(default_factory=list)
    """Runs it deleted, record and every object."""
    objects: int = 0
    """Objects deleted (a run's and uploads)."""
    uploads: int = 0
    """Uploads deleted: not used for the stack's ``uploads`` retention."""
    failed: list[str] = field(default_factory=list)
    """Runs an error stopped; they stay due and the next pass tries them again."""

    def __bool__(self) -> bool:
        return bool(self.dated or self.objects or self.records or self.failed)


@dataclass
class _Budget:
    runs: int
    objects: int


def sweep(
    ports: Ports,
    *,
    runs: int = SWEEP_RUNS,
    objects: int = SWEEP_OBJECTS,
    uploads: int = SWEEP_UPLOADS,
    backfill: int = SWEEP_BACKFILL,
    time_left: Callable[[], float] | None = None,
) -> RetentionReport:
    """One pass: the due runs of every pool whose retention deletes anything (at most ``runs`` of
    them, shared among those pools) are dated, and what is due of them is deleted (at most
    ``objects`` objects); then the uploads not used for the stack's ``uploads`` retention (at most
    ``uploads`` looked at). Runs that ended before the stores indexed them (an earlier release) are
    dated a page at a time (``backfill`` read a pass), which files them in the index. An error on
    one run is logged and the others go on; what is left waits for the next pass, as does what is
    met once ``time_left`` (seconds, the host's) is under ``TIME_LEFT_MARGIN``. Nothing is read when nothing is set."""
    now = ports.clock()
    report = RetentionReport()
    budget = _Budget(runs, objects)
    stack = ports.settings.kept()
    pools = [pool for pool in ports.pools.pools if deletes_runs(pool.kept(stack))]
    for index, pool in enumerate(pools):
        share = math.ceil(budget.runs / (len(pools) - index))
        try:
            due = ports.store.due(pool.name, now, limit=share) if share > 0 else []
        except RunplaneError as e:
            log.warning("retention: could not read pool %s's due runs: %s", pool.name, e)
            continue
        for run in due:
            if budget.runs <= 0 or budget.objects <= 0 or _late(time_left):
                break
            budget.runs -= 1
            try:
                _sweep_run(ports, run, now, budget, report)
            except NotFound:  # deleted meanwhile (another pass; an index that lags the record)
                continue
            except RunplaneError as e:
                log.warning("retention: run %s is tried again at the next pass: %s", run.id, e)
                report.failed.append(run.id)
    if budget.runs > 0 and pools and not _late(time_left):
        try:
            _backfill(ports, pools, now, min(backfill, budget.runs * 4), report)
        except RunplaneError as e:
            log.warning("retention: could not date runs that ended before the stores indexed them: %s", e)
    kept_for = stack.seconds("uploads")
    if kept_for is not None and budget.objects > 0 and not _late(time_left):
        try:
            _sweep_uploads(ports, now - kept_for, min(uploads, budget.objects), report)
        except RunplaneError as e:
            log.warning("retention: could not sweep the uploads: %s", e)
    return report


def _backfill(ports: Ports, pools: list[Pool], now: float, most: int, report: RetentionReport) -> None:
    """Date the ended runs of ``pools`` not dated yet, reading at most ``most`` of them, from where
    the previous pass stopped (kept in ``RESUME_RECORD``, one cursor a pool and state), until every
    pool's are done: a run that ended under a release before the purge index is not in it, and
    writing its dates files it there (every store derives the index from the record it writes)."""
    record = ports.pool_states.get(RESUME_RECORD)
    resume = dict(record.resume)
    read = 0
    for pool in pools:
        for state in sorted(TERMINAL_STATES):
            key = f"backfill:{pool.name}:{state}"
            while resume.get(key) != BACKFILLED and read < most:
                page = ports.store.list(
                    queue=pool.name, state=state, limit=min(100, most - read), cursor=resume.get(key)
                )
                read += max(len(page.runs), 1)
                for run in page.runs:
                    if run.retention is None and not run.kept and run.state.terminal:
                        ended = run.finished_at if run.finished_at is not None else run.created_at
                        try:
                            ports.store.update(
                                run, ENDED, {"retention": dates(ended, retention_of(ports, run.queue), now)}
                            )
                        except (ConditionFailed, NotFound):
                            continue  # changed or gone meanwhile: whoever wrote it filed it
                        report.dated.append(run.id)
                resume[key] = page.next_cursor or BACKFILLED
    if resume != record.resume:
        try:
            ports.pool_states.save(record.model_copy(update={"resume": resume}))
        except RunplaneError as e:  # another pass wrote first: this page is read again, harmlessly
            log.info("retention: where the dating of earlier runs stopped was not saved: %s", e)


def _late(time_left: Callable[[], float] | None) -> bool:
    return time_left is not None and time_left() < TIME_LEFT_MARGIN


def _sweep_run(ports: Ports, run: Run, now: float, budget: _Budget, report: RetentionReport) -> None:
    """Date ``run`` when the sweep has not yet (or its dates keep everything for good and a week has
    gone: the operator may have set a retention since), then delete what is due of it while it is
    still due and not kept, as read right before (an index may lag the record)."""
    store = ports.store
    run = store.get(run.id)
    if not _due(run, now):
        return
    if run.retention is None or _for_good(run.retention):
        ended = run.finished_at if run.finished_at is not None else run.created_at
        fresh = dates(ended, retention_of(ports, run.queue), now)
        if run.retention is not None:
            fresh = fresh.model_copy(update={"deleted": run.retention.deleted})
        run = store.update(run, ENDED, {"retention": fresh})
        report.dated.append(run.id)
    while _due(run, now) and run.retention is not None:
        checked = run.retention
        if checked.record_at is not None and checked.record_at <= now:
            if _delete_under(ports, run_prefix(run.id), budget, report):
                try:
                    store.delete(run.id, now)
                except (ConditionFailed, NotFound):  # kept, or gone, meanwhile
                    return
                report.records.append(run.id)
            return
        kind = next(
            (
                kind
                for kind, at in ((OUTPUTS, checked.outputs_at), (LOGS, checked.logs_at))
                if at is not None and at <= now and kind not in checked.deleted
            ),
            None,
        )
        if kind is None or not _delete_under(ports, kind_prefix(run.id, kind), budget, report):
            return
        run = store.update(run, ENDED, {"retention": checked.model_copy(update={"deleted": [*checked.deleted, kind]})})
        (report.outputs if kind == OUTPUTS else report.logs).append(run.id)


def _for_good(checked: RunRetention) -> bool:
    """Whether nothing is left for ``checked`` to delete: its dates keep the rest for good."""
    return checked.record_at is None and all(
        at is None or kind in checked.deleted for kind, at in ((OUTPUTS, checked.outputs_at), (LOGS, checked.logs_at))
    )


def _due(run: Run, now: float) -> bool:
    due = purge_due(run)
    return due is not None and due <= now


def _delete_under(ports: Ports, prefix: str, budget: _Budget, report: RetentionReport) -> bool:
    """Delete the objects under ``prefix`` within the budget; whether none is left."""
    cursor: str | None = None
    while budget.objects > 0:
        found, cursor = ports.objects.list_page(prefix, cursor, min(MAX_DELETE, budget.objects))
        if found:
            ports.objects.delete([info.key for info in found])
            budget.objects -= len(found)
            report.objects += len(found)
        if cursor is None:
            return True
    return False


def _unused(info: ObjectInfo | None, before: float) -> bool:
    return info is not None and info.modified is not None and info.modified < before


def _sweep_uploads(ports: Ports, before: float, most: int, report: RetentionReport) -> None:
    """Delete the uploads last used (written or touched) before ``before``, looking at ``most`` of
    them from where the previous pass stopped (kept in ``RESUME_RECORD``), round and round."""
    try:
        record: PoolRecord | None = ports.pool_states.get(RESUME_RECORD)
    except RunplaneError as e:  # unreadable: from the start
        log.warning("retention: where the last look at the uploads stopped is unknown: %s", e)
        record = None
    start = record.resume.get("uploads") if record is not None else None
    cursor = start
    looked = pages = 0
    while looked < most and pages < math.ceil(most / MAX_DELETE) + 2:  # a store may answer an empty page
        pages += 1
        try:
            found, cursor = ports.objects.list_page(UPLOADS_PREFIX, cursor, min(MAX_DELETE, most - looked))
        except BadRequest as e:
            if cursor != start:
                raise
            log.warning("retention: the uploads' cursor is not valid; starting over: %s", e)
            found, cursor = ports.objects.list_page(UPLOADS_PREFIX, None, min(MAX_DELETE, most - looked))
        looked += len(found)
        old = [info.key for info in found if _unused(info, before)]
        old = [key for key in old if _unused(ports.objects.head(key), before)]  # a submit may have just used it
        if old:
            ports.objects.delete(old)
            report.uploads += len(old)
            report.objects += len(old)
        if cursor is None:
            break
    if record is not None and record.resume.get("uploads") != cursor:
        resume = {k: v for k, v in record.resume.items() if k != "uploads"} | ({"uploads": cursor} if cursor else {})
        try:
            ports.pool_states.save(record.model_copy(update={"resume": resume}))
        except RunplaneError as e:  # another pass wrote first: the next goes on from where that one stopped
            log.info("retention: where the look at the uploads stopped was not saved: %s", e)
