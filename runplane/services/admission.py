"""Admission: whether a run may start now under its owner's and its group's quotas.

A claim first reserves what the attempt will hold in the usage record of each user and group
with a quota (a conditional write on the record's version, so two workers claiming at once never
both take the last of a cap), and what it ends with is settled when the attempt ends.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from runplane.domain.asks import Resources
from runplane.domain.common import MAX_RUN_TIME
from runplane.domain.errors import ConditionFailed, NotAllowed, NotFound, RunplaneError
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.quotas import MAX_BLOCKED, Hold, Lane, Period, Quota, QuotaKind, UsageRecord, hold_key, quota_key
from runplane.domain.runs import Run
from runplane.domain.states import RunState
from runplane.ports import QuotaPorts, QuotaStore, RunPorts, RunStore

log = logging.getLogger(__name__)


def period_key(period: Period, now: float) -> str:
    """The calendar period (UTC) that ``now`` falls in: ``day:2026-11-23``, ``week:2026-W48``
    (ISO weeks), ``month:2026-11``."""
    t = time.gmtime(now)
    if period == "day":
        return f"day:{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
    if period == "week":
        year, week, _ = datetime.date(t.tm_year, t.tm_mon, t.tm_mday).isocalendar()
        return f"week:{year:04d}-W{week:02d}"
    return f"month:{t.tm_year:04d}-{t.tm_mon:02d}"


@dataclass(frozen=True)
class Use:
    """What a user or group holds now and has used this period."""

    running: int
    gpus: int
    cpus: float
    gpu_hours: float
    cpu_hours: float
    period: str


def use_of(record: UsageRecord, period: Period, now: float) -> Use:
    """``record`` seen in ``period`` at ``now``: what ended this period plus what the attempts
    under way have used so far (each at most what it reserved)."""
    current = period_key(period, now)
    settled_gpu = record.gpu_seconds if record.period == current else 0.0
    settled_cpu = record.cpu_seconds if record.period == current else 0.0
    gpu = sum(min(h.gpu_seconds, h.gpus * max(0.0, now - h.at)) for h in record.holds.values())
    cpu = sum(min(h.cpu_seconds, h.cpus * max(0.0, now - h.at)) for h in record.holds.values())
    return Use(
        running=record.running,
        gpus=record.gpus,
        cpus=record.cpus,
        gpu_hours=(settled_gpu + gpu) / 3600,
        cpu_hours=(settled_cpu + cpu) / 3600,
        period=current,
    )


CACHE_SECONDS = 4.0
"""How long a worker trusts a quota it has read: a changed quota applies everywhere within this."""
MAX_TRIES = 20
"""How often a usage record is read again after another writer's write got there first."""
HEAL_GRACE_SECONDS = 60.0
"""How old a hold must be before ``heal`` may release it: a claim follows its reserve within
milliseconds, so a hold this old whose run is not active at its attempt was left behind."""
_THIS = {"day": "today", "week": "this week", "month": "this month"}


