"""The worker manager: how many workers each pool needs, and launching them.

``plan_launches`` and ``reconcile`` are pure: they see the backlog, the registered workers, the
backend's jobs and the pool's record, and return numbers and a new record. ``dispatch_pool``
gathers those facts, claims the launch with a conditional write on the pool's record (so two
dispatchers never both launch), and acts.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from runplane.backend import BackendJob
from runplane.domain.errors import ConditionFailed, RunplaneError
from runplane.domain.pools import Pool
from runplane.domain.runs import Run
from runplane.domain.states import RunState
from runplane.domain.workers import PoolRecord, StartingJob, Worker, refuses
from runplane.ports import Ports
from runplane.services import skew

log = logging.getLogger(__name__)

CLAIM_SECONDS = 120.0
"""How long a launch claim keeps other dispatchers off a pool (a crashed claimer frees it then)."""
LIST_GRACE_SECONDS = 60.0
"""Engines may list a job a little after accepting it; until then a missing job is not a failure."""
FIGURES_REFRESH_SECONDS = 50.0
"""A pass rewrites the record's backlog and worker counts when they changed, or when they are
older than this though unchanged (under the one-minute schedule, so ``counted_at`` stays recent)."""
FIGURES_STALE_SECONDS = 180.0
"""Figures older than this are not shown as the pool's: the pools view counts for itself then."""
POOL_CALLS = 21
"""The most store calls one ``dispatch_pool`` makes: the pool's record, its workers, its backlog
and the record's write a try (3 tries), and up to 5 writes and 4 reads to record a launch."""


@dataclass(frozen=True)
class PoolFacts:
    backlog: int
    workers: Sequence[Worker]  # alive: heartbeat recent
    jobs: Sequence[BackendJob]  # alive in the backend: pending or running
    now: float
    unlisted: int = 0  # launched, not registered, not yet listed by the backend
    last_launch_at: float | None = None
    disabled: str | None = None  # why the pool is disabled
    retry_at: float | None = None  # when a disabled pool may try one launch


@dataclass(frozen=True)
class PoolFigures:
    """What one dispatcher pass saw of a pool and did (its metrics: ``runplane.metrics``)."""

    backlog: int
    workers: Mapping[str, int] = field(default_factory=dict)
    """Workers by status: starting (launched, not registered yet), idle, busy, draining, offline."""
    launched: int = 0
    launch_failed: bool = False


@dataclass(frozen=True)
class Decision:
    launch: int
    reason: str
    figures: PoolFigures | None = None
    """Set by a pass that looked at the pool (not by one that left it to another dispatcher)."""


def plan_launches(pool: Pool, facts: PoolFacts) -> Decision:
    """How many workers to start now.

    Covers the whole backlog at once (not one worker per cycle), counts workers that are
    starting but not yet registered as capacity, never exceeds ``max_workers`` (nor
    ``max_launches_per_cycle``), keeps ``min_workers``, and waits ``seconds_between_launches``
    after the newest launch. A disabled pool launches nothing until its retry time, then one.
    """
    registered = {w.id for w in facts.workers}
    starting = len([j for j in facts.jobs if j.worker_id not in registered]) + facts.unlisted
    # a group's own or tag-exclusive workers do not take just any run: their free slots are no
    # room for the backlog (the workers the dispatcher launches have neither)
    free = sum(w.free_slots for w in facts.workers if w.group is None and not w.tag_exclusive)
    free += starting * pool.slots
    shortfall = max(0, facts.backlog - free)
    need = math.ceil(shortfall / pool.slots)
    current = len(facts.jobs) + facts.unlisted
    below_min = max(0, pool.min_workers - current)
    room = max(0, pool.max_workers - current)
    launch = max(min(need, room), below_min)
    if pool.max_launches_per_cycle is not None:
        launch = min(launch, pool.max_launches_per_cycle)
    if launch == 0:
        if need > room:
            return Decision(0, f"pool {pool.name} at max_workers={pool.max_workers}")
        if facts.backlog and starting:
            return Decision(0, f"waiting for a worker: {starting} starting in pool {pool.name}")
        return Decision(0, "enough workers" if facts.backlog else "no backlog")
    if facts.disabled is not None:
        if starting:
            return Decision(0, f"pool {pool.name} is disabled ({facts.disabled}); waiting for its trial worker")
        if facts.retry_at is not None and facts.now < facts.retry_at:
            return Decision(
                0, f"pool {pool.name} is disabled ({facts.disabled}); next try in {facts.retry_at - facts.now:.0f}s"
            )
        return Decision(1, f"pool {pool.name} is disabled; trying one launch ({facts.disabled})")
    newest = max((j.created_at for j in facts.jobs), default=None)
    if facts.last_launch_at is not None:
        newest = max(newest or 0.0, facts.last_launch_at)
    if below_min == 0 and newest is not None and facts.now - newest < pool.seconds_between_launches:
        wait = pool.seconds_between_launches - (facts.now - newest)
        return Decision(0, f"pacing: next launch in {wait:.0f}s")
    return Decision(launch, f"backlog {facts.backlog}, free slots {free}, workers {current}")


