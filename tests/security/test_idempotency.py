"""Submits that race with one ``Idempotency-Key``, on both clouds: however many arrive at once, one
run is made; exactly one answer says so (201) and every other one finds it (200).

Through a local stack's front (threads posting at once) the requests meet in one API instance,
which resolves one request at a time as one Lambda sandbox does. Submits that overlap in the
store come from separate instances: ``test_submits_racing_on_separate_api_instances_make_one_run``
starts eight, each a process of its own, over stores that apply conditional writes atomically."""

import json
import os
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from runplane.client import RawResponse as Response
from runplane.settings import PREFIX
from tests.conftest import ROOT, register_users

PARKED = {"command": "echo once", "queue": "parked"}  # no worker ever takes it: it stays queued


def race(client, threads, body, key):
    """``threads`` submits of ``body`` with ``key``, released together by a barrier."""
    barrier = threading.Barrier(threads)

    def submit(_: int) -> Response:
        barrier.wait(30)
        return client.request_with_status("POST", "/v1/runs", body, headers={"Idempotency-Key": key})

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(submit, range(threads)))


@pytest.mark.parametrize("threads", [2, 8])
def test_racing_submits_with_one_key_make_one_run(front, user, threads):
    alice = user("alice")
    for _ in range(5):  # several rounds: one round may happen not to overlap
        key = f"race-{uuid.uuid4()}"
        answers = race(alice, threads, PARKED, key)
        assert len(answers) == threads
        assert sorted(a.status for a in answers) == [200] * (threads - 1) + [201]
        (run_id,) = {a.body["id"] for a in answers}
        (created,) = [a.body for a in answers if a.status == 201]
        assert {a.body["created_at"] for a in answers} == {created["created_at"]}  # the 200s show the stored run
        run = alice.request("GET", f"/v1/runs/{run_id}")
        assert run["state"] == "queued"
        assert [e["message"] for e in run["events"]] == ["submitted to pool parked"]
        listed = [r["id"] for r in alice.request("GET", "/v1/runs", query={"queue": "parked", "limit": 50})["runs"]]
        assert listed.count(run_id) == 1
        alice.request("POST", f"/v1/runs/{run_id}/kill")


def test_a_single_submit_answers_201_then_200(front, user):
    """The status is what tells a client whether its submit made the run."""
    alice = user("alice")
    key = {"Idempotency-Key": f"once-{uuid.uuid4()}"}
    first = alice.request_with_status("POST", "/v1/runs", PARKED, headers=key)
    again = alice.request_with_status("POST", "/v1/runs", PARKED, headers=key)
    assert (first.status, again.status) == (201, 200)
    assert again.body["id"] == first.body["id"]
    unkeyed = alice.request_with_status("POST", "/v1/runs", PARKED)
    assert unkeyed.status == 201 and unkeyed.body["id"] != first.body["id"]
    for run_id in (first.body["id"], unkeyed.body["id"]):
        alice.request("POST", f"/v1/runs/{run_id}/kill")


def settings_env(settings):
    """The ``RUNPLANE_*`` variables that make another process build the same stack."""
    return {
        PREFIX + name.upper(): str(value) for name, value in settings.model_dump().items() if value not in (None, "")
    }


class ApiInstances:
    """``n`` API instances (``tests/security/api_instance.py``), each a process of its own."""

    def __init__(self, cloud, settings, n, log):
        env = {**os.environ, **settings_env(settings)}
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.security.api_instance", cloud],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=ROOT,
                env=env,
            )
            for _ in range(n)
        ]
        for proc in self.procs:
            assert proc.stdout.readline() == "ready\n", f"an API instance did not start; see {log.name}"

    def send(self, procs, request):
        """``request`` to each of ``procs`` at once (each waits on its stdin); their answers."""
        line = json.dumps(request) + "\n"
        for proc in procs:
            proc.stdin.write(line)
        for proc in procs:
            proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for proc in procs]
        return [Response(a["status"], a["body"]) for a in answers]

    def stop(self):
        for proc in self.procs:
            proc.stdin.close()
        for proc in self.procs:
            proc.wait(60)


@pytest.fixture(params=["aws", "azure"])
def racing_instances(request, tmp_path):
    """Eight API instances over one stack whose stores apply conditional writes atomically as the
    clouds' do: on AWS its tables on dynalite (moto's DynamoDB does not when writes race), on Azure
    Azurite's tables. Returns (instances, stack)."""
    stack = request.getfixturevalue("aws_dynalite_stack" if request.param == "aws" else "azure_stack")
    register_users(stack.tokens)
    with (tmp_path / "instances.log").open("w") as log:
        instances = ApiInstances(request.param, stack.settings, 8, log)
        try:
            yield instances, stack
        finally:
            instances.stop()


def test_submits_racing_on_separate_api_instances_make_one_run(racing_instances):
    """Every instance is a Lambda sandbox or Functions worker of its own: their submits overlap in
    the store, the first ones included, which also race to make the stack's secret."""
    instances, stack = racing_instances
    headers = {"Authorization": "Bearer alice-token", "Content-Type": "application/json"}
    me = instances.send(instances.procs, {"method": "GET", "path": "/v1/me", "headers": headers})
    assert {(a.status, a.body["user"]) for a in me} == {(200, "alice")}
    made = []
    for n in (8, 2, 8, 2, 8, 8, 8):
        key = {**headers, "Idempotency-Key": f"race-{uuid.uuid4()}"}
        answers = instances.send(
            instances.procs[:n], {"method": "POST", "path": "/v1/runs", "headers": key, "body": PARKED}
        )
        assert len(answers) == n
        assert sorted(a.status for a in answers) == [200] * (n - 1) + [201], [a.body for a in answers]
        (run_id,) = {a.body["id"] for a in answers}
        stored = stack.store.get(run_id)
        assert [e.message for e in stored.events] == ["submitted to pool parked"]
        assert {a.body["created_at"] for a in answers} == {answers[0].body["created_at"]}
        made.append(run_id)
    listed = [r.id for r in stack.store.list(owner="alice", queue="parked", limit=100).runs]
    assert sorted(listed) == sorted(made)
