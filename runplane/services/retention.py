"""What a finished run leaves, kept only as long as its pool's retention says: the owner's pin
(``keep``), what a run's view shows of its dates (``shown``), and the sweep that deletes what is due
(``sweep``, once a reaper pass)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from runplane.domain.errors import BadRequest, ConditionFailed, Conflict, NotFound, RunplaneError
from runplane.domain.expect import Expect
from runplane.domain.retention import (
    LOGS,
    OUTPUTS,
    Retention,
    RunRetention,
    dates,
    kind_prefix,
    kind_prefixes,
    purge_due,
    run_prefix,
)
from runplane.domain.runs import Run
from runplane.domain.states import TERMINAL_STATES
from runplane.domain.tenancy import Principal
from runplane.domain.uploads import UPLOADS_PREFIX
from runplane.domain.versions import series
from runplane.domain.workers import PoolRecord
from runplane.ports import MAX_DELETE, ObjectInfo, Ports
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
"""What ``RESUME_RECORD`` holds for a pool and state whose ended runs are all dated."""
RESUME_RECORD = "@retention"
"""The pool-state record (no pool's name) where the sweep keeps where its walks stopped: a cursor a
pool and state over the ended runs, the retention each pool's runs were last dated under, and
where its look at the uploads stopped."""
INDEXED_SINCE = (0, 3)
"""The first release series whose writers file an ended run in the purge index."""
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
            # let go: its dates and what is gone stay, marked as looked at now, so that no store's
            # own expiry (DynamoDB's TTL counts from the later of its date and that look) comes
            # before the sweep's next pass over it
            changes: dict[str, object] = {"kept": True}
            if not keep:
                changes = {"kept": False}
                if run.retention is not None:
                    changes["retention"] = run.retention.model_copy(update={"checked_at": ports.clock()})
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
    out_of_time: Callable[[], bool] = lambda: False
    """Whether the host's invocation has too little time left to begin more (``sweep`` makes it)."""

    @property
    def late(self) -> bool:
        return self.out_of_time()


class _Marks:
    """Where the sweep's bounded walks stopped (``RESUME_RECORD``): read once a pass, written when
    they move. A record that cannot be read (a store's failure, a damaged record) reads as empty and
    is not written: the walks start over."""

    def __init__(self, ports: Ports) -> None:
        self.ports = ports
        self.record: PoolRecord | None
        try:
            self.record = ports.pool_states.get(RESUME_RECORD)
        except (RunplaneError, ValidationError) as e:
            log.warning("retention: where the last pass stopped is unknown; starting over: %s", e)
            self.record = None
        self.resume = dict(self.record.resume) if self.record is not None else {}

    def save(self) -> None:
        if self.record is None or self.resume == self.record.resume:
            return
        try:
            self.record = self.ports.pool_states.save(self.record.model_copy(update={"resume": dict(self.resume)}))
        except RunplaneError as e:  # another pass wrote first: the next goes on from where that one stopped
            log.info("retention: where this pass stopped was not saved: %s", e)
            self.record = None


def sweep(
    ports: Ports,
    *,
    runs: int = SWEEP_RUNS,
    objects: int = SWEEP_OBJECTS,
    uploads: int = SWEEP_UPLOADS,
    backfill: int = SWEEP_BACKFILL,
    out_of_time: Callable[[], bool] | None = None,
) -> RetentionReport:
    """One pass: the due runs of every pool whose retention deletes anything (at most ``runs`` of
    them, shared among those pools, each pass another pool first) are dated, and what is due of them
    is deleted (at most ``objects`` objects); then the uploads not used for the stack's ``uploads``
    retention (at most ``uploads`` looked at). The ended runs of a pool are walked a page at a time
    (``backfill`` read a pass) when they may be dated wrongly or not at all: its retention changed
    (each is dated afresh, which files it in the index or takes it out), or agents of a release
    before the index end its runs. An error on one run is logged and the others go on; what is left
    waits for the next pass, as does what is met once ``out_of_time()`` says the host's invocation has
    too little time left to begin more (``handlers.run_reaper``: under ``SWEEP_TIME_LEFT_MARGIN`` seconds)."""
    now = ports.clock()
    report = RetentionReport()
    budget = _Budget(runs, objects, out_of_time or (lambda: False))
    stack = ports.settings.kept()
    pools = [pool for pool in ports.pools.pools if deletes_runs(pool.kept(stack))]
    if pools:  # another pool first each minute, so that no pool takes the whole budget every pass
        first = int(now // 60) % len(pools)
        pools = pools[first:] + pools[:first]
    for index, pool in enumerate(pools):
        share = math.ceil(budget.runs / (len(pools) - index))
        try:
            due = ports.store.due(pool.name, now, limit=share) if share > 0 else []
        except RunplaneError as e:
            log.warning("retention: could not read pool %s's due runs: %s", pool.name, e)
            continue
        for run in due:
            if budget.runs <= 0 or budget.objects <= 0 or budget.late:
                break
            budget.runs -= 1
            try:
                _sweep_run(ports, run, now, budget, report)
            except NotFound:  # deleted meanwhile (another pass; an index that lags the record)
                continue
            except RunplaneError as e:
                log.warning("retention: run %s is tried again at the next pass: %s", run.id, e)
                report.failed.append(run.id)
    kept_for = stack.seconds("uploads")
    if budget.late or (budget.runs <= 0 and (kept_for is None or budget.objects <= 0)):
        return report
    marks = _Marks(ports)
    if budget.runs > 0:
        try:
            _backfill(ports, marks, now, min(backfill, budget.runs * 4), report)
        except RunplaneError as e:
            log.warning("retention: could not date the ended runs of a pool: %s", e)
        marks.save()
    if kept_for is not None and budget.objects > 0 and not budget.late:
        try:
            _sweep_uploads(ports, marks, now - kept_for, min(uploads, budget.objects), budget, report)
        except RunplaneError as e:
            log.warning("retention: could not sweep the uploads: %s", e)
    return report


def fingerprint(retention: Retention) -> str:
    """What of ``retention`` a run's dates follow from: its outputs, logs and record settings."""
    return "/".join("-" if (kept := retention.seconds(kind)) is None else repr(kept) for kind in RUN_KINDS)


def _backfill(ports: Ports, marks: _Marks, now: float, most: int, report: RetentionReport) -> None:
    """Walk the ended runs of the pools (newest first, a cursor a pool and state kept in ``marks``),
    reading at most ``most`` of them, and date those whose dates are not what the pool's retention
    now gives: undated ones (where it deletes anything), and dated ones it would date otherwise.
    A pool is walked when its retention differs from the one its last walk followed (or it deletes
    anything and none was followed yet), and over again while agents of a release before the purge
    index (which file nothing in it) serve it, and once more after the last one left. Every store
    derives the index from the record it writes, so a run dated is filed in it or taken out."""
    stack = ports.settings.kept()
    resume = marks.resume
    read = 0
    for pool in ports.pools.pools:
        retention = pool.kept(stack)
        deletes = deletes_runs(retention)
        mark, followed = f"retention:{pool.name}", fingerprint(retention)
        if resume.get(mark) != followed and (mark in resume or deletes):
            for state in TERMINAL_STATES:  # dated under other settings: every ended run again
                resume.pop(f"backfill:{pool.name}:{state}", None)
                resume.pop(f"backfill:{pool.name}:{state}:again", None)
            resume[mark] = followed
        elif mark not in resume:
            continue  # never deleted anything: nothing of it to date
        old: bool | None = None  # whether agents before the index serve the pool, read once
        for state in sorted(TERMINAL_STATES):
            key = f"backfill:{pool.name}:{state}"
            if resume.get(key) == BACKFILLED:
                if not deletes:
                    continue
                old = _old_agents(ports, pool.name) if old is None else old
                if not old:
                    continue
                del resume[key]  # runs they ended since are not in the index: from the newest again
            while read < most:
                page = ports.store.list(
                    queue=pool.name, state=state, limit=min(100, most - read), cursor=resume.get(key)
                )
                read += max(len(page.runs), 1)
                for run in page.runs:
                    _date(ports, run, retention, deletes, now, report)
                if page.next_cursor is not None:
                    resume[key] = page.next_cursor
                    continue
                resume.pop(key, None)
                old = _old_agents(ports, pool.name) if old is None and deletes else old
                if old:  # over again, from the newest, while they serve the pool
                    resume[f"{key}:again"] = "1"
                elif resume.pop(f"{key}:again", None) is None:
                    resume[key] = BACKFILLED
                break  # (the last round, after the last of them left, starts at the next pass)


def _date(ports: Ports, run: Run, retention: Retention, deletes: bool, now: float, report: RetentionReport) -> None:
    """Date an ended ``run`` the backfill read, when its dates are not what ``retention`` gives."""
    if run.kept or not run.state.terminal or (run.retention is None and not deletes):
        return
    fresh = _fresh(run, retention, now)
    if fresh is None:
        return
    try:
        ports.store.update(run, ENDED, {"retention": fresh})
    except (ConditionFailed, NotFound):
        return  # changed or gone meanwhile: whoever wrote it filed it
    report.dated.append(run.id)


def _fresh(run: Run, retention: Retention, now: float) -> RunRetention | None:
    """The dates ``retention`` gives ``run`` (what is deleted already stays so); None when it has
    those already."""
    ended = run.finished_at if run.finished_at is not None else run.created_at
    fresh = dates(ended, retention, now)
    checked = run.retention
    if checked is None:
        return fresh
    pairs = zip(*((r.outputs_at, r.logs_at, r.record_at) for r in (checked, fresh)), strict=True)
    if all(a == b or (a is not None and b is not None and abs(a - b) < 0.001) for a, b in pairs):
        return None  # (within what a store's number may round)
    return fresh.model_copy(update={"deleted": checked.deleted})


def _old_agents(ports: Ports, pool: str) -> bool:
    """Whether agents of a release before the purge index (or of none they name) serve ``pool``, as
    its record counted them last; a record that cannot be read: as if they did."""
    try:
        versions = ports.pool_states.get(pool).agent_versions
    except (RunplaneError, ValidationError) as e:
        log.info("retention: pool %s's agents are unknown: %s", pool, e)
        return True
    return any(count > 0 and ((found := series(v)) is None or found < INDEXED_SINCE) for v, count in versions.items())


def _sweep_run(ports: Ports, run: Run, now: float, budget: _Budget, report: RetentionReport) -> None:
    """Date ``run`` when the sweep has not yet, or its pool's retention now dates it otherwise, then
    delete what is due of it while it is still due and not kept, as read right before each batch (an
    index may lag the record; the owner may pin it meanwhile)."""
    store = ports.store
    run = store.get(run.id)
    if not _due(run, now):
        return
    fresh = _fresh(run, retention_of(ports, run.queue), now)
    if fresh is not None:
        run = store.update(run, ENDED, {"retention": fresh})
        report.dated.append(run.id)
    while _due(run, now) and run.retention is not None:
        checked = run.retention
        if checked.record_at is not None and checked.record_at <= now:
            gone: set[str] = set()
            latest = _delete_under(ports, run, run_prefix(run.id), now, budget, report, gone)
            if latest is not None:
                if ports.sessions is not None:  # an ended run's sessions (their commands) go with it
                    ports.sessions.forget(run.id)
                try:
                    store.delete(run.id, now)
                except NotFound:  # gone meanwhile
                    return
                except ConditionFailed:  # kept, or dated afresh, meanwhile
                    pass
                else:
                    report.records.append(run.id)
                    return
            _note_gone(ports, run.id, gone, now)
            return
        kind = next(
            (
                kind
                for kind, at in ((OUTPUTS, checked.outputs_at), (LOGS, checked.logs_at))
                if at is not None and at <= now and kind not in checked.deleted
            ),
            None,
        )
        if kind is None:
            return
        latest = _delete_kind(ports, run, kind, now, budget, report)
        if latest is None or latest.retention is None:
            return
        deleted = (
            [*latest.retention.deleted, kind] if kind not in latest.retention.deleted else latest.retention.deleted
        )
        run = store.update(latest, ENDED, {"retention": latest.retention.model_copy(update={"deleted": deleted})})
        (report.outputs if kind == OUTPUTS else report.logs).append(run.id)


def _note_gone(ports: Ports, run_id: str, gone: set[str], now: float) -> None:
    """Say in a run whose purge stopped (its owner pinned it meanwhile) which of its outputs and logs
    went (wholly or in part); nothing while it is due still (the next pass goes on). Best effort."""
    if not gone:
        return
    try:
        run = ports.store.get(run_id)
        if _due(run, now) or run.retention is None or gone <= set(run.retention.deleted):
            return
        deleted = [*run.retention.deleted, *sorted(gone - set(run.retention.deleted))]
        ports.store.update(run, ENDED, {"retention": run.retention.model_copy(update={"deleted": deleted})})
    except RunplaneError as e:
        log.warning("retention: run %s lost objects that its record does not say: %s", run_id, e)


def _due(run: Run, now: float) -> bool:
    due = purge_due(run)
    return due is not None and due <= now


def _delete_kind(ports: Ports, run: Run, kind: str, now: float, budget: _Budget, report: RetentionReport) -> Run | None:
    """``_delete_under`` each prefix of ``kind`` (``kind_prefixes``: the outputs' with the checkpoints)."""
    latest: Run | None = run
    for prefix in kind_prefixes(run.id, kind):
        latest = _delete_under(ports, run, prefix, now, budget, report)
        if latest is None:
            return None
    return latest


def _delete_under(
    ports: Ports,
    run: Run,
    prefix: str,
    now: float,
    budget: _Budget,
    report: RetentionReport,
    gone: set[str] | None = None,
) -> Run | None:
    """Delete ``run``'s objects under ``prefix`` within the budget, reading the run again before each
    batch and stopping once it is no longer due (kept, or dated afresh); the run as last read when none
    is left, else None. ``gone`` collects which of its outputs and logs lost objects."""
    cursor: str | None = None
    while budget.objects > 0 and not budget.late:
        found, cursor = ports.objects.list_page(prefix, cursor, min(MAX_DELETE, budget.objects))
        if found:
            run = ports.store.get(run.id)
            if not _due(run, now):
                return None
            ports.objects.delete([info.key for info in found])
            budget.objects -= len(found)
            report.objects += len(found)
            if gone is not None:
                gone.update(k for k in (OUTPUTS, LOGS) if any(i.key.startswith(kind_prefix(run.id, k)) for i in found))
        if cursor is None:
            return run
    return None


def _unused(info: ObjectInfo | None, before: float) -> bool:
    return info is not None and info.modified is not None and info.modified < before


def _sweep_uploads(
    ports: Ports, marks: _Marks, before: float, most: int, budget: _Budget, report: RetentionReport
) -> None:
    """Delete the uploads last used (written or touched) before ``before``, looking at ``most`` of
    them from where the previous pass stopped (kept in ``marks``, a page at a time), round and round."""
    start = marks.resume.get("uploads")
    cursor = start
    looked = pages = 0
    while looked < most and pages < math.ceil(most / MAX_DELETE) + 2:  # a store may answer an empty page
        if budget.late:
            break
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
            marks.resume.pop("uploads", None)
        else:
            marks.resume["uploads"] = cursor
        marks.save()
        if cursor is None:
            break
