"""Reads that must not grow with the store, on the embedded local stack (moto, the Lambda handler
behind the HTTP front): each read is timed on a store holding a few runs and workers, then again
after 10,000 runs (of many users and states) and 200 workers (of several pools) were added, in the
same run. RATIO large / small per read: a read whose cost grew with the store shows it.

* ``GET /v1/runs``: the caller's newest page (50), and of one state;
* ``GET /v1/runs/{id}`` of a queued run (its waiting reason reads its pool's workers and record:
  it grows with that pool's workers, 50 here, and with no other);
* ``GET /v1/pools`` (the dispatcher's last count of each pool: one read a pool);
* ``GET /v1/workers`` (a page of 100) and ``GET /v1/workers?pool=default`` (a pool's, one page).

    python bench/listing.py [--rounds 30] [--runs 10000] [--workers 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _common import dev_stack, median, table

TARGET_PAGE = 0.100  # seconds, on moto
POOLS_YAML = "pools:\n" + "".join(
    f"  - {{name: {name}, backend: local, cpus: 2, memory: 4g, max_workers: 0, "
    "default_image: runplane/test-busybox:1}\n"
    for name in ("default", "gpu", "big", "small")
)
STATES = ["succeeded", "failed", "killed", "queued"]


def timed(call: Callable[[], Any], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


def fill(store: Any, workers: Any, runs: int, n_workers: int, now: float, tag: str) -> None:
    """``runs`` runs of 20 users (a quarter the bench user's) in four states (a quarter queued),
    and ``n_workers`` workers over the four pools, written straight to the store."""
    from runplane.domain.runs import Failure, Run, RunSpec
    from runplane.domain.states import FailureReason, RunState
    from runplane.domain.workers import Worker

    def one(i: int) -> None:
        state = RunState(STATES[i % len(STATES)])
        failure = Failure(reason=FailureReason.NONZERO_EXIT, message="exit 1") if state == RunState.FAILED else None
        owner = "bench" if i % 4 == 0 else f"user{i % 20}"
        store.create(
            Run(
                id=f"r-{tag}{i:08d}",
                owner=owner,
                spec=RunSpec(command="true", queue="default"),
                queue=("default", "gpu", "big", "small")[i % 4],
                state=state,
                created_at=now - runs + i,
                finished_at=None if state == RunState.QUEUED else now - runs + i + 1,
                failure=failure,
                hinted_at=now + 1e9,  # the reaper's re-hints of the queued ones are not what is measured here
            )
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(runs)))
    for i in range(n_workers):
        pool_name = ("default", "gpu", "big", "small")[i % 4]
        workers.put(Worker(id=f"w-{tag}{i:04d}", pool=pool_name, started_at=now, heartbeat_at=now))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=200)
    args = parser.parse_args()
    with dev_stack(POOLS_YAML) as stack:
        from runplane import bootstrap
        from runplane.client import Client

        client = Client(stack.api_url, "bench")
        store, registry = bootstrap.stack().store, bootstrap.stack().workers
        fill(store, registry, 40, 4, time.time(), "small")  # the small store
        queued = client.request("POST", "/v1/runs", {"command": "true"})["id"]
        reads: dict[str, Callable[[], Any]] = {
            "GET /v1/runs (newest 50)": lambda: client.request("GET", "/v1/runs", query={"limit": 50}),
            "GET /v1/runs?state=failed": lambda: client.request("GET", "/v1/runs", query={"state": "failed"}),
            "GET /v1/runs/{id} (queued)": lambda: client.request("GET", f"/v1/runs/{queued}"),
            "GET /v1/pools": lambda: client.request("GET", "/v1/pools"),
            "GET /v1/workers (a page)": lambda: client.request("GET", "/v1/workers"),
            "GET /v1/workers?pool=default": lambda: client.request("GET", "/v1/workers", query={"pool": "default"}),
        }
        for call in reads.values():
            call()  # warm
        small = {label: timed(call, args.rounds) for label, call in reads.items()}
        t0 = time.perf_counter()
        fill(store, registry, args.runs, args.workers, time.time(), "large")
        print(f"filled {args.runs} runs and {args.workers} workers in {time.perf_counter() - t0:.1f} s")
        large = {label: timed(call, args.rounds) for label, call in reads.items()}
        table(f"small store ({args.rounds} rounds)", list(small.items()))
        table(f"{args.runs} runs, {args.workers} workers ({args.rounds} rounds)", list(large.items()))
        print()
        for label in reads:
            ratio = median(large[label]) / median(small[label])
            verdict = "ok" if median(large[label]) <= TARGET_PAGE else "over"
            print(
                f"RATIO {label} large/small: {ratio:.2f}x; {median(large[label]) * 1e3:.1f} ms "
                f"(target <= {TARGET_PAGE * 1e3:.0f} ms: {verdict})"
            )


if __name__ == "__main__":
    main()
