"""The Azure Functions app called in-process, as the host calls it, on a real stack: moto's server
and Azurite. The HTTP function must answer exactly as the Lambda handler does; the queue trigger
dispatches (and raises for the host to retry); the timers dispatch and reap. On Azurite the local
Functions host also feeds the real events queue, retrying and poisoning as host.json says."""

import base64
import dataclasses
import json
import sys
import time
from pathlib import Path

import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest
from azure.storage.queue import QueueClient

from functions.aws import api as aws_api
from functions.azure import api, dispatcher, function_app, reaper
from runplane import bootstrap
from runplane.adapters.azure.queues import events_queue_name, poison_queue_name
from runplane.api.gateway import http_event, response_parts
from runplane.compute.local.compute import LocalCompute
from runplane.devstack.functions_host import FunctionsHost, HostOptions
from runplane.devstack.lambda_shim import LambdaContext
from runplane.domain.errors import RunplaneError
from runplane.domain.messages import DispatchEvent
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.auth import register_token
from runplane.services.runs import submit_run
from runplane.settings import StackSettings

HOST_JSON = Path(function_app.__file__).with_name("host.json")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
POOLS = """
pools:
  - {name: default, backend: local, cpus: 2, memory: 2g, max_workers: 3, default_image: img}
  - {name: parked, backend: local, cpus: 2, memory: 4g, max_workers: 0, default_image: img}
  - {name: broken, backend: kubernetes, cpus: 2, memory: 2g, max_workers: 3, default_image: img,
     options: {image: img, kubeconfig: /nonexistent/kubeconfig}}
"""
ALICE = {"Authorization": "Bearer alice-token"}


@pytest.fixture(params=["aws", "azure"])
def stack(request, monkeypatch, tmp_path):
    """The process-wide stack the functions use, on a freshly provisioned moto or Azurite stack;
    workers are sleeping processes."""
    base = request.getfixturevalue(f"{request.param}_stack").settings
    where = {
        "azure_storage_connection_string": base.azure_storage_connection_string,
        "aws_endpoint_url": base.aws_endpoint_url,
    }
    s = bootstrap.build_stack(StackSettings(cloud=base.cloud, prefix=base.prefix, pools=POOLS, **where))
    before = bootstrap.use(s)
    backend = LocalCompute(tmp_path / "workers", command=SLEEPER)
    s.backends["local"] = backend
    register_token(s.tokens, "alice-token", "alice", now=time.time())
    yield s
    pool = s.pools.get("default")
    for job in backend.list(pool):
        backend.cancel(pool, job.id)
    bootstrap.use(before)


def call_azure(method, path, body=b"", headers=None):
    req = func.HttpRequest(
        method=method,
        url=f"https://runplane.azurewebsites.net{path}",
        headers=headers or {},
        route_params={"path": path.partition("?")[0].removeprefix("/v1/")},
        body=body,
    )
    response = api.http_api.build().get_user_function()(req)
    return response.status_code, dict(response.headers), response.get_body()


def call_lambda(method, path, body=b"", headers=None):
    path, _, query = path.partition("?")
    event = http_event(method, path, query, headers or {}, body, "127.0.0.1")
    status, out, data = response_parts(aws_api.lambda_handler(event, LambdaContext()))
    return status, out, data


def jobs(s, pool="default"):
    return s.backend(s.pools.get(pool)).list(s.pools.get(pool))


def test_http_function_answers_as_the_lambda_handler_does(stack):
    status, _, body = call_azure("POST", "/v1/runs", json.dumps({"command": "x", "queue": "parked"}).encode(), ALICE)
    assert status == 201
    run_id = json.loads(body)["id"]
    requests = [
        ("GET", "/v1/health", b"", {}),
        ("GET", f"/v1/runs/{run_id}", b"", ALICE),
        ("GET", "/v1/runs?limit=5&state=queued", b"", ALICE),
        ("GET", f"/v1/runs/{run_id}/logs?stream=stderr", b"", ALICE),
        ("GET", "/v1/runs", b"", {}),
        ("GET", "/v1/runs", b"", {"Authorization": "Bearer nope"}),
        ("POST", "/v1/runs", b"{not json", ALICE),
        ("POST", "/v1/runs", b'{"command": "x", "queue": "nope"}', ALICE),
        ("POST", "/v1/runs", bytes([0xFF, 0xFE]), ALICE),
        ("GET", "/v1/runs?limit=x", b"", ALICE),
        ("GET", "/v1/runs/r-doesnotexist", b"", ALICE),
        ("PATCH", "/v1/runs", b"", ALICE),
    ]
    for method, path, data, headers in requests:
        assert call_azure(method, path, data, headers) == call_lambda(method, path, data, headers), (method, path)
    assert call_azure("GET", "/v1/runs", b"", {})[0] == 401


def event_message(pool):
    body = json.dumps({"v": 1, "pool": pool, "reason": "submitted"}).encode()
    return func.QueueMessage(id=f"m-{pool}", body=body)


