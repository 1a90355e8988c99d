"""Admission with a long line: the decision an agent makes for one free slot with 10,000 queued
runs, and what quotas and fair tags add to a submit.

Everything is on 127.0.0.1: moto in this process (the embedded local stack, its pool allowing no
workers) and, for the admission decision, a dynalite of the script's own.

1. The admission decision. Two more stacks, each with its own tables on dynalite and its queues
   and bucket on moto (``RUNPLANE_DYNAMODB_ENDPOINT_URL``, as the dynalite tests run): one whose
   pool holds 10,000 queued runs of 100 users, one whose pool holds 100. moto's DynamoDB answers a
   Query by reading and sorting every item of the table (at 2,000 queued runs a Query of 8 took
   0.3 s here), so the cost of a line's length would be moto's; dynalite, like DynamoDB, reads the
   index's key range in order. ``--dynamodb moto`` keeps them on moto all the same. Every user
   and their group have a quota with room to spare. A worker agent (``worker_agent.agent.Agent``,
   unchanged) gets the hint of a queued run picked at random and its intake takes it: it reads
   the run, the head of the pool's line (``store.head(pool, PICK_WINDOW)``), re-reads the first
   run ahead that it can take, and reserves that run's room under its owner's and group's quotas.
   Left out: the claim (a conditional write, replaced by a stand-in that returns the run as it
   is), the hint's release back to the queue, and the container start. After each decision, not
   timed, the agent gives the cores and the quota holds back (``QuotaHolds.release``), so every decision
   sees the same line and the same usage records. The store calls it makes are also timed one by
   one, with a bare boto3 ``Query`` of 8 items on the rank index for reference.

   RESULT is the median decision with 10,000 queued (target < 20 ms); RATIO the median with
   10,000 over the median with 100 (target <= 1.5: the decision must not grow with the line).

2. Submit with quotas on and off: ``functions.aws.api.lambda_handler`` in-process with an API
   Gateway v2 event, as submit_latency.py calls it, for a user who has a quota and whose group has
   one (the quota checks, then the fair tag: a head query, a lane read and a lane write), and for
   a user with none set (the same reads find nothing; the fair tag is the same). A stack always
   has its quota store (every service reads it from ``Ports``), so "off" is a user and group
   without quotas. The order rotates each round; the runs table and the pool queue are emptied
   every 20 rounds (not timed).

   RATIO submit_quotas_on_vs_off is quotas on / no quotas set (target <= 1.2).

How the line is filled: the runs are built as ``submit_run`` builds them (spec resolved with the
pool's defaults) with their fair tags computed by ``scheduling.lead`` from in-memory lanes, in
submit order, users interleaved at random over the last hour; written in the DynamoDB adapter's
own item format (``DynamoRunStore._item``, rank included) with BatchWriteItem, 25 a request. The
users' lanes are stored as well.

    python bench/admission.py [--n 100] [--runs 10000] [--users 100] [--small 100] [--submits 50]
                              [--dynamodb dynalite|moto]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import dev_stack, dynalite, median, p90, ratio_line, table

POOLS_YAML = (
    "pools: [{name: default, backend: local, cpus: 2, memory: 4g, max_workers: 0, "
    "default_image: runplane/test-busybox:1}]\n"
)
POOL = "default"
GROUP = "team"
SPEC = {"command": "sh -c true", "name": "bench"}
TARGET_MS = 20.0
TARGET_GROWTH = 1.5
TARGET_SUBMIT = 1.2
RESET_EVERY = 20  # submit rounds between emptying the pool queue and the runs table (not timed)


def roomy_quota(kind: str, name: str, now: float) -> Any:
    """A quota every limit of which applies, none of which a benchmark reaches."""
    from runplane.domain.quotas import Quota

    return Quota.model_validate(
        {
            "kind": kind,
            "name": name,
            "max_running": 100_000,
            "max_gpus": 1000,
            "max_cpus": 100_000,
            "gpu_hours": 1e8,
            "cpu_hours": 1e8,
            "updated_at": now,
        }
    )


# -- 1. the admission decision ---------------------------------------------------------------


def queued_runs(pool: Any, n_runs: int, n_users: int, now: float, seed: int) -> tuple[list[Any], list[Any]]:
    """``n_runs`` queued runs of ``n_users`` users (round robin, shuffled) submitted over the last
    hour, each with the fair tag ``submit_run`` would give it with nothing started meanwhile, and
    the users' lanes as those submits leave them."""
    from runplane.domain.quotas import Lane
    from runplane.domain.runs import Event, Run, RunSpec
    from runplane.domain.states import RunState
    from runplane.services import scheduling
    from runplane.services.runs import _request_hash, run_id_for

    rng = random.Random(seed)
    owners = [f"user{i % n_users:03d}" for i in range(n_runs)]
    rng.shuffle(owners)
    spec = RunSpec.model_validate(SPEC)
    resolved = spec.model_copy(
        update={"image": pool.default_image, "queue": pool.name, "resources": pool.with_defaults(spec.resources)}
    )
    request_hash = _request_hash(spec)
    lanes: dict[str, Lane] = {}
    first: float | None = None  # the head's tag (V): the smallest queued, as nothing starts
    runs = []
    for k, owner in enumerate(owners):
        at = now - 3600 + 3600 * k / n_runs
        virtual = first if first is not None else 0.0
        lane = lanes.get(owner, Lane(pool=pool.name, user=owner, priority=resolved.priority))
        tag = virtual + scheduling.lead(lane, virtual, at, pool.fair_share_half_life)
        lanes[owner] = lane.model_copy(
            update={"tag": tag + 1, "lead": tag + 1 - virtual, "at": at, "version": lane.version + 1}
        )
        first = tag if first is None else min(first, tag)
        runs.append(
            Run(
                id=run_id_for(owner, None, b""),
                owner=owner,
                owner_groups=[GROUP],
                group=GROUP,
                spec=resolved,
                queue=pool.name,
                created_at=at,
                request_hash=request_hash,
                fair_tag=tag,
                hinted_at=at,
                waiting_reason=f"waiting for a worker of pool {pool.name}",
                events=[Event(at=at, state=RunState.QUEUED, message=f"submitted to pool {pool.name}")],
            )
        )
    return runs, list(lanes.values())


