"""A read of a run or a sweep that waits for it to change (``wait`` and ``since``), through each
cloud's own API function (the Lambda handler on moto, the Azure HTTP function on Azurite) and on
one machine (the Lambda handler on the SQLite stack): answered as soon as the record changes, after
``wait`` when it does not, refused for bad values, and never a wait on another user's run."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import azure.functions as func
import pytest

from functions.aws import api as aws_api
from runplane import bootstrap
from runplane.api.azure_front import handle
from runplane.api.gateway import http_event, response_parts
from runplane.devstack.lambda_shim import LambdaContext
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.services import runs, watch
from tests.conftest import register_users

STACKS = {"aws": "aws_stack", "azure": "azure_stack", "local": "local_stack"}
PARKED = {"command": "echo hi", "queue": "parked"}


def _lambda(method, path, headers, body):
    path, _, query = path.partition("?")
    event = http_event(method, path, query, headers, body, "127.0.0.1")
    status, _, data = response_parts(aws_api.lambda_handler(event, LambdaContext(function_name="runplane-api")))
    return status, data


def _azure(method, path, headers, body):
    answer = handle(func.HttpRequest(method=method, url=f"http://127.0.0.1{path}", headers=headers, body=body))
    return answer.status_code, answer.get_body()


@pytest.fixture(params=list(STACKS))
def call(request):
    """``call(method, path, body=None, who="alice")`` -> (status, parsed body) through the cloud's
    front, on a fresh stack of its own."""
    stack = request.getfixturevalue(STACKS[request.param])
    register_users(stack.tokens)
    before = bootstrap.use(stack)
    front = _azure if request.param == "azure" else _lambda

    def send(method, path, body=None, who="alice"):
        headers = {"Authorization": f"Bearer {who}-token", "Content-Type": "application/json"}
        status, data = front(method, path, headers, json.dumps(body).encode() if body is not None else b"")
        return status, json.loads(data) if data else None

    yield send
    bootstrap.use(before)


def _in_thread(send, *args, **kwargs):
    """Start ``send(*args)`` in a thread; returns a function that joins it and gives (answer,
    seconds it took)."""
    out = {}

    def go():
        started = time.monotonic()
        out["answer"] = send(*args, **kwargs)
        out["took"] = time.monotonic() - started

    thread = threading.Thread(target=go)
    thread.start()

    def result():
        thread.join(timeout=60)
        assert not thread.is_alive(), "the waiting read never answered"
        return out["answer"], out["took"]

    return result


def test_a_waiting_read_is_answered_as_soon_as_the_run_changes(call):
    status, run = call("POST", "/v1/runs", PARKED)
    assert status == 201 and run["revision"]
    path = f"/v1/runs/{run['id']}"
    assert call("GET", path)[1]["revision"] == run["revision"]  # the same run: the same revision
    waiting = _in_thread(call, "GET", f"{path}?wait=20&since={run['revision']}")
    time.sleep(0.5)  # the read is waiting by now (had it not started, it would answer at once all the same)
    assert call("POST", f"{path}/kill")[0] == 202
    (status, seen), took = waiting()
    assert status == 200 and seen["state"] == "killed" and seen["revision"] != run["revision"]
    assert took < 15, f"the answer came after {took:.1f}s, not when the run changed"


def test_an_unchanged_run_is_answered_as_it_is_when_the_wait_ends(call):
    run = call("POST", "/v1/runs", PARKED)[1]
    path = f"/v1/runs/{run['id']}"
    started = time.monotonic()
    status, seen = call("GET", f"{path}?wait=1.5&since={run['revision']}")
    assert time.monotonic() - started >= 1.4, "it answered before the wait ended, unchanged"
    assert status == 200 and (seen["state"], seen["revision"]) == ("queued", run["revision"])
    # a revision it no longer has: answered at once, with the one it has
    started = time.monotonic()
    status, seen = call("GET", f"{path}?wait=20&since=0123456789abcdef")
    assert status == 200 and seen["revision"] == run["revision"] and time.monotonic() - started < 15


def test_bad_waits_and_revisions_are_refused_and_another_users_run_is_not_waited_on(call):
    run = call("POST", "/v1/runs", PARKED)[1]
    path = f"/v1/runs/{run['id']}"
    for query in ("wait=-1", "wait=100", "wait=nan", "wait=inf"):
        status, body = call("GET", f"{path}?{query}")
        assert (status, body["error"]["message"]) == (422, "query parameter wait must be between 0 and 20"), query
    status, body = call("GET", f"{path}?wait=soon")
    assert (status, body["error"]["message"]) == (400, "query parameter wait must be a number")
    for since in ("x", "0123456789ABCDEF", "0123456789abcdef0"):
        status, body = call("GET", f"{path}?wait=1&since={since}")
        assert (status, body["error"]["message"]) == (
            422,
            f"since must be the revision of an earlier answer, not {since!r}",
        )
    started = time.monotonic()
    status, body = call("GET", f"{path}?wait=20&since={run['revision']}", who="bob")
    assert (status, body["error"]["code"]) == (404, "not_found") and run["id"] in body["error"]["message"]
    assert time.monotonic() - started < 15, "another user's run was waited on"
    assert call("GET", f"/v1/sweeps/s-nothing?wait=20&since={run['revision']}")[0] == 404


def test_a_waiting_read_of_a_sweep_is_answered_when_its_record_changes(call):
    status, sweep = call("POST", "/v1/sweeps", {"run": PARKED, "count": 3, "max_parallel": 1})
    assert status == 201 and sweep["revision"]
    path = f"/v1/sweeps/{sweep['id']}"
    waiting = _in_thread(call, "GET", f"{path}?wait=20&since={sweep['revision']}")
    time.sleep(0.5)
    assert call("PATCH", path, {"max_parallel": 2})[0] == 200
    (status, seen), took = waiting()
    assert status == 200 and seen["max_parallel"] == 2 and seen["revision"] != sweep["revision"]
    assert took < 15, f"the answer came after {took:.1f}s, not when the sweep changed"
    assert call("GET", f"{path}?wait=20&since={sweep['revision']}", who="bob")[0] == 404


def test_the_wait_is_kept_on_the_ports_clock_and_ends_one_read_after_the_change(local_stack):
    """No wall time: the service's deadline is on the ports' clock and its pauses are the ports'
    sleep, which here moves that clock; the run is killed 1 s (of that clock) into a 20 s wait."""
    now, slept, killed = [1000.0], [], []
    alice = Principal(user="alice", scopes=["runs:read", "runs:write"])

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds
        if sum(slept) >= 1 and not killed:  # once, 1 s in
            killed.append(runs.kill_run(ports, alice, run.id))

    ports = dataclasses.replace(bootstrap.make_ports(local_stack, lambda: now[0]), sleep=sleep)
    run = runs.submit_run(ports, alice, RunSpec(command="echo hi", queue="parked"), None).run
    seen, _ = watch.watched_run(ports, alice, run.id, watch.run_revision(run), 20)
    assert seen.state == "killed" and 1 <= sum(slept) <= 1 + watch.LOCAL_INTERVAL  # the read after the kill

    slept.clear()
    again, _ = watch.watched_run(ports, alice, run.id, watch.run_revision(seen), 20)  # unchanged: the whole wait
    assert again.state == "killed" and sum(slept) == pytest.approx(20)
    assert max(slept) == pytest.approx(watch.LOCAL_INTERVAL)
    slept.clear()
    assert watch.watched_run(ports, alice, run.id, watch.run_revision(seen), 600)[0] == again  # capped at 20 s
    assert sum(slept) == pytest.approx(watch.MAX_WAIT_SECONDS)


def test_one_user_holds_at_most_a_few_waiting_reads_and_never_another_users(local_stack):
    """A user holding MAX_WAITING_PER_USER waiting reads in a process gets the next answered at
    once, unwaited; another user's read still waits."""
    now, release, held = [0.0], threading.Event(), threading.Semaphore(0)
    alice = Principal(user="alice", scopes=["runs:read", "runs:write"])
    bob = Principal(user="bob", scopes=["runs:read", "runs:write"])

    def blocked(seconds):  # a waiting read, held until released, then at its end
        held.release()
        release.wait(30)
        now[0] += 100

    def refused(seconds):
        raise AssertionError("a read over the user's cap waited")

    ports = bootstrap.make_ports(local_stack, lambda: now[0])
    spec = RunSpec(command="echo hi", queue="parked")
    run, other = (runs.submit_run(ports, p, spec, None).run for p in (alice, bob))
    waits = dataclasses.replace(ports, sleep=blocked)
    threads = [
        threading.Thread(target=watch.watched_run, args=(waits, alice, run.id, None, 20))
        for _ in range(watch.MAX_WAITING_PER_USER)
    ]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert held.acquire(timeout=30), "a waiting read never waited"
        seen, _ = watch.watched_run(dataclasses.replace(ports, sleep=refused), alice, run.id, None, 20)
        assert seen.id == run.id and seen.state == "queued"
        bobs = threading.Thread(target=watch.watched_run, args=(waits, bob, other.id, None, 20))
        bobs.start()
        assert held.acquire(timeout=30), "another user's read did not wait"
    finally:
        release.set()
        for thread in [*threads, bobs]:
            thread.join(30)
    slept = []
    after = dataclasses.replace(ports, sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    watch.watched_run(after, alice, run.id, None, 1)  # the reads held are given back when they end
    assert sum(slept) == pytest.approx(1)


def test_all_users_together_hold_at_most_max_waiting_reads(local_stack, monkeypatch):
    """Past MAX_WAITING waiting reads in a process, whoever's, the next is answered at once, unwaited
    (a front keeps threads for every other request); a wait that ends gives its place back."""
    monkeypatch.setattr(watch, "MAX_WAITING", 2)
    now, release, held = [0.0], threading.Event(), threading.Semaphore(0)
    users = [Principal(user=name, scopes=["runs:read", "runs:write"]) for name in ("alice", "bob", "carol")]

    def blocked(seconds):
        held.release()
        release.wait(30)
        now[0] += 100

    def refused(seconds):
        raise AssertionError("a read past the process's cap waited")

    ports = bootstrap.make_ports(local_stack, lambda: now[0])
    spec = RunSpec(command="echo hi", queue="parked")
    alices, bobs, carols = (runs.submit_run(ports, p, spec, None).run for p in users)
    waits = dataclasses.replace(ports, sleep=blocked)
    threads = [
        threading.Thread(target=watch.watched_run, args=(waits, p, r.id, None, 20))
        for p, r in zip(users[:2], (alices, bobs), strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert held.acquire(timeout=30), "a waiting read never waited"
        seen, _ = watch.watched_run(dataclasses.replace(ports, sleep=refused), users[2], carols.id, None, 20)
        assert seen.id == carols.id and seen.state == "queued"
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    slept = []
    after = dataclasses.replace(ports, sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    watch.watched_run(after, users[2], carols.id, None, 1)
    assert sum(slept) == pytest.approx(1)
