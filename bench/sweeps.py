"""Sweeps at scale on the embedded local stack (moto, the Lambda handler behind the HTTP front):
a 10,000-member sweep made in one call, its status read, and the whole of it killed; against the
same stack's single ``POST /v1/runs``, measured in the same rounds.

* create: ``POST /v1/sweeps`` of 10,000 members (``count``), and of a 100 x 100 grid; the time per
  member is set against one ``POST /v1/runs`` (RATIO per member: lower is better).
* status: ``GET /v1/sweeps/{id}`` of a 10,000-member sweep (one record read plus its open members).
* kill: ``POST /v1/sweeps/{id}/kill`` until the sweep reads finished.
* queue depth: messages on the pool's queue after a 10,000-member create (members are released in
  step with capacity: the pool allows no worker here, so a sweep keeps 2 out).

    python bench/sweeps.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import dev_stack, median, table

SIZE = 10_000
TARGET_CREATE = 10.0  # seconds for a 10,000-member sweep
TARGET_KILL = 60.0
POOLS_YAML = (
    "pools: [{name: default, backend: local, cpus: 2, memory: 4g, max_workers: 0, "
    "default_image: runplane/test-busybox:1}]\n"
)
RUN = {"command": "true", "name": "bench"}


def queued(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--singles", type=int, default=50, help="single submits per round")
    args = parser.parse_args()
    with dev_stack(POOLS_YAML) as stack:
        import boto3

        from runplane import bootstrap
        from runplane.adapters.aws.sqs import pool_queue_name
        from runplane.client import Client

        client = Client(stack.api_url, "bench")
        settings = bootstrap.stack().settings
        sqs = boto3.client("sqs", endpoint_url=stack.endpoint, region_name="us-east-1")
        pool_url = sqs.get_queue_url(QueueName=pool_queue_name(settings.prefix, "default"))["QueueUrl"]
        single: list[float] = []
        create: list[float] = []
        grid: list[float] = []
        status: list[float] = []
        kill: list[float] = []
        depth: list[int] = []
        values = list(range(100))
        for _ in range(args.rounds):
            for _ in range(args.singles):
                t0 = time.perf_counter()
                made = client.request("POST", "/v1/runs", RUN)
                single.append(time.perf_counter() - t0)
                client.request("POST", f"/v1/runs/{made['id']}/kill")
            before = queued(sqs, pool_url)
            t0 = time.perf_counter()
            sweep = client.request("POST", "/v1/sweeps", {"run": RUN, "count": SIZE})
            create.append(time.perf_counter() - t0)
            assert sweep["size"] == SIZE, sweep
            depth.append(queued(sqs, pool_url) - before)
            for _ in range(20):
                t0 = time.perf_counter()
                client.request("GET", f"/v1/sweeps/{sweep['id']}")
                status.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            client.request("POST", f"/v1/sweeps/{sweep['id']}/kill")
            while client.request("GET", f"/v1/sweeps/{sweep['id']}")["finished_at"] is None:
                time.sleep(0.05)
            kill.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            gridded = client.request("POST", "/v1/sweeps", {"run": RUN, "parameters": {"A": values, "B": values}})
            grid.append(time.perf_counter() - t0)
            client.request("POST", f"/v1/sweeps/{gridded['id']}/kill")
        table(
            f"sweeps of {SIZE} members vs single submits ({args.rounds} rounds)",
            [
                ("POST /v1/runs (one run)", single),
                (f"POST /v1/sweeps, count {SIZE}", create),
                ("POST /v1/sweeps, 100 x 100 grid", grid),
                (f"GET /v1/sweeps/{{id}} ({SIZE} members)", status),
                (f"kill {SIZE} members until finished", kill),
            ],
        )
        per_member = median(create) / SIZE
        print(f"\nper member: {per_member * 1e6:.1f} us; one POST /v1/runs: {median(single) * 1e3:.2f} ms")
        print(f"submits per second: sweep {SIZE / median(create):,.0f}, single runs {1 / median(single):,.0f}")
        print(f"messages a {SIZE}-member create put on the pool queue: {sorted(set(depth))}")
        print(f"RATIO sweep member / single submit: {per_member / median(single):.5f}x (lower is better)")
        print(f"{SIZE}-member create: {median(create):.2f} s (target <= {TARGET_CREATE:g} s)")
        print(f"{SIZE}-member kill: {median(kill):.2f} s (target <= {TARGET_KILL:g} s)")


if __name__ == "__main__":
    main()
