"""Submits from many clients at once vs the bare store write and queue sends a submit performs.

The embedded local stack with a pool that allows no workers (as in ``submit_latency.py``, whose
``SubmitBench`` this reuses). ``--clients`` threads each hold one keep-alive HTTP/1.1 connection
to the local front and submit ``POST /v1/runs`` back to back until ``--total`` submits are
answered; the baseline is the same threads making the bare calls of a submit with boto3
(``PutItem`` of the same item + ``SendMessage`` to the pool queue + ``SendMessage`` to the events
queue), as many in all. The two alternate over ``--rounds`` rounds, the pool queue and the runs
table emptied before each (not timed). RATIO is the median API time over the median bare time.

With ``--dynamodb dynalite`` (the default) the tables are on a dynalite of the script's own, the
queues on moto's server: on moto's server alone both paths measure moto (about 10 ms of its CPU a
request on 2 cores), not the API.

    python bench/submit_throughput.py [--clients 16] [--total 400] [--rounds 3] [--dynamodb dynalite|moto]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import threading
import time

from _common import add_dynamodb_option, dev_stack, median, ratio_line, tables_on
from submit_latency import POOLS_YAML, SubmitBench

TARGET = 1.3
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")


def burst(clients: int, total: int, call: object) -> float:
    """``total`` calls of ``call(state)`` from ``clients`` threads; seconds until all returned."""
    left = [total]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        state: dict[str, object] = {}
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            try:
                call(state)  # type: ignore[operator]
            except BaseException as e:
                errors.append(e)
                return

    threads = [threading.Thread(target=work) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--total", type=int, default=400, help="submits per round (default 400)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of each path (default 3)")
    add_dynamodb_option(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stacks:
        stacks.enter_context(tables_on(args.dynamodb))
        stack = stacks.enter_context(dev_stack(POOLS_YAML, schedule_seconds=3600))
        bench = SubmitBench(stack.endpoint, stack.api_url)

        def api(state: dict[str, object]) -> None:
            conn = state.get("conn")
            if conn is None:
                conn = state["conn"] = http.client.HTTPConnection(bench.host, int(stack.api_url.split(":")[-1]), 30)
            assert isinstance(conn, http.client.HTTPConnection)
            conn.request("POST", "/v1/runs", body=bench.body, headers=bench.headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 201:
                raise RuntimeError(f"submit answered {resp.status}")

        def bare(state: dict[str, object]) -> None:
            bench.bare_calls()

        samples: dict[str, list[float]] = {"api": [], "bare": []}
        burst(args.clients, args.clients * 2, api)  # warm: connections, the handler's first calls
        burst(args.clients, args.clients * 2, bare)
        for i in range(args.rounds):
            for label, call in [("api", api), ("bare", bare)][:: 1 if i % 2 == 0 else -1]:
                bench.reset_state()
                samples[label].append(burst(args.clients, args.total, call))
                print(f"  round {i + 1}: {label} {samples[label][-1]:.2f}s", flush=True)

    a, b = median(samples["api"]), median(samples["bare"])
    print(f"\n{args.total} submits from {args.clients} clients at once (tables on {args.dynamodb})")
    print(f"  POST /v1/runs (keep-alive)                 {a:7.2f} s  {args.total / a:7.1f} submits/s")
    print(f"  bare PutItem + 2x SendMessage (boto3)      {b:7.2f} s  {args.total / b:7.1f} submits/s")
    print(ratio_line(f"submit_throughput ({args.clients} clients, API / bare calls)", a / b, TARGET))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