@dataclass(frozen=True)
class Reconciled:
    record: PoolRecord
    cancel: list[str] = field(default_factory=list)


def count_failures(pool: Pool, record: PoolRecord, reasons: Sequence[str], now: float) -> None:
    """Add failed launches to ``record``; disable the pool once too many came in a row."""
    if not reasons:
        return
    record.failed_launches += len(reasons)
    record.consecutive_failures += len(reasons)
    record.last_error = reasons[-1]
    record.last_error_at = now
    if record.disabled_reason is not None:
        record.disabled_at = now  # a failed retry: wait a full period again
    elif record.consecutive_failures >= pool.max_failed_launches:
        record.disabled_reason = f"{record.consecutive_failures} launches in a row failed; last: {record.last_error}"
        record.disabled_at = now


def reconcile(
    pool: Pool,
    record: PoolRecord,
    registered: set[str],
    jobs: Sequence[BackendJob],
    ended: Mapping[str, BackendJob | None],
    now: float,
    refused: Mapping[str, str] | None = None,
) -> Reconciled:
    """The record brought up to date with what the registry and the backend say.

    A launched worker whose agent registered is a success (it re-enables a disabled pool). One
    whose job ended or vanished first, or whose job has run for ``start_timeout_seconds`` (from
    the first pass that saw it running) without its agent registering, is a failed launch; the latter is cancelled. So
    is one whose agent registered refused by the version window (``refused``: worker id -> why): the
    pool's image holds an agent this stack does not allow, and launching more of it would not end. Jobs
    the record did not launch are never cancelled. ``ended`` holds the
    backend's ``describe`` of launched jobs that ``list`` no longer shows.
    """
    rec = record.model_copy(deep=True)
    alive = {j.id for j in jobs}
    failures: list[str] = []
    succeeded = 0
    for job_id, started in list(rec.starting.items()):
        if started.worker_id in registered:
            del rec.starting[job_id]
            why = (refused or {}).get(started.worker_id)
            if why:
                failures.append(f"the agent of worker {started.worker_id} (job {job_id}) was refused: {why}")
            else:
                succeeded += 1
            continue
        if job_id in alive or job_id not in ended:
            continue
        seen = ended[job_id]
        if seen is None:
            if now - started.launched_at < LIST_GRACE_SECONDS:
                continue
            failures.append(f"job {job_id} of worker {started.worker_id} vanished before its agent registered")
        elif seen.alive:
            continue
        else:
            why = seen.detail.get("reason")
            failures.append(
                f"job {job_id} of worker {started.worker_id} {seen.state} before its agent registered"
                + (f": {why}" if why else "")
            )
        del rec.starting[job_id]
    cancel = []
    for job in jobs:
        # Only jobs this pool's record launched: a job it does not know may belong to another
        # stack sharing the cluster or queue, and is never cancelled from here.
        if job.worker_id in registered or job.state != "running" or job.id not in rec.starting:
            continue
        started = rec.starting[job.id]
        if started.running_since is None:  # a job may wait long in the engine's queue: time from now on
            started.running_since = now
        if now - started.running_since > pool.start_timeout_seconds:
            cancel.append(job.id)
            rec.starting.pop(job.id, None)
            failures.append(
                f"the agent of worker {job.worker_id} did not register within "
                f"{pool.start_timeout_seconds:g}s of its job starting; job {job.id} cancelled"
            )
    if succeeded:
        rec.consecutive_failures = 0
        if rec.disabled_reason is not None:
            log.info("pool %s: a worker registered; enabled again", pool.name)
        rec.disabled_reason = None
        rec.disabled_at = None
    count_failures(pool, rec, failures, now)
    return Reconciled(rec, cancel)


