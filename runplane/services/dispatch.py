"""The worker manager: how many workers each pool needs, and launching them.

``plan_launches`` is pure: it sees the backlog, the registered workers and the backend's jobs
and returns a number. ``dispatch_pool`` gathers those facts and acts on them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from runplane.domain.errors import RunplaneError
from runplane.domain.models import Pool, RunState, Worker
from runplane.ports import BackendJob, ComputeBackend, RunStore, WorkerRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolFacts:
    backlog: int
    workers: Sequence[Worker]  # alive: heartbeat recent
    jobs: Sequence[BackendJob]  # alive in the backend: pending or running
    now: float


@dataclass(frozen=True)
class Decision:
    launch: int
    reason: str


def plan_launches(pool: Pool, facts: PoolFacts) -> Decision:
    """How many workers to start now.

    Covers the whole backlog at once (not one worker per cycle), counts workers that are
    starting but not yet registered as capacity, never exceeds ``max_workers``, keeps
    ``min_workers``, and waits ``seconds_between_launches`` after the newest launch.
    """
    registered = {w.id for w in facts.workers}
    starting = [j for j in facts.jobs if j.worker_id not in registered]
    free = sum(w.free_slots for w in facts.workers) + len(starting) * pool.slots
    shortfall = max(0, facts.backlog - free)
    need = math.ceil(shortfall / pool.slots)
    current = len(facts.jobs)
    below_min = max(0, pool.min_workers - current)
    room = max(0, pool.max_workers - current)
    launch = max(min(need, room), below_min)
    if launch == 0:
        if need > room:
            return Decision(0, f"pool {pool.name} at max_workers={pool.max_workers}")
        return Decision(0, "enough workers" if facts.backlog else "no backlog")
    newest = max((j.created_at for j in facts.jobs), default=None)
    if below_min == 0 and newest is not None and facts.now - newest < pool.seconds_between_launches:
        wait = pool.seconds_between_launches - (facts.now - newest)
        return Decision(0, f"pacing: next launch in {wait:.0f}s")
    return Decision(launch, f"backlog {facts.backlog}, free slots {free}, workers {current}")


def explain_wait(pool: Pool | None, workers: Sequence[Worker], queued_as: str | None) -> str:
    """Why a queued run is still waiting, in words, from the pool's live workers."""
    if pool is None:
        return "its pool is no longer configured; no worker will take it"
    free = sum(w.free_slots for w in workers)
    if free:
        why = f"{free} free slot(s) on {len(workers)} worker(s) of pool {pool.name}: it should start within seconds"
    elif pool.max_workers == 0 and not workers:
        why = f"pool {pool.name} has max_workers=0 and no worker is registered: start one with runplane-agent"
    elif len(workers) >= pool.max_workers:
        why = f"pool {pool.name} is at max_workers={pool.max_workers}, all busy: waiting for a free slot"
    else:
        why = (
            f"waiting for a worker: {len(workers)} of at most {pool.max_workers} worker(s) of pool {pool.name} "
            "up, more being started"
        )
    if queued_as and queued_as.startswith("re-queued"):
        return f"{queued_as}; {why}"
    return why


def alive_workers(registry: WorkerRegistry, pool: str, now: float, stale_after: float) -> list[Worker]:
    return [w for w in registry.list(pool) if now - w.heartbeat_at <= stale_after and w.status != "offline"]


def dispatch_pool(
    pool: Pool,
    store: RunStore,
    registry: WorkerRegistry,
    backend: ComputeBackend,
    agent_args: Sequence[str],
    now: float,
    stale_after: float,
) -> Decision:
    """Look at one pool and launch what it needs. Raises RunplaneError if the backend fails."""
    facts = PoolFacts(
        backlog=store.count(pool.name, RunState.QUEUED),
        workers=alive_workers(registry, pool.name, now, stale_after),
        jobs=[j for j in backend.list(pool) if j.alive],
        now=now,
    )
    decision = plan_launches(pool, facts)
    if decision.launch:
        log.info("pool %s: launching %d worker(s) (%s)", pool.name, decision.launch, decision.reason)
        try:
            backend.launch(pool, decision.launch, agent_args)
        except RunplaneError as e:
            log.error("pool %s: launch failed: %s", pool.name, e)
            raise
    return decision
