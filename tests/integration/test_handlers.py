"""Dispatcher and reaper entrypoints with canonical Lambda events, on the moto server."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from runplane import bootstrap
from runplane.adapters.aws.provision import provision
from runplane.bootstrap import make_ports
from runplane.compute.local.compute import LocalCompute
from runplane.devstack.lambda_shim import LambdaContext
from runplane.domain.expect import Expect
from runplane.domain.pools import Pool
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.reap import reap
from runplane.services.runs import submit_run
from runplane.settings import StackSettings

EVENTS = Path(__file__).resolve().parents[1] / "events"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
POOLS = """
pools:
  - {name: default, backend: local, cpus: 2, memory: 2g, max_workers: 3, default_image: img}
  - {name: broken, backend: kubernetes, cpus: 2, memory: 2g, max_workers: 3, default_image: img,
     options: {image: img, kubeconfig: /nonexistent/kubeconfig}}
"""


def load_event(name):
    return json.loads((EVENTS / name).read_text())


@pytest.fixture
def handler_stack(aws_stack, monkeypatch, tmp_path):
    """The process-wide stack the Lambda handlers use, on a fresh moto prefix, handed to them."""
    s = aws_stack.settings
    stack = bootstrap.build_stack(StackSettings(prefix=s.prefix, aws_endpoint_url=s.aws_endpoint_url, pools=POOLS))
    before = bootstrap.use(stack)
    clients = bootstrap.aws_clients(stack.settings)
    provision(
        bootstrap.aws_names(stack.settings), ["default", "broken"], clients["dynamodb"], clients["sqs"], clients["s3"]
    )
    backend = LocalCompute(tmp_path / "workers", command=SLEEPER)
    stack.backends["local"] = backend
    yield stack
    pool = stack.pools.get("default")
    for job in backend.list(pool):
        backend.cancel(pool, job.id)
    bootstrap.use(before)


def test_dispatcher_batch_reports_only_the_failed_pool(handler_stack):
    from functions.aws import dispatcher

    alice = Principal(user="alice")
    for _ in range(2):
        submit_run(handler_stack.ports, alice, RunSpec(command="x"), None)
    result = dispatcher.lambda_handler(load_event("sqs_dispatch.json"), LambdaContext())
    # the broken pool's record is retried; unreadable and unknown-pool records are dropped
    assert result == {"batchItemFailures": [{"itemIdentifier": "4c4d6f2f-1111-4b2f-8a8f-8f1d6c2e3a22"}]}
    jobs = handler_stack.backend(handler_stack.pools.get("default")).list(handler_stack.pools.get("default"))
    assert len(jobs) == 2  # two events for the pool, one dispatch: one worker per queued run


def test_dispatcher_schedule_reports_every_pool(handler_stack):
    from functions.aws import dispatcher

    result = dispatcher.lambda_handler(load_event("schedule.json"), LambdaContext())
    assert result["pools"]["default"] == "no backlog"
    assert result["pools"]["broken"].startswith("error: pool broken: cannot load a Kubernetes config")


def test_reaper_handler_requeues_expired_lease(handler_stack):
    from functions.aws import reaper

    s = handler_stack
    run = submit_run(s.ports, Principal(user="a"), RunSpec(command="x"), None).run
    held = lifecycle.claim(s.store, run, 0, "w-dead", lease_seconds=-1, now=time.time())
    result = reaper.lambda_handler(load_event("schedule.json"), LambdaContext())
    assert result["requeued"] == [run.id]
    after = s.store.get(run.id)
    assert (after.state, after.attempt, after.worker_id) == (RunState.QUEUED, held.attempt, None)
    assert "w-dead stopped renewing" in after.waiting_reason


def _active(stack, worker="w1", attempts=1, kill=False, lease_in=-1.0):
    run = submit_run(stack.ports, Principal(user="a"), RunSpec(command="x"), None).run
    run = stack.store.update(run, Expect(), {"max_attempts": attempts})
    run = lifecycle.claim(stack.store, run, 0, worker, lease_seconds=lease_in, now=time.time())
    if kill:
        run = stack.store.update(run, Expect(), {"kill_requested": True})
    return run


def test_reap_outcomes(aws_stack):
    s = aws_stack
    fresh = _active(s, lease_in=60)
    requeue = _active(s, attempts=3)
    exhausted = _active(s, attempts=1)
    killed = _active(s, kill=True)
    report = reap(s.ports, rehint_after=3600)
    assert report.requeued == [requeue.id]
    assert set(report.ended) == {exhausted.id, killed.id}
    assert s.store.get(fresh.id).state == RunState.PREPARING
    ended = s.store.get(exhausted.id)
    assert ended.state == RunState.FAILED
    assert ended.failure.reason == "worker_lost"
    assert "no attempts left" in ended.failure.message
    assert s.store.get(killed.id).state == RunState.KILLED
    # the re-queued run got a fresh hint at its current attempt
    hints = []
    for _ in range(3):
        hints += [d.message for d in s.queue.receive("default", 10, 1, 30)]
    assert any(h.run_id == requeue.id and h.attempt == 1 for h in hints)


def test_reap_rehints_old_queued_runs(aws_stack):
    s = aws_stack
    run = submit_run(s.ports, Principal(user="a"), RunSpec(command="x"), None).run
    for d in s.queue.receive("default", 10, 1, 30):
        s.queue.delete("default", d)  # the hint got lost
    assert reap(s.ports, rehint_after=3600).rehinted == []
    report = reap(make_ports(s, lambda: time.time() + 7200), rehint_after=3600)
    assert report.rehinted == [run.id]
    assert [d.message.run_id for d in s.queue.receive("default", 10, 1, 30)] == [run.id]


def test_stale_worker_cannot_write_over_a_new_attempt(aws_stack):
    s = aws_stack
    first = _active(s, worker="w-old", attempts=3)
    reap(s.ports, rehint_after=3600)
    second = lifecycle.claim(s.store, s.store.get(first.id), 1, "w-new", 30, time.time())
    from runplane.domain.errors import LeaseLost

    with pytest.raises(LeaseLost, match=f"run {first.id} attempt 1 cannot become running: .* at attempt 2"):
        lifecycle.advance(s.store, first, RunState.RUNNING, time.time(), "late")
    with pytest.raises(LeaseLost, match=f"lease on run {first.id} attempt 1 lost: .* at attempt 2"):
        lifecycle.renew(s.store, first, 30, time.time())
    assert s.store.get(first.id).worker_id == "w-new"
    assert s.store.get(first.id).attempt == second.attempt == 2


def test_local_backend_contract(tmp_path):
    pool = Pool(name="p", cpus=1, memory=2**30, default_image="x")
    backend = LocalCompute(tmp_path, command=SLEEPER)
    jobs = backend.launch(pool, 2, ["--pool", "p"])
    assert len(jobs) == 2
    assert {j.id for j in backend.list(pool)} == {j.id for j in jobs}
    pid = jobs[0].detail["pid"]
    backend.cancel(pool, jobs[0].id)
    backend.cancel(pool, jobs[0].id)  # idempotent and quiet
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        backend.list(pool)  # reaps the child
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")
    assert [j.id for j in backend.list(pool)] == [jobs[1].id]
    # another process (a new dispatcher invocation) sees the same jobs
    assert [j.id for j in LocalCompute(tmp_path, command=SLEEPER).list(pool)] == [jobs[1].id]
    live = backend.describe(pool, jobs[1].id)
    assert live is not None and live.state == "running" and live.worker_id == jobs[1].worker_id
    assert backend.describe(pool, jobs[0].id) is None  # cancelled: gone
    assert backend.describe(pool, "never-existed") is None
    backend.cancel(pool, jobs[1].id)
    backend.cancel(pool, "never-existed")
    assert backend.list(pool) == []


def test_lost_preemptible_worker_does_not_use_up_an_attempt(aws_stack):
    s = aws_stack
    run = submit_run(s.ports, Principal(user="a"), RunSpec(command="x"), None).run
    run = s.store.update(run, Expect(), {"max_attempts": 1})
    held = lifecycle.claim(s.store, run, 0, "spot-1", lease_seconds=-1, now=time.time(), preemptible=True)
    assert held.on_preemptible
    report = reap(s.ports, rehint_after=3600)
    assert report.requeued == [run.id]
    after = s.store.get(run.id)
    assert (after.state, after.attempt, after.max_attempts) == (RunState.QUEUED, 1, 2)
    # the same loss on an ordinary worker uses the last attempt up
    held = lifecycle.claim(s.store, after, 1, "w-2", lease_seconds=-1, now=time.time())
    reap(s.ports, rehint_after=3600)
    assert s.store.get(run.id).failure.reason == "worker_lost"


def _sqs(*bodies):
    template = load_event("sqs_dispatch.json")["Records"][0]
    return {"Records": [{**template, "messageId": f"m-{i}", "body": json.dumps(b)} for i, b in enumerate(bodies)]}


def _published(capsys):
    """(metric name, value, dimensions) of the EMF documents the handler printed."""
    out = []
    for line in capsys.readouterr().out.splitlines():
        if line.startswith('{"_aws"'):
            doc = json.loads(line)
            [directive] = doc["_aws"]["CloudWatchMetrics"]
            name = directive["Metrics"][0]["Name"]
            out.append((name, doc[name][0], {k: doc[k] for k in directive["Dimensions"][0] if k != "service"}))
    return out


def test_the_dispatcher_publishes_each_pools_figures_and_each_runs_end(handler_stack, capsys, monkeypatch):
    from functions.aws import dispatcher

    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    alice = Principal(user="alice")
    store, queue = handler_stack.store, handler_stack.queue
    runs = [submit_run(handler_stack.ports, alice, RunSpec(command="x"), None).run for _ in range(3)]
    # one of them runs 2 s after its submit and ends out of memory: its end event, as a worker sends it
    held = lifecycle.claim(store, runs[0], 0, "w1", 60.0, runs[0].created_at + 1)
    held = lifecycle.advance(store, held, RunState.RUNNING, runs[0].created_at + 2, "started")
    done = lifecycle.fail(store, held, FailureReason.OUT_OF_MEMORY, "oom", runs[0].created_at + 5)
    sent = []
    monkeypatch.setattr(queue, "notify", sent.append)
    lifecycle.ended(queue, done)
    [end] = sent
    assert (end.pool, end.ended.state, end.ended.reason, end.ended.to_running) == (
        "default", RunState.FAILED, FailureReason.OUT_OF_MEMORY, 2.0
    )  # fmt: skip
    capsys.readouterr()

    only_end = dispatcher.lambda_handler(_sqs(end.model_dump(mode="json")), LambdaContext())
    assert only_end == {"batchItemFailures": []}
    got = _published(capsys)
    assert got == [
        ("RunsEnded", 1.0, {"pool": "default", "state": "failed", "reason": "out_of_memory"}),
        ("SecondsToRunning", 2.0, {"pool": "default"}),
    ]  # an end alone launches nothing: the pool is not looked at
    pool = handler_stack.pools.get("default")
    assert handler_stack.backend(pool).list(pool) == []

    dispatcher.lambda_handler(_sqs({"v": 1, "pool": "default", "reason": "submitted"}), LambdaContext())
    got = {(name, dims.get("status")): value for name, value, dims in _published(capsys)}
    assert got[("QueueDepth", None)] == 2.0  # the two still queued
    assert got[("WorkersLaunched", None)] == 2.0
    assert got[("Workers", "starting")] == 0.0  # counted from the pass's record, before its launch
    assert ("LaunchFailures", None) not in got


def test_a_launch_the_backend_refuses_is_published_as_a_launch_failure(handler_stack, capsys, monkeypatch, tmp_path):
    from functions.aws import dispatcher

    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    handler_stack.backends["local"] = LocalCompute(tmp_path / "w", command=[str(tmp_path / "no-such-agent")])
    submit_run(handler_stack.ports, Principal(user="alice"), RunSpec(command="x"), None)  # fmt: skip
    capsys.readouterr()
    from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

    with pytest.raises(BatchProcessingError):  # the whole batch failed: tried again later
        dispatcher.lambda_handler(_sqs({"v": 1, "pool": "default", "reason": "submitted"}), LambdaContext())
    got = {name: value for name, value, _ in _published(capsys)}
    assert (got["QueueDepth"], got["LaunchFailures"]) == (1.0, 1.0)
    assert "WorkersLaunched" not in got


def test_reap_rehints_only_the_head_of_a_long_line(aws_stack):
    from runplane.services.reap import REHINT_WINDOW

    s = aws_stack
    alice = Principal(user="a")
    runs = [
        submit_run(make_ports(s, lambda i=i: 1000.0 + i), alice, RunSpec(command="x"), None).run
        for i in range(REHINT_WINDOW + 8)
    ]
    while got := s.queue.receive("default", 10, 0, 30):  # every hint got lost
        for d in got:
            s.queue.delete("default", d)
    report = reap(make_ports(s, lambda: 1_000_000.0), rehint_after=3600)
    line = [r.id for r in s.store.head("default", len(runs))]
    assert sorted(report.rehinted) == sorted(line[:REHINT_WINDOW])  # the first in line, no more
    assert set(line) == {r.id for r in runs}