class Line:
    """A stack of its own (tables, queues, bucket under ``prefix``) on the local moto server,
    its pool's line filled with ``n_runs`` queued runs, quotas for every user and the group, and
    an agent whose claim and container start are stand-ins."""

    def __init__(
        self, prefix: str, n_runs: int, n_users: int, work_dir: Path, seed: int, dynamodb: str | None = None
    ) -> None:
        from runplane import bootstrap
        from runplane.adapters.aws.provision import provision
        from runplane.services.admission import CachedQuotas
        from worker_agent.agent import Agent
        from worker_agent.intake import Intake
        from worker_agent.run_config import AgentConfig, AgentPorts

        names = ("runs_table", "workers_table", "tokens_table", "pools_table", "quotas_table", "bucket")
        settings = bootstrap.stack().settings.model_copy(update={"prefix": prefix, **dict.fromkeys(names, "")})
        if dynamodb:  # the tables on a DynamoDB server of their own; the queues and bucket stay on moto
            settings = settings.model_copy(update={"dynamodb_endpoint_url": dynamodb})
        clients = bootstrap.aws_clients(settings)
        self.names = bootstrap.aws_names(settings)
        self.ddb = clients["dynamodb"]
        self.stack = stack = bootstrap.build_stack(settings, clients)
        provision(self.names, [p.name for p in stack.pools.pools], clients["dynamodb"], clients["sqs"], clients["s3"])
        now = time.time()
        t0 = time.perf_counter()
        self.runs, lanes = queued_runs(stack.pools.get(POOL), n_runs, n_users, now, seed)
        t1 = time.perf_counter()
        self.fill(self.runs)
        t2 = time.perf_counter()
        for lane in lanes:
            stack.quotas.save_lane(lane.model_copy(update={"version": 0}))
        users = sorted({run.owner for run in self.runs})
        for user in users:
            stack.quotas.put(roomy_quota("user", user, now))
        stack.quotas.put(roomy_quota("group", GROUP, now))
        print(
            f"{prefix}: {n_runs} queued runs of {len(users)} users built in {t1 - t0:.1f}s, written in "
            f"{t2 - t1:.1f}s; {len(lanes)} lanes and {len(users) + 1} quotas in {time.perf_counter() - t2:.1f}s"
        )
        self.agent = Agent(
            AgentConfig(pool=POOL, worker_id=f"bench-{prefix}", work_dir=work_dir / prefix),
            AgentPorts(stack.store, Hints(), stack.objects, CachedQuotas(stack.quotas)),
            stack.workers,
            None,  # no Docker: nothing here reaches the engine
            time.time,
        )
        intake = self.agent.intake
        self.agent.intake = decision_intake(Intake)(
            intake.config, intake.ports, intake.slots, intake.holds, intake.clock, intake.launch, intake.network_refused
        )
        self.rng = random.Random(seed)

    def fill(self, runs: list[Any]) -> None:
        """BatchWriteItem of the adapter's own items, 25 a request, until none is left unprocessed."""
        items = [self.stack.store._item(run) for run in runs]  # type: ignore[attr-defined]
        for start in range(0, len(items), 25):
            request = {self.names.runs_table: [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]}
            while request:
                request = self.ddb.batch_write_item(RequestItems=request).get("UnprocessedItems") or {}

    def decide(self) -> tuple[float, Any]:
        """One ``Intake.take`` on the hint of a random queued run; returns its time and the run it took.
        Then, not timed, the cores and the quota holds go back."""
        from runplane.domain.messages import RunMessage
        from runplane.ports import Delivery

        hinted = self.rng.choice(self.runs)
        delivery = Delivery(RunMessage(run_id=hinted.id, attempt=hinted.attempt), receipt="bench")
        agent = self.agent
        agent.intake.taken = None
        t = time.perf_counter()
        agent.intake.take(delivery)
        elapsed = time.perf_counter() - t
        taken = agent.intake.taken
        assert taken is not None, "the agent took no run"
        agent.slots.allocator.release(taken.id)
        agent.holds.release(taken, taken.attempt + 1)
        return elapsed, taken