def explain_wait(
    pool: Pool | None,
    workers: Sequence[Worker],
    queued_as: str | None,
    record: PoolRecord | None = None,
    run: Run | None = None,
) -> str:
    """Why a queued run is still waiting, in words, from the pool's live workers and record
    (and, given the run, which of those workers would take it: tags, groups and networks). A
    worker that found no room under a quota or budget said so in ``queued_as``: that is the
    reason, however many workers are free. Workers whose agent the version window refuses
    (``skew.refusal``; ``workers`` may hold those refused lately at registration too) take
    nothing: when no other worker would take the run, their refusal is the reason; nor do workers
    whose agent does not know a field the run's spec holds (``skew.understood``)."""
    if pool is None:
        return "its pool is no longer configured; no worker will take it"
    if queued_as and queued_as.startswith(("quota:", "budget:")):
        return queued_as
    held, workers = skew.takers(pool.name, workers, run)
    if held:
        return held
    if run is not None:
        takers = [w for w in workers if w.refuses(run) is None]
        if not takers and run.spec.tag and not any(w.tag == run.spec.tag for w in workers):
            return (
                f"no live worker of pool {pool.name} takes tag {run.spec.tag}: "
                f"start one with runplane-agent --pool {pool.name} --tag {run.spec.tag}"
            )
        if not takers and workers:
            closest = [w for w in workers if w.tag == run.spec.tag] or list(workers)
            # workers that would take it but for its network: say why they give runs none
            netless = [w for w in closest if refuses(w.tag, w.tag_exclusive, w.group, run) is None]
            if run.spec.network and netless:
                return (
                    f"no live worker of pool {pool.name} takes runs that ask for a network: "
                    f"{netless[0].network_refused}"
                )
            return f"no live worker of pool {pool.name} takes this run: {closest[0].refuses(run)}"
        workers = takers
    registered = {w.id for w in workers}
    starting = record.starting_among(registered) if record else 0
    if room := _room(pool.name, workers):
        why = room
    elif record is not None and record.disabled_reason is not None:
        why = f"pool {pool.name} is disabled: {record.disabled_reason}"
    elif pool.max_workers == 0 and not workers:
        why = f"pool {pool.name} has max_workers=0 and no worker is registered: start one with runplane-agent"
    elif starting:
        why = f"waiting for a worker: {starting} starting in pool {pool.name}"
    elif len(workers) >= pool.max_workers:
        why = f"pool {pool.name} is at max_workers={pool.max_workers}, all busy: waiting for a free slot"
    else:
        why = (
            f"waiting for a worker: {len(workers)} of at most {pool.max_workers} worker(s) of pool {pool.name} "
            "up, more being started"
        )
        if record is not None and record.last_error:
            why += f" (last launch error: {record.last_error})"
    if queued_as and queued_as.startswith("re-queued"):
        return f"{queued_as}; {why}"
    return why


def _room(pool: str, workers: Sequence[Worker]) -> str | None:
    """The free slots of ``workers``, or the image a new one pulls before it takes runs (its pool's
    ``prefetch_images``: worker_agent/prefetch.py), in words; None: neither."""
    free = sum(w.free_slots for w in workers if w.pulling is None)
    if free:
        return f"{free} free slot(s) on {len(workers)} worker(s) of pool {pool}: it should start within seconds"
    pulling = [w.pulling for w in workers if w.pulling is not None]
    return pulling[0].describe() if pulling else None


def alive_workers(ports: Ports, pool: str) -> list[Worker]:
    """The workers of ``pool`` heard from within the stack's ``worker_stale_seconds``."""
    return fresh(ports.workers.list(pool), ports.clock(), ports.settings.worker_stale_seconds)


def fresh(workers: Sequence[Worker], now: float, stale_after: float) -> list[Worker]:
    return [w for w in workers if now - w.heartbeat_at <= stale_after and w.status != "offline"]


def _gist(reason: str | None) -> str:
    """A decision without its countdowns, so a pass that only waits longer writes nothing."""
    return re.sub(r"\d+s\b", "Ns", reason or "")


def dispatch_pool(ports: Ports, pool: Pool, *, tries: int = 3) -> Decision:
    """Look at one pool, bring its record up to date, and launch what it needs.

    Idempotent under duplicate events and concurrent invocations: the launch is claimed with a
    conditional write on the pool's record. A dispatcher that loses the write backs off, unless
    it meant to launch: then it reads the record again and decides anew (``tries`` passes in
    all), since the write it lost may have been another pass's recount, not a launch.
    Raises RunplaneError if the backend fails (the failure is counted on the record first).
    """
    return _dispatch(ports, pool, ports.clock(), tries)


