"""How long the dispatcher takes to decide, for 10,000 queued runs over 20 pools.

One decision pass is what ``dispatch_pool`` computes between its reads and its writes, for every
pool: the backlog per pool from the queued runs, the pool's record brought up to date with the
registered workers and the backend's jobs (``reconcile``), and the number to launch
(``plan_launches``). The inputs are built once in memory: 10,000 queued runs spread unevenly over
20 pools, 300 registered workers, 200 backend jobs (some never registered, some already ended),
and a record per pool with launched jobs in flight. The store and backend calls around it are
I/O, measured by the other benchmarks.

The baseline is the floor of any decision: one pass over the same 10,000 runs that only counts
them per pool (a ``collections.Counter``). RATIO is decision / baseline; the target that matters
is the absolute one, printed as RESULT (< 50 ms per pass).

    python bench/dispatch_decision.py [--n 50] [--runs 10000] [--pools 20]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from _common import median, ratio_line, table

from runplane.backend import BackendJob
from runplane.domain.pools import Pool
from runplane.domain.workers import PoolRecord, StartingJob, Worker
from runplane.services.dispatch import PoolFacts, plan_launches, reconcile

TARGET_MS = 50.0


def build(
    n_runs: int, n_pools: int, seed: int = 7
) -> tuple[list[Pool], list[str], list[Worker], list[BackendJob], dict[str, PoolRecord]]:
    rng = random.Random(seed)
    pools = [
        Pool.model_validate(
            {
                "name": f"pool{i:02d}",
                "cpus": 8,
                "gpus": i % 3,
                "memory": "32g",
                "slots": 1 + i % 4,
                "max_workers": 50,
                "min_workers": i % 2,
                "seconds_between_launches": 30 * (i % 3),
                "default_image": "x",
            }
        )
        for i in range(n_pools)
    ]
    weights = [1 / (i + 1) for i in range(n_pools)]  # a few busy pools, a long tail
    queued = rng.choices([p.name for p in pools], weights, k=n_runs)
    now = 10_000.0
    workers = []
    for i in range(300):
        pool = pools[i % n_pools]
        free = rng.randint(0, pool.slots)
        workers.append(
            Worker(id=f"w{i}", pool=pool.name, slots=pool.slots, free_slots=free, started_at=0, heartbeat_at=now - 5)
        )
    jobs = []
    for i in range(200):
        pool = pools[i % n_pools]
        state = "running" if i % 3 else "pending"
        worker_id = f"w{i}" if i < 150 else f"new{i}"  # the last 50 never registered
        jobs.append(BackendJob(f"j{i}", pool.name, state, worker_id, now - rng.randint(0, 2000)))
    records = {}
    for i, pool in enumerate(pools):
        starting = {f"s{i}-{k}": StartingJob(worker_id=f"fresh{i}-{k}", launched_at=now - 30 * k) for k in range(5)}
        records[pool.name] = PoolRecord(pool=pool.name, starting=starting, last_launch_at=now - 40, version=3)
    return pools, queued, workers, jobs, records


def decide(pools, queued, workers, jobs, records, now: float) -> int:
    backlog = Counter(queued)
    by_pool_workers: dict[str, list[Worker]] = {}
    for w in workers:
        by_pool_workers.setdefault(w.pool, []).append(w)
    by_pool_jobs: dict[str, list[BackendJob]] = {}
    for j in jobs:
        by_pool_jobs.setdefault(j.pool, []).append(j)
    launched = 0
    for pool in pools:
        pool_workers = by_pool_workers.get(pool.name, [])
        pool_jobs = by_pool_jobs.get(pool.name, [])
        registered = {w.id for w in pool_workers}
        out = reconcile(pool, records[pool.name], registered, pool_jobs, {}, now)
        alive_ids = {j.id for j in pool_jobs}
        facts = PoolFacts(
            backlog=backlog[pool.name],
            workers=pool_workers,
            jobs=[j for j in pool_jobs if j.id not in out.cancel],
            now=now,
            unlisted=len([k for k in out.record.starting if k not in alive_ids]),
            last_launch_at=out.record.last_launch_at,
        )
        launched += plan_launches(pool, facts).launch
    return launched


def baseline(queued) -> int:
    return len(Counter(queued))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--pools", type=int, default=20)
    args = parser.parse_args()
    pools, queued, workers, jobs, records = build(args.runs, args.pools)
    now = 10_000.0
    for _ in range(3):  # warm up
        decide(pools, queued, workers, jobs, records, now)
        baseline(queued)
    decisions, counts = [], []
    for i in range(args.n):
        order = [
            ("decide", lambda: decide(pools, queued, workers, jobs, records, now)),
            ("count", lambda: baseline(queued)),
        ]
        if i % 2:
            order.reverse()
        for name, fn in order:
            t0 = time.perf_counter()
            fn()
            (decisions if name == "decide" else counts).append(time.perf_counter() - t0)
    print(
        f"{args.runs} queued runs over {args.pools} pools, {len(workers)} workers, {len(jobs)} backend jobs; "
        f"{decide(pools, queued, workers, jobs, records, now)} workers to launch"
    )
    table(
        "one decision pass (all pools)",
        [("decision: backlog + reconcile + plan", decisions), ("baseline: count runs per pool", counts)],
    )
    print(ratio_line("dispatch_decision", median(decisions) / median(counts), 20.0))
    print(f"RESULT dispatch_decision: {median(decisions) * 1000:.2f} ms per pass (target < {TARGET_MS:g} ms)")


if __name__ == "__main__":
    main()