class CachedQuotas:
    """A QuotaStore that remembers the quotas it read (and that there is none) for ``ttl``
    seconds, sparing a worker two reads per claim. Usage records are never cached: every
    reserve and release reads them consistently and writes them conditionally."""

    def __init__(
        self, inner: QuotaStore, ttl: float = CACHE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = inner
        self.ttl = ttl
        self.clock = clock
        self._hits: dict[str, tuple[float, Quota | None]] = {}
        self._lock = threading.Lock()

    def get(self, kind: QuotaKind, name: str) -> Quota | None:
        now = self.clock()
        key = quota_key(kind, name)
        with self._lock:
            hit = self._hits.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        quota = self.inner.get(kind, name)
        with self._lock:
            if len(self._hits) > 10000:
                self._hits.clear()
            self._hits[key] = (now, quota)
        return quota

    def _forget(self, kind: QuotaKind, name: str) -> None:
        with self._lock:
            self._hits.pop(quota_key(kind, name), None)

    def put(self, quota: Quota) -> None:
        self.inner.put(quota)
        self._forget(quota.kind, quota.name)

    def delete(self, kind: QuotaKind, name: str) -> bool:
        found = self.inner.delete(kind, name)
        self._forget(kind, name)
        return found

    def usage(self, kind: QuotaKind, name: str) -> UsageRecord:
        return self.inner.usage(kind, name)

    def save_usage(self, record: UsageRecord) -> UsageRecord:
        return self.inner.save_usage(record)

    def list_usage(self) -> list[UsageRecord]:
        return self.inner.list_usage()

    def lane(self, pool: str, user: str, priority: int) -> Lane:
        return self.inner.lane(pool, user, priority)

    def save_lane(self, lane: Lane) -> Lane:
        return self.inner.save_lane(lane)

    def list(self) -> list[Quota]:  # last: below it, ``list`` in an annotation is this method
        return self.inner.list()


def subjects(run: Run) -> list[tuple[QuotaKind, str]]:
    """Whose quotas a run counts against: its owner's, and its group's when it is charged to one."""
    return subjects_of(run.owner, run.group)


def subjects_of(owner: str, group: str | None) -> list[tuple[QuotaKind, str]]:
    found: list[tuple[QuotaKind, str]] = [("user", owner)]
    if group:
        found.append(("group", group))
    return found


def _hours(value: float) -> str:
    """Hours as messages show them: ``0.4``, ``200``, ``12.5``."""
    return f"{max(0.0, value):.1f}".removesuffix(".0")


def _worst_case(resources: Resources) -> tuple[float, float]:
    """The GPU- and CPU-seconds a run may hold: what it asks for, times its time limit."""
    seconds = resources.time if resources.time is not None else MAX_RUN_TIME
    return resources.gpus * seconds, resources.cpus * seconds


def refuse_alone(quotas: QuotaStore, owner: str, group: str | None, resources: Resources) -> None:
    """Raise InvalidRequest when a run asking for ``resources`` could never start under a quota
    of ``owner`` or ``group``, even with nothing else running: it would wait forever."""
    gpu_seconds, cpu_seconds = _worst_case(resources)
    for kind, name in subjects_of(owner, group):
        quota = quotas.get(kind, name)
        if quota is None:
            continue
        if quota.max_running == 0:
            raise NotAllowed(f"quota: {quota.label} allows no runs at once (max_running 0)")
        if quota.max_gpus is not None and resources.gpus > quota.max_gpus:
            raise NotAllowed(
                f"quota: {quota.label} allows at most {quota.max_gpus} GPUs at once; this run asks {resources.gpus}"
            )
        if quota.max_cpus is not None and resources.cpus > quota.max_cpus:
            raise NotAllowed(
                f"quota: {quota.label} allows at most {quota.max_cpus:g} CPUs at once; this run asks {resources.cpus:g}"
            )
        for what, limit, need in (("GPU", quota.gpu_hours, gpu_seconds), ("CPU", quota.cpu_hours, cpu_seconds)):
            if limit is not None and need > limit * 3600 + 1e-6:
                raise NotAllowed(
                    f"budget: {quota.label} has {_hours(limit)} {what}-hours a {quota.period}; "
                    f"this run may need {_hours(need / 3600)} (its {what}s times its time limit)"
                )


def _hold(run: Run, attempt: int, now: float) -> Hold:
    gpu_seconds, cpu_seconds = _worst_case(run.spec.resources)
    res = run.spec.resources
    return Hold(
        run_id=run.id,
        attempt=attempt,
        gpus=res.gpus,
        cpus=res.cpus,
        at=now,
        gpu_seconds=gpu_seconds,
        cpu_seconds=cpu_seconds,
    )


def _no_room(quota: Quota, record: UsageRecord, hold: Hold, now: float) -> str | None:
    """Why ``hold`` does not fit ``quota`` beside what ``record`` holds; None when it fits.

    A cap on GPUs (and a GPU budget) binds only runs that ask for GPUs, so a CPU-only run is
    never held back by GPUs others hold. A budget counts what ended this period, what the attempts
    under way may still use (all they reserved) and all this attempt may use.
    """
    if quota.max_running is not None and record.running + 1 > quota.max_running:
        return f"quota: {quota.label} runs {record.running} of at most {quota.max_running} run(s) at once"
    if quota.max_gpus is not None and hold.gpus and record.gpus + hold.gpus > quota.max_gpus:
        return f"quota: {quota.label} uses {record.gpus} of {quota.max_gpus} GPUs"
    if quota.max_cpus is not None and record.cpus + hold.cpus > quota.max_cpus + 1e-9:
        return f"quota: {quota.label} uses {record.cpus:g} of {quota.max_cpus:g} CPUs"
    current = period_key(quota.period, now)
    for what, limit, settled, reserved, need in (
        (
            "GPU",
            quota.gpu_hours,
            record.gpu_seconds,
            sum(h.gpu_seconds for h in record.holds.values()),
            hold.gpu_seconds,
        ),
        (
            "CPU",
            quota.cpu_hours,
            record.cpu_seconds,
            sum(h.cpu_seconds for h in record.holds.values()),
            hold.cpu_seconds,
        ),
    ):
        if limit is None or not need:
            continue
        used = (settled if record.period == current else 0.0) + reserved
        if used + need > limit * 3600 + 1e-6:
            return (
                f"budget: {quota.label} has {_hours(limit - used / 3600)} of {_hours(limit)} {what}-hours left "
                f"{_THIS[quota.period]}, this run may need {_hours(need / 3600)}"
            )
    return None


def _take(quotas: QuotaStore, quota: Quota, hold: Hold, now: float) -> tuple[str | None, bool]:
    """Write ``hold`` into the usage record of ``quota``'s subject if it fits; else record the
    run as waiting there. Returns why it does not fit (None: it does), and whether this call
    wrote the hold. Conditional on the record's version: a lost race is read again, so two claims
    never both take the last of a cap, and a release never misses a run that was added as waiting
    while it ran."""
    queued_attempt = hold.attempt - 1
    for _ in range(MAX_TRIES):
        record = quotas.usage(quota.kind, quota.name)
        if hold.key in record.holds:
            return None, False  # held already: by a worker that got the same hint
        reason = _no_room(quota, record, hold, now)
        updated = record.model_copy(deep=True)
        if reason is None:
            updated.holds[hold.key] = hold
            updated.blocked.pop(hold.run_id, None)
        elif updated.blocked.get(hold.run_id) == queued_attempt or len(updated.blocked) >= MAX_BLOCKED:
            return reason, False  # known as waiting here (or too many wait: the reaper re-hints it)
        else:
            updated.blocked[hold.run_id] = queued_attempt
        try:
            quotas.save_usage(updated)
        except ConditionFailed:
            continue
        return reason, reason is None
    raise ConditionFailed(f"the usage record of {quota.label} changed {MAX_TRIES} times while reserving; try again")


def reserve(quotas: QuotaStore, run: Run, attempt: int, now: float) -> str | None:
    """Before a worker claims ``run`` at claim-attempt ``attempt`` (its queued attempt + 1): hold
    what the attempt asks for in the usage record of each of its subjects with a quota.

    Returns None when every quota had room (the holds are written; ``release`` gives them back),
    or the reason it must wait: then no hold is kept, and the run is recorded as waiting in the
    record that had no room, so that the ``release`` that makes room returns it for a new hint.
    Raises what the store raises (holds taken meanwhile are given back first where possible).
    """
    hold = _hold(run, attempt, now)
    taken: list[tuple[QuotaKind, str]] = []
    try:
        for kind, name in subjects(run):
            quota = quotas.get(kind, name)
            if quota is None:
                continue
            reason, wrote = _take(quotas, quota, hold, now)
            if reason is not None:
                _give_back(quotas, taken, hold.key, now)
                return reason
            if wrote:  # only what this call took is given back: a hold found is another's
                taken.append((kind, name))
    except RunplaneError:
        _give_back(quotas, taken, hold.key, now, quiet=True)
        raise
    return None


def _give_back(
    quotas: QuotaStore, taken: list[tuple[QuotaKind, str]], key: str, now: float, quiet: bool = False
) -> None:
    """Release the hold ``key`` that a reserve that cannot go on took from the records of
    ``taken``. The runs waiting there stay: no room was made that they did not see. With
    ``quiet``, a failure is logged (``heal`` releases what is left) rather than raised."""
    for kind, name in taken:
        try:
            _release_from(quotas, kind, name, key, now, wake=False)
        except RunplaneError as e:
            if not quiet:
                raise
            log.warning("could not release hold %s of %s %s (released later): %s", key, kind, name, e)


def _settle(record: UsageRecord, hold: Hold, period: str, end: float) -> None:
    """Charge what ``hold`` used until ``end`` (at most what it reserved) to ``period`` of ``record``."""
    if record.period != period:
        record.period, record.gpu_seconds, record.cpu_seconds = period, 0.0, 0.0
    held = max(0.0, end - hold.at)
    record.gpu_seconds += min(hold.gpu_seconds, hold.gpus * held)
    record.cpu_seconds += min(hold.cpu_seconds, hold.cpus * held)


def _release_from(
    quotas: QuotaStore,
    kind: QuotaKind,
    name: str,
    key: str,
    now: float,
    end: float | None = None,
    wake: bool = True,
) -> dict[str, int]:
    """Remove hold ``key`` from the usage record of ``kind`` ``name``, settling its use up to
    ``end`` (default ``now``) into the period of ``now``; with ``wake``, return (and clear) the
    runs that wait there. Nothing is written, and nothing returned, when the hold is not there."""
    for _ in range(MAX_TRIES):
        record = quotas.usage(kind, name)
        hold = record.holds.get(key)
        if hold is None:
            return {}
        quota = quotas.get(kind, name)
        updated = record.model_copy(deep=True)
        del updated.holds[key]
        _settle(updated, hold, period_key(quota.period if quota else "month", now), now if end is None else end)
        waiting: dict[str, int] = {}
        if wake:
            waiting, updated.blocked = updated.blocked, {}
        try:
            quotas.save_usage(updated)
        except ConditionFailed:
            continue
        return waiting
    raise ConditionFailed(f"the usage record of {kind} {name} changed {MAX_TRIES} times while releasing; try again")


def release(quotas: QuotaStore, run: Run, attempt: int, now: float) -> dict[str, int]:
    """Give back what attempt ``attempt`` of ``run`` holds, settling what it used (its GPUs and
    CPUs times the time since it was reserved, at most what it reserved) into the current period.
    Idempotent. Returns the runs that waited for room in those records (run id -> the attempt
    they are queued at), now cleared there: the caller re-sends their hints. Every record is read,
    quota or not: a quota removed while its runs were under way leaves their holds to release."""
    blocked: dict[str, int] = {}
    for kind, name in subjects(run):
        blocked.update(_release_from(quotas, kind, name, hold_key(run.id, attempt), now))
    return blocked


def rehint(ports: RunPorts, blocked: dict[str, int], why: str = "quota freed") -> list[str]:
    """Re-send the hints of runs that waited for room (run id -> queued attempt), those still
    queued at that attempt; return their ids. A hint that cannot be sent is logged: the reaper
    re-sends hints of queued runs anyway."""
    sent: list[str] = []
    pools: set[str] = set()
    for run_id, attempt in blocked.items():
        try:
            run = ports.store.get(run_id)
            if run.state != RunState.QUEUED or run.attempt != attempt:
                continue
            ports.queue.send(run.queue, RunMessage(run_id=run.id, attempt=run.attempt))
        except NotFound:
            continue
        except RunplaneError as e:
            log.warning("could not re-hint run %s: %s", run_id, e)
            continue
        sent.append(run_id)
        pools.add(run.queue)
    for pool in sorted(pools):
        try:
            ports.queue.notify(DispatchEvent(pool=pool, reason=why))
        except RunplaneError as e:
            log.warning("could not nudge the dispatcher of pool %s: %s", pool, e)
    return sent


def heal(ports: QuotaPorts, now: float, grace: float = HEAL_GRACE_SECONDS) -> list[str]:
    """Release holds left behind: those older than ``grace`` whose run is not active at the
    hold's attempt (its worker died, or the reaper re-queued it, or its release failed). What
    waited for the room they held gets a new hint. Returns the released holds' keys."""
    released: list[str] = []
    for record in ports.quotas.list_usage():
        for key, hold in sorted(record.holds.items()):
            if now - hold.at <= grace:
                continue
            try:
                end = _left_behind(ports.store, hold, now)
                if end is None:
                    continue
                blocked = _release_from(ports.quotas, record.kind, record.name, key, now, end)
            except RunplaneError as e:
                log.warning("could not heal hold %s of %s: %s", key, record.key, e)
                continue
            log.info("released hold %s of %s: its run is no longer active at that attempt", key, record.key)
            released.append(key)
            rehint(ports, blocked)
    return released


def _left_behind(store: RunStore, hold: Hold, now: float) -> float | None:
    """None while ``hold``'s run is active at the hold's attempt; else until when it is charged:
    the run's end when it ended at that attempt, else ``now``."""
    try:
        run = store.get(hold.run_id)
    except NotFound:
        return now
    if run.attempt != hold.attempt:
        return now
    if run.state.active:
        return None
    if run.state.terminal and run.finished_at is not None:
        return min(now, run.finished_at)
    return now