def _dispatch(ports: Ports, pool: Pool, now: float, tries: int) -> Decision:
    backend = ports.backend(pool)
    stale_after = ports.settings.worker_stale_seconds
    record = ports.pool_states.get(pool.name)
    if record.launching_since is not None and now - record.launching_since < CLAIM_SECONDS:
        return Decision(0, f"another dispatcher is launching workers for pool {pool.name}")
    known = ports.workers.list(pool.name)
    registered = {w.id for w in known}
    jobs = [j for j in backend.list(pool) if j.alive]
    alive_ids = {j.id for j in jobs}
    ended = {
        job_id: backend.describe(pool, job_id)
        for job_id, started in record.starting.items()
        if job_id not in alive_ids and started.worker_id not in registered
    }
    refused = {w.id: why for w in known if (why := skew.refusal(w))}
    reconciled = reconcile(pool, record, registered, jobs, ended, now, refused)
    rec = reconciled.record
    jobs = [j for j in jobs if j.id not in reconciled.cancel]
    facts = PoolFacts(
        backlog=ports.store.count(pool.name, RunState.QUEUED),
        workers=fresh(known, now, stale_after),
        jobs=jobs,
        now=now,
        unlisted=len([job_id for job_id in rec.starting if job_id not in alive_ids]),
        last_launch_at=rec.last_launch_at,
        disabled=rec.disabled_reason,
        retry_at=(rec.disabled_at + pool.retry_disabled_seconds) if rec.disabled_at is not None else None,
    )
    decision = plan_launches(pool, facts)
    figures = PoolFigures(facts.backlog, _by_status(known, facts.workers, len(rec.starting)), decision.launch)
    versions, refused = skew.census(known, facts.workers, now)
    recount = _recount(rec, figures, now) or (rec.agent_versions, rec.refused) != (versions, refused)
    changed = recount or rec != record or decision.launch > 0 or _gist(decision.reason) != _gist(record.last_decision)
    rec.last_decision, rec.decided_at = decision.reason, now
    if changed:  # a write carries the figures it saw, so the pools view never shows older ones than the decision
        rec.backlog, rec.workers, rec.counted_at = figures.backlog, _nonzero(figures.workers), now
        rec.agent_versions, rec.refused = versions, refused
    if decision.launch:
        rec.launching_since = rec.last_launch_at = now
    if changed:
        try:
            rec = ports.pool_states.save(rec)
        except ConditionFailed:
            if decision.launch and tries > 1:  # perhaps only a pass that recounted: look again
                return _dispatch(ports, pool, now, tries - 1)
            return Decision(0, f"another dispatcher is handling pool {pool.name}")
    for job_id in reconciled.cancel:
        log.warning("pool %s: cancelling job %s: its agent never registered", pool.name, job_id)
        try:
            backend.cancel(pool, job_id)
        except RunplaneError as e:
            log.error("pool %s: cancel of job %s failed: %s", pool.name, job_id, e)
    if decision.launch:
        try:
            _launch(ports, pool, rec, decision, now)
        except RunplaneError as e:
            launched = len(e.details.get("jobs") or [])
            e.details["figures"] = dataclasses.replace(figures, launched=launched, launch_failed=True)
            raise
    return dataclasses.replace(decision, figures=figures)


def _recount(record: PoolRecord, figures: PoolFigures, now: float) -> bool:
    """Whether the record's backlog and worker counts need rewriting: they changed, or were
    counted more than ``FIGURES_REFRESH_SECONDS`` ago."""
    if record.counted_at is None or now - record.counted_at >= FIGURES_REFRESH_SECONDS:
        return True
    return (record.backlog, record.workers) != (figures.backlog, _nonzero(figures.workers))


def _nonzero(counts: Mapping[str, int]) -> dict[str, int]:
    return {status: n for status, n in sorted(counts.items()) if n}


def _by_status(known: Sequence[Worker], alive: Sequence[Worker], starting: int) -> dict[str, int]:
    """Workers by status: registered and fresh by their own word, stale ones offline, and the
    launched jobs not registered yet starting."""
    counts: collections.Counter[str] = collections.Counter(str(w.status) for w in alive)
    counts["offline"] += len(known) - len(alive)
    counts["starting"] += starting
    return dict(counts)


def _launch(ports: Ports, pool: Pool, claimed: PoolRecord, decision: Decision, now: float) -> None:
    log.info("pool %s: launching %d worker(s) (%s)", pool.name, decision.launch, decision.reason)
    error: RunplaneError | None = None
    try:
        launched = ports.backend(pool).launch(pool, decision.launch, ports.agent_args(pool))
    except RunplaneError as e:
        error = e
        launched = list(e.details.get("jobs") or [])
        log.error("pool %s: launch failed: %s", pool.name, e)
    record = claimed
    for _ in range(5):
        after = record.model_copy(deep=True)
        if after.launching_since == claimed.launching_since:  # never clear a later dispatcher's claim
            after.launching_since = None
        after.launched += len(launched)
        for job in launched:
            after.starting[job.id] = StartingJob(worker_id=job.worker_id, launched_at=now)
        if launched and after.counted_at is not None:
            after.workers["starting"] = after.workers.get("starting", 0) + len(launched)
        if error is not None:  # one refused call is one failure, however many workers it asked for
            count_failures(pool, after, [f"launch failed: {error.message}"], now)
        try:
            ports.pool_states.save(after)
            break
        except ConditionFailed:  # the claim ran out and someone else wrote: add ours to theirs
            record = ports.pool_states.get(pool.name)
    else:
        log.error("pool %s: could not record %d launched job(s)", pool.name, len(launched))
    if error is not None:
        raise error