def test_queue_trigger_dispatches_the_events_pool(stack):
    for _ in range(2):
        submit_run(stack.ports, Principal(user="a"), RunSpec(command="x"), None)
    events = dispatcher.dispatcher_events.build().get_user_function()
    events(event_message("default"))
    events(event_message("default"))  # a duplicate event launches nothing more
    assert len(jobs(stack)) == 2  # one worker per queued run


def test_queue_trigger_raises_for_a_failing_pool_and_drops_what_it_cannot_use(stack):
    events = dispatcher.dispatcher_events.build().get_user_function()
    with pytest.raises(RunplaneError, match="pool broken"):
        events(event_message("broken"))
    assert events(func.QueueMessage(id="m-x", body=b"this is not an event")) is None
    assert events(event_message("gone")) is None
    assert jobs(stack) == []


def test_timers_dispatch_every_pool_and_reap(stack):
    run = submit_run(stack.ports, Principal(user="a"), RunSpec(command="x"), None)
    held = lifecycle.claim(stack.store, run.run, 0, "w-dead", lease_seconds=-1, now=time.time())
    reaper.reaper.build().get_user_function()(TimerRequest())  # must not raise for the broken pool either
    after = stack.store.get(run.run.id)
    assert (after.state, after.attempt, after.worker_id) == (RunState.QUEUED, held.attempt, None)
    dispatcher.dispatcher_schedule.build().get_user_function()(TimerRequest())
    assert len(jobs(stack)) == 1


@pytest.fixture
def azure_host(stack, azurite):
    settings = {
        "RunplaneStorage": azurite,
        "RunplaneEventsQueue": events_queue_name(stack.settings.prefix),
        "RunplaneSchedule": "*/5 * * * * *",
    }
    # no pause between tries, so the retries below need no waiting
    options = dataclasses.replace(HostOptions.from_host_json(HOST_JSON), visibility_timeout=0)
    return FunctionsHost(function_app.make_app(), options, settings)


@pytest.mark.parametrize("stack", ["azure"], indirect=True)
def test_local_host_feeds_the_events_queue_to_the_dispatcher(stack, azure_host):
    status, _, _ = call_azure("POST", "/v1/runs", b'{"command": "x"}', ALICE)  # notifies the events queue
    assert status == 201
    waits = []
    assert azure_host.poll_queues(waits.append) == 1
    assert len(jobs(stack)) == 1
    assert azure_host.poll_queues(waits.append) == 0  # deleted after success
    assert waits == [0.1]


@pytest.mark.parametrize("stack", ["azure"], indirect=True)
def test_local_host_retries_a_failing_event_then_poisons_it(stack, azure_host, azurite):
    stack.queue.notify(DispatchEvent(pool="broken"))
    tries = [azure_host.poll_queues(lambda _: False) for _ in range(azure_host.options.max_dequeue_count)]
    assert tries == [1] * azure_host.options.max_dequeue_count
    assert azure_host.poll_queues(lambda _: False) == 0
    name = events_queue_name(stack.settings.prefix)
    assert poison_queue_name(name) == f"{name}-poison"
    poisoned = list(QueueClient.from_connection_string(azurite, poison_queue_name(name)).peek_messages(5))
    assert [DispatchEvent.model_validate_json(base64.b64decode(m.content)).pool for m in poisoned] == ["broken"]


def test_the_pools_view_shows_the_dispatchers_last_count_without_counting(stack):
    """The view reads what the dispatcher's last pass counted (one read a pool, whatever the number
    of runs and workers) and says when; a pool no pass has counted yet is counted by the view."""
    from runplane.services.dispatch import dispatch_pool

    def parked():
        status, _, body = call_lambda("GET", "/v1/pools", headers=ALICE)
        assert status == 200
        [view] = [p for p in json.loads(body)["pools"] if p["name"] == "parked"]
        _, _, again = call_azure("GET", "/v1/pools", headers=ALICE)  # the other front answers the same
        assert [p for p in json.loads(again)["pools"] if p["name"] == "parked"] == [view]
        return view

    def submit(n):
        for _ in range(n):
            spec = RunSpec.model_validate({"command": "x", "queue": "parked"})
            submit_run(stack.ports, Principal(user="alice"), spec, None)

    submit(2)
    assert (parked()["backlog"], parked()["counted_at"]) == (2, None)  # no pass yet: counted now
    pool = stack.pools.get("parked")
    dispatch_pool(stack.ports, pool)
    counted = parked()
    assert counted["backlog"] == 2 and counted["counted_at"] is not None
    submit(1)  # no pass since: the view still shows the last count, and when it was made
    assert parked() == counted
    dispatch_pool(stack.ports, pool)
    assert parked()["backlog"] == 3 and parked()["counted_at"] >= counted["counted_at"]
    # figures no pass has renewed for minutes (a dispatcher failing) are not shown: counted live
    old = stack.pool_states.get("parked")
    stack.pool_states.save(old.model_copy(update={"backlog": 999, "counted_at": time.time() - 3600}))
    assert (parked()["backlog"], parked()["counted_at"]) == (3, None)
