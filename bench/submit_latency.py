"""Submit latency: POST /v1/runs through the real API handler vs the bare AWS calls it makes.

An in-process moto server stands in for DynamoDB and SQS; the embedded local stack puts its
HTTP front (API Gateway v2 events into the unchanged Lambda handler) in front of it. The pool
allows no workers, so nothing but the control plane runs (the stack's dispatcher still takes
every submit event, as it would in AWS).

Paths, measured in rotating order in every round so all see the same table and queue state:

* bare: what a submit does against the stores, issued with boto3 clients: DynamoDB PutItem
  (the same item a submit writes, new id, ``attribute_not_exists(id)``) + SendMessage to the
  pool queue + SendMessage to the events queue. The token GetItem the API does first on every
  request is timed right after it and reported as ``bare + token GetItem``.
* handler: ``functions.aws.api.lambda_handler`` called in-process with an API Gateway v2 event.
* http keep-alive: POST over one persistent HTTP/1.1 connection (boto3 pools its connections too).
* http new connection: a new SDK ``Client`` (``runplane.client``) for each request, so a new
  connection each time, as a short CLI command makes; every 4th round.

RATIO is http keep-alive / bare.

    python bench/submit_latency.py [--n 200]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from _common import dev_stack, median, ratio_line, table

TARGET = 1.5
POOLS_YAML = (
    "pools: [{name: default, backend: local, cpus: 2, memory: 4g, max_workers: 0, "
    "default_image: runplane/test-busybox:1}]\n"
)
SPEC = {"command": "sh -c true", "name": "bench"}
RESET_EVERY = 20  # rounds between emptying the pool queue and the runs table (not timed)
PATHS = ("bare", "handler", "http keep-alive", "http new connection")


class SubmitBench:
    def __init__(self, endpoint: str, api_url: str) -> None:
        import boto3

        from functions.aws import api
        from runplane import bootstrap
        from runplane.adapters.aws.sqs import events_queue_name, pool_queue_name
        from runplane.client import Client
        from runplane.devstack.lambda_shim import LambdaContext, http_event
        from runplane.services.auth import hash_token

        self.api = api
        self.lambda_context = LambdaContext
        self.http_event = http_event
        settings = bootstrap.stack().settings
        self.names = bootstrap.aws_names(settings)
        tables = settings.dynamodb_endpoint_url or endpoint  # the tables' own endpoint, when set
        self.ddb = boto3.client("dynamodb", endpoint_url=tables, region_name="us-east-1")
        self.sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
        self.pool_url = self.sqs.get_queue_url(QueueName=pool_queue_name(settings.prefix, "default"))["QueueUrl"]
        self.events_url = self.sqs.get_queue_url(QueueName=events_queue_name(settings.prefix))["QueueUrl"]
        self.client = Client(api_url, "bench")
        first = self.client.request("POST", "/v1/runs", SPEC)
        self.item = self.ddb.get_item(TableName=self.names.runs_table, Key={"id": {"S": first["id"]}})["Item"]
        self.token_key = {"token_hash": {"S": hash_token("bench")}}
        self.event_body = json.dumps({"v": 1, "pool": "default", "reason": "submitted"})
        self.body = json.dumps(SPEC).encode()
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Authorization": "Bearer bench",
        }
        self.host, port = api_url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(self.host, int(port), timeout=30)
        self.samples: dict[str, list[float]] = {k: [] for k in PATHS}
        self.auth: list[float] = []

    # -- the paths, each returning its own elapsed time ---------------------------------

    def bare_calls(self) -> float:
        run_id = "r-" + uuid.uuid4().hex[:24]
        item = dict(self.item, id={"S": run_id})
        message = json.dumps({"v": 1, "run_id": run_id, "attempt": 0})
        t = time.perf_counter()
        self.ddb.put_item(TableName=self.names.runs_table, Item=item, ConditionExpression="attribute_not_exists(id)")
        self.sqs.send_message(QueueUrl=self.pool_url, MessageBody=message)
        self.sqs.send_message(QueueUrl=self.events_url, MessageBody=self.event_body)
        return time.perf_counter() - t

    def token_lookup(self) -> float:
        t = time.perf_counter()
        self.ddb.get_item(TableName=self.names.tokens_table, Key=self.token_key)
        return time.perf_counter() - t

    def handler_call(self) -> float:
        event = self.http_event("POST", "/v1/runs", "", {**self.headers, "Host": self.host}, self.body, "127.0.0.1")
        context = self.lambda_context(function_name="runplane-api")
        t = time.perf_counter()
        result = self.api.lambda_handler(event, context)
        elapsed = time.perf_counter() - t
        assert result["statusCode"] == 201, result
        return elapsed

    def keep_alive_call(self) -> float:
        t = time.perf_counter()
        self.conn.request("POST", "/v1/runs", body=self.body, headers=self.headers)
        resp = self.conn.getresponse()
        resp.read()
        elapsed = time.perf_counter() - t
        assert resp.status == 201, resp.status
        return elapsed

    def new_connection_call(self) -> float:
        from runplane.client import Client

        t = time.perf_counter()
        with Client(self.client.url, "bench", retries=0) as client:
            client.request("POST", "/v1/runs", SPEC)
        return time.perf_counter() - t

    # -- rounds ---------------------------------------------------------------------------

    def reset_state(self) -> None:
        """Empty the pool queue and the runs table (not timed).

        Nothing consumes them here (no workers), and with moto in this process both grow
        costly: SendMessage slows as a queue fills, and the dispatcher's backlog count on
        every submit event reads every queued run. PurgeQueue is limited to once a minute.
        """
        while True:
            got = self.sqs.receive_message(QueueUrl=self.pool_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            messages = got.get("Messages", [])
            if not messages:
                break
            self.sqs.delete_message_batch(
                QueueUrl=self.pool_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
        pages = self.ddb.get_paginator("scan").paginate(TableName=self.names.runs_table, ProjectionExpression="id")
        keys = [{"id": item["id"]} for page in pages for item in page.get("Items", [])]
        for start in range(0, len(keys), 25):
            self.ddb.batch_write_item(
                RequestItems={
                    self.names.runs_table: [{"DeleteRequest": {"Key": key}} for key in keys[start : start + 25]]
                }
            )

    def round(self, i: int) -> None:
        def bare() -> None:
            self.samples["bare"].append(self.bare_calls())
            self.auth.append(self.token_lookup())

        paths: list[Callable[[], None]] = [
            bare,
            lambda: self.samples["handler"].append(self.handler_call()),
            lambda: self.samples["http keep-alive"].append(self.keep_alive_call()),
        ]
        paths = paths[i % len(paths) :] + paths[: i % len(paths)]
        if i % 4 == 0:
            paths.insert(
                i // 4 % (len(paths) + 1),
                lambda: self.samples["http new connection"].append(self.new_connection_call()),
            )
        for path in paths:
            path()

    def rounds(self, warmup: int, n: int) -> None:
        for i in range(warmup + n):
            if i == warmup:
                for values in self.samples.values():
                    values.clear()
                self.auth.clear()
            if i % RESET_EVERY == 0:
                self.reset_state()
            self.round(i)

    def throughput(self, count: int) -> dict[str, float]:
        """Back-to-back bursts, api and bare alternating twice so both see the same state."""
        elapsed = {"http keep-alive": 0.0, "bare": 0.0}
        calls: dict[str, Callable[[], Any]] = {"http keep-alive": self.keep_alive_call, "bare": self.bare_calls}
        for label in list(elapsed) * 2:
            self.reset_state()
            t = time.perf_counter()
            for _ in range(count // 2):
                calls[label]()
            elapsed[label] += time.perf_counter() - t
        return {label: (count // 2 * 2) / seconds for label, seconds in elapsed.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="measured rounds (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured rounds first (default 10)")
    args = parser.parse_args()
    captured = io.StringIO()
    with dev_stack(POOLS_YAML, schedule_seconds=3600) as stack:
        bench = SubmitBench(stack.endpoint, stack.api_url)
        print(
            f"run item {len(json.dumps(bench.item))} bytes as JSON; {args.warmup} warm-up + {args.n} "
            f"measured rounds; pool queue and runs table emptied every {RESET_EVERY} rounds (not timed)"
        )
        t0 = time.perf_counter()
        # The handler's metrics object prints EMF lines to stdout; keep them out of the table.
        with contextlib.redirect_stdout(captured):
            bench.rounds(args.warmup, args.n)
            rounds_s = time.perf_counter() - t0
            rates = bench.throughput(max(10, min(50, args.n // 4)))
        bench.conn.close()
    emf = sum(1 for line in captured.getvalue().splitlines() if line.startswith('{"_aws"'))
    print(f"latency rounds took {rounds_s:.1f}s; {emf} metric line(s) the handler printed were held back")

    s = bench.samples
    bare_auth = [b + a for b, a in zip(s["bare"], bench.auth, strict=True)]
    table(
        "submit latency (moto in-process on 127.0.0.1; keep-alive = one persistent HTTP/1.1 connection, "
        "new connection = a new runplane Client per request)",
        [
            ("bare: PutItem + 2x SendMessage", s["bare"]),
            ("bare + token GetItem", bare_auth),
            ("handler in-process", s["handler"]),
            ("http keep-alive", s["http keep-alive"]),
            ("http new connection", s["http new connection"]),
        ],
    )
    b, h, k = median(s["bare"]), median(s["handler"]), median(s["http keep-alive"])
    auth = median(bench.auth)
    print(f"\n  handler - bare:            {(h - b) * 1000:7.2f} ms (token GetItem alone {auth * 1000:.2f} ms)")
    print(f"  http keep-alive - handler: {(k - h) * 1000:7.2f} ms (HTTP front)")
    print(f"  handler / bare:            {h / b:7.2f}x")
    print("\nsequential throughput (one client, back to back)")
    for label, rate in rates.items():
        print(f"  {label:<16} {rate:7.1f} submits/s")
    print(ratio_line("submit_latency (http keep-alive / bare)", k / b, TARGET))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