def decision_intake(base: type) -> type:
    class DecisionIntake(base):  # type: ignore[misc,valid-type]
        """The agent's intake as it is, but its claim only notes the run and nothing starts."""

        taken: Any = None

        def claim(self, run: Any, allocation: Any) -> Any:
            self.taken = run
            return run

        def _start(self, claimed: Any, allocation: Any, received: float) -> None:
            pass

    return DecisionIntake


class Hints:
    """The pool queue as the decision sees it: the hint it holds goes back or away, not timed."""

    def release(self, queue: str, delivery: Any, delay_seconds: int) -> None:
        pass

    def delete(self, queue: str, delivery: Any) -> None:
        pass

    def send(self, queue: str, message: Any) -> None:
        pass  # the fresh hint of a run passed over: a queue write outside the decision


def admission_rounds(big: Line, small: Line, warmup: int, n: int) -> dict[str, list[float]]:
    from runplane.adapters.aws.dynamodb import BY_RANK
    from runplane.services import admission
    from worker_agent.intake import PICK_WINDOW

    samples: dict[str, list[float]] = {}
    head_run = big.stack.store.head(POOL, 1)[0]
    query = {
        "TableName": big.names.runs_table,
        "IndexName": BY_RANK,
        "KeyConditionExpression": "qs = :k",
        "ExpressionAttributeValues": {":k": {"S": f"{POOL}#queued"}},
        "Limit": PICK_WINDOW,
    }

    def timed(label: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            t = time.perf_counter()
            fn()
            samples.setdefault(label, []).append(time.perf_counter() - t)

        return call

    def reserve() -> None:
        now = time.time()
        t = time.perf_counter()
        reason = admission.reserve(big.agent.ports.quotas, head_run, head_run.attempt + 1, now)
        samples.setdefault("reserve", []).append(time.perf_counter() - t)
        assert reason is None, reason
        admission.release(big.agent.ports.quotas, head_run, head_run.attempt + 1, now)

    paths: list[Callable[[], None]] = [
        lambda: samples.setdefault("decision 10k", []).append(big.decide()[0]),
        lambda: samples.setdefault("decision 100", []).append(small.decide()[0]),
        timed("head", lambda: big.stack.store.head(POOL, PICK_WINDOW)),
        timed("get", lambda: big.stack.store.get(head_run.id)),
        reserve,
        timed("bare query", lambda: big.ddb.query(**query)),
    ]
    for i in range(warmup + n):
        if i == warmup:
            samples.clear()
        for path in paths[i % len(paths) :] + paths[: i % len(paths)]:
            path()
    return samples


# -- 2. submit with quotas on and off ----------------------------------------------------------


class SubmitPaths:
    def __init__(self) -> None:
        from functions.aws import api
        from runplane import bootstrap
        from runplane.adapters.aws.sqs import pool_queue_name
        from runplane.devstack.lambda_shim import LambdaContext, http_event
        from runplane.services.auth import register_token

        self.api = api
        self.lambda_context = LambdaContext
        self.http_event = http_event
        self.stack = stack = bootstrap.stack()
        now = time.time()
        register_token(stack.tokens, "bench-quotas", "quser", groups=["qteam"])
        register_token(stack.tokens, "bench-none", "fuser", groups=["fteam"])
        stack.quotas.put(roomy_quota("user", "quser", now))
        stack.quotas.put(roomy_quota("group", "qteam", now))
        clients = bootstrap.aws_clients(stack.settings)
        self.ddb, self.sqs = clients["dynamodb"], clients["sqs"]
        self.runs_table = bootstrap.aws_names(stack.settings).runs_table
        self.pool_url = self.sqs.get_queue_url(QueueName=pool_queue_name(stack.settings.prefix, POOL))["QueueUrl"]
        self.body = json.dumps(SPEC).encode()
        self.samples: dict[str, list[float]] = {}

    def submit(self, label: str, token: str) -> None:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}", "Host": "127.0.0.1"}
        event = self.http_event("POST", "/v1/runs", "", headers, self.body, "127.0.0.1")
        context = self.lambda_context(function_name="runplane-api")
        t = time.perf_counter()
        result = self.api.lambda_handler(event, context)
        elapsed = time.perf_counter() - t
        assert result["statusCode"] == 201, result
        self.samples.setdefault(label, []).append(elapsed)

    def parts(self) -> None:
        """What a submit with quotas on adds, one store call at a time (reads only)."""
        for label, call in (
            ("head", lambda: self.stack.store.head(POOL, 1, 50)),
            ("lane", lambda: self.stack.quotas.lane(POOL, "quser", 50)),
            ("quota", lambda: self.stack.quotas.get("user", "quser")),
        ):
            t = time.perf_counter()
            call()
            self.samples.setdefault(label, []).append(time.perf_counter() - t)

    def reset(self) -> None:
        """Empty the pool queue and the runs table (not timed): with moto in this process both grow
        costly, a query reading every item of the table (see submit_latency.py)."""
        while True:
            got = self.sqs.receive_message(QueueUrl=self.pool_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            messages = got.get("Messages", [])
            if not messages:
                break
            self.sqs.delete_message_batch(
                QueueUrl=self.pool_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
        pages = self.ddb.get_paginator("scan").paginate(TableName=self.runs_table, ProjectionExpression="id")
        keys = [{"id": item["id"]} for page in pages for item in page.get("Items", [])]
        for start in range(0, len(keys), 25):
            self.ddb.batch_write_item(
                RequestItems={self.runs_table: [{"DeleteRequest": {"Key": key}} for key in keys[start : start + 25]]}
            )

    def rounds(self, warmup: int, n: int) -> None:
        paths: list[Callable[[], None]] = [
            lambda: self.submit("quotas on", "bench-quotas"),
            lambda: self.submit("no quotas set", "bench-none"),
            self.parts,
        ]
        for i in range(warmup + n):
            if i == warmup:
                self.samples.clear()
            if i % RESET_EVERY == 0:
                self.reset()
            for path in paths[i % len(paths) :] + paths[: i % len(paths)]:
                path()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="measured admission rounds (default 100)")
    parser.add_argument("--runs", type=int, default=10_000, help="queued runs in the long line (default 10000)")
    parser.add_argument("--users", type=int, default=100, help="users they belong to (default 100)")
    parser.add_argument("--small", type=int, default=100, help="queued runs in the short line (default 100)")
    parser.add_argument("--submits", type=int, default=50, help="measured submit rounds (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured rounds before each part (default 5)")
    parser.add_argument(
        "--dynamodb",
        choices=("dynalite", "moto"),
        default="dynalite",
        help="where the two lines' tables are (default dynalite; moto reads a whole table for each query)",
    )
    args = parser.parse_args()
    captured = io.StringIO()
    with contextlib.ExitStack() as stacks:
        work = Path(stacks.enter_context(tempfile.TemporaryDirectory()))
        endpoint = stacks.enter_context(dynalite(work)) if args.dynamodb == "dynalite" else None
        stack = stacks.enter_context(dev_stack(POOLS_YAML, schedule_seconds=3600))
        print(f"the lines' tables on {endpoint or 'moto'}; the submits' stack on moto at {stack.endpoint}")
        big = Line("bench10k", args.runs, args.users, work, seed=1, dynamodb=endpoint)
        small = Line("bench100", args.small, args.users, work, seed=2, dynamodb=endpoint)
        t0 = time.perf_counter()
        decisions = admission_rounds(big, small, args.warmup, args.n)
        print(f"admission rounds took {time.perf_counter() - t0:.1f}s")
        submits = SubmitPaths()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(captured):  # the handler's metric lines
            submits.rounds(args.warmup, args.submits)
        print(f"submit rounds took {time.perf_counter() - t0:.1f}s")
    emf = sum(1 for line in captured.getvalue().splitlines() if line.startswith('{"_aws"'))
    print(f"{emf} metric line(s) the handler printed were held back")

    d = decisions
    table(
        "admission decision for one free slot (_take without the claim; quotas for user and group; "
        f"tables on {args.dynamodb})",
        [
            (f"decision, {args.runs} queued", d["decision 10k"]),
            (f"decision, {args.small} queued", d["decision 100"]),
            (f"  head(pool, 8), {args.runs} queued", d["head"]),
            ("  get(run)", d["get"]),
            ("  reserve (user + group)", d["reserve"]),
            (f"bare Query Limit 8 on the rank index, {args.runs} queued", d["bare query"]),
        ],
    )
    s = submits.samples
    table(
        "submit through the API handler in-process",
        [
            ("quotas on (user + group quota, fair tag)", s["quotas on"]),
            ("no quotas set (same reads, fair tag)", s["no quotas set"]),
            ("  head(pool, 1, priority)", s["head"]),
            ("  lane read", s["lane"]),
            ("  quota read", s["quota"]),
        ],
    )
    on, off = median(s["quotas on"]), median(s["no quotas set"])
    print(f"\n  quotas on - no quotas set:  {(on - off) * 1000:7.2f} ms")
    big_ms, small_ms = median(d["decision 10k"]) * 1000, median(d["decision 100"]) * 1000
    print(f"\n  decision with {args.runs} queued: p90 {p90(d['decision 10k']) * 1000:.2f} ms")
    print(f"RESULT admission_decision: {big_ms:.2f} ms (target < {TARGET_MS:g})")
    print(ratio_line("admission_10k_vs_100", big_ms / small_ms, TARGET_GROWTH))
    print(ratio_line("submit_quotas_on_vs_off", on / off, TARGET_SUBMIT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
