"""The HTTP API through each cloud's front: the AWS local stack (API Gateway v2 events to the
Lambda handler) and the Azure one (``func.HttpRequest``s to the Azure HTTP function, in a process
of its own). Every case runs on both; runs go to the "parked" pool, which never gets a worker,
so they stay queued."""

import json
import urllib.request
import uuid

import pytest

from runplane.client import Client
from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig
from tests.conftest import api_status, wait_for

PARKED = {"command": "echo hi", "queue": "parked"}
AUTH_CASES = [
    ({}, "missing Authorization"),
    ({"Authorization": "Bearer nope"}, "not valid"),
    ({"Authorization": "Basic abc"}, "must be 'Bearer"),
]
BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b"", 400, "JSON object"),
    (b'{"image": "x"}', 422, "command: Field required"),
    (b'{"command": "x", "resources": {"memory": "lots"}}', 422, "resources.memory: cannot read size"),
    (b'{"command": "x", "resources": {"cpus": "many"}}', 422, "resources.cpus"),
    (b'{"command": "x", "unknown": 1}', 422, "unknown: Extra inputs are not permitted"),
    (b'{"command": "x", "queue": "nope"}', 422, "unknown queue 'nope'"),
    (b'{"command": "x", "resources": {"memory": "1t"}}', 422, "the largest pool is big: 2 cpus, 2 gpu, 8g memory"),
    (b'{"command": "x", "resources": {"gpus": 1}, "queue": "parked"}', 422, "asks 1 gpus, pool has 0"),
]


@pytest.fixture(scope="module", params=["aws", "azure"])
def front(request):
    """The local stack of one cloud (both have the users alice, bob and a read-only alice)."""
    return request.getfixturevalue("devstack" if request.param == "aws" else "azure_devstack")


@pytest.fixture(scope="module")
def alice(front):
    return Client(front.api_url, "alice-token")


@pytest.fixture(scope="module")
def bob(front):
    return Client(front.api_url, "bob-token")


@pytest.fixture
def newcomer(front):
    """A user of this test alone: what it lists is what the test made, whatever ran before it."""
    admin = Client(front.api_url, "admin-token")
    made = admin.request("POST", "/v1/tokens", {"user": f"new-{uuid.uuid4().hex[:8]}", "groups": []})
    return Client(front.api_url, made["token"])


def raw(front, method, path, body=None, headers=None, with_type=False):
    req = urllib.request.Request(front.api_url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, data, content_type = resp.status, resp.read(), resp.headers.get("Content-Type")
    except urllib.error.HTTPError as e:
        status, data, content_type = e.code, e.read(), e.headers.get("Content-Type")
    parsed = json.loads(data or b"null")
    return (status, parsed, content_type) if with_type else (status, parsed)


def test_health_and_openapi_need_no_token(front):
    assert raw(front, "GET", "/v1/health") == (200, {"status": "ok"})
    status, doc = raw(front, "GET", "/v1/openapi.json")
    assert status == 200
    assert doc["openapi"].startswith("3.")
    assert {"/v1/runs", "/v1/runs/{run_id}/logs", "/v1/runs/{run_id}/kill"} <= set(doc["paths"])
    assert "command" in doc["components"]["schemas"]["RunSpec"]["properties"]


def test_submit_returns_the_queued_run(alice):
    run = alice.request(
        "POST",
        "/v1/runs",
        {**PARKED, "name": "first", "env": {"A": "1"}, "resources": {"memory": "256m", "time": "90s"}},
    )
    assert run["state"] == "queued"
    assert run["owner"] == "alice"
    assert run["queue"] == "parked"
    assert run["attempt"] == 0
    assert run["spec"]["image"] == "runplane/test-busybox:1"  # the pool's default, resolved
    assert run["spec"]["resources"]["memory"] == 256 * 2**20
    assert run["spec"]["resources"]["time"] == 90
    assert run["waiting_reason"] == "waiting for a worker of pool parked"
    detail = alice.request("GET", f"/v1/runs/{run['id']}")
    assert detail["waiting_reason"].startswith("pool parked has max_workers=0 and no worker is registered")
    assert run["events"][0]["state"] == "queued"
    got = alice.request("GET", f"/v1/runs/{run['id']}")
    assert got["id"] == run["id"] and got["name"] == "first"


def test_pool_is_chosen_by_shape(alice):
    assert alice.request("POST", "/v1/runs", {"command": "x", "resources": {"gpus": 1}})["queue"] == "big"


@pytest.mark.parametrize(("headers", "code_fragment"), AUTH_CASES)
def test_401(front, headers, code_fragment):
    status, body = raw(front, "GET", "/v1/runs", headers=headers)
    assert status == 401
    assert body["error"]["code"] == "unauthorized"
    assert code_fragment in body["error"]["message"]


def test_other_users_run_is_404_and_read_only_token_is_403(front, alice, bob):
    run = alice.request("POST", "/v1/runs", PARKED)
    status, code, message = api_status(lambda: bob.request("GET", f"/v1/runs/{run['id']}"))
    assert (status, code, message) == (404, "not_found", f"run {run['id']} not found")
    assert api_status(lambda: bob.request("POST", f"/v1/runs/{run['id']}/kill"))[0] == 404
    assert api_status(lambda: bob.request("GET", f"/v1/runs/{run['id']}/logs"))[0] == 404
    reader = Client(front.api_url, "reader-token")
    assert reader.request("GET", f"/v1/runs/{run['id']}")["id"] == run["id"]
    status, code, message = api_status(lambda: reader.request("POST", "/v1/runs", PARKED))
    assert (status, code) == (403, "forbidden")
    assert "runs:write" in message
    assert run["id"] not in [r["id"] for r in bob.request("GET", "/v1/runs", query={"limit": 500})["runs"]]


def test_404s(alice):
    assert api_status(lambda: alice.request("GET", "/v1/runs/r-doesnotexist"))[:2] == (404, "not_found")
    assert api_status(lambda: alice.request("POST", "/v1/runs/r-doesnotexist/kill"))[0] == 404
    status, code, message = api_status(lambda: alice.request("GET", "/v1/nothing-here"))
    assert (status, code) == (404, "not_found")
    assert "no route" in message


@pytest.mark.parametrize(("body", "status", "fragment"), BAD_BODIES)
def test_bad_bodies_get_a_clear_4xx_and_store_nothing(front, alice, body, status, fragment):
    before = len(alice.request("GET", "/v1/runs", query={"limit": 500})["runs"])
    got_status, got = raw(
        front, "POST", "/v1/runs", body, {"Authorization": "Bearer alice-token", "Content-Type": "application/json"}
    )
    assert got_status == status
    assert fragment in got["error"]["message"]
    assert set(got) == {"error"}
    assert "Traceback" not in json.dumps(got)
    assert len(alice.request("GET", "/v1/runs", query={"limit": 500})["runs"]) == before


def test_413_large_body(front):
    body = json.dumps({"command": "x" * 300_000}).encode()
    status, got = raw(front, "POST", "/v1/runs", body, {"Authorization": "Bearer alice-token"})
    assert status == 413
    assert got["error"]["code"] == "payload_too_large"


def test_bad_query_parameters(alice):
    assert api_status(lambda: alice.request("GET", "/v1/runs", query={"limit": "x"}))[0] == 400
    assert api_status(lambda: alice.request("GET", "/v1/runs", query={"limit": 0}))[0] == 422
    assert api_status(lambda: alice.request("GET", "/v1/runs", query={"state": "sleeping"}))[0] == 422
    assert api_status(lambda: alice.request("GET", "/v1/runs", query={"cursor": "zzz"}))[0] == 400


def test_idempotent_submit(alice):
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = alice.request("POST", "/v1/runs", PARKED, headers=key)
    again = alice.request("POST", "/v1/runs", PARKED, headers=key)
    assert again["id"] == first["id"]
    assert again["created_at"] == first["created_at"]
    status, code, message = api_status(
        lambda: alice.request("POST", "/v1/runs", {**PARKED, "command": "other"}, headers=key)
    )
    assert (status, code) == (409, "conflict")
    assert "Idempotency-Key" in message
    ids = [r["id"] for r in alice.request("GET", "/v1/runs", query={"limit": 500})["runs"]]
    assert ids.count(first["id"]) == 1


def test_same_key_for_two_users_makes_two_runs(alice, bob):
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    assert (
        alice.request("POST", "/v1/runs", PARKED, headers=key)["id"]
        != bob.request("POST", "/v1/runs", PARKED, headers=key)["id"]
    )


def test_list_paginates_newest_first_and_filters(newcomer):
    ids = [newcomer.request("POST", "/v1/runs", {**PARKED, "name": f"n{i}"})["id"] for i in range(5)]
    other = newcomer.request("POST", "/v1/runs", {"command": "echo hi", "resources": {"gpus": 1}})["id"]  # pool big
    seen, cursor = [], None
    while True:
        page = newcomer.request("GET", "/v1/runs", query={"limit": 2, "cursor": cursor})
        assert len(page["runs"]) <= 2
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [other, *reversed(ids)]  # all of the user's runs, each once, newest first
    newcomer.request("POST", f"/v1/runs/{ids[0]}/kill")
    killed = newcomer.request("GET", "/v1/runs", query={"state": "killed"})["runs"]
    assert [r["id"] for r in killed] == [ids[0]]
    parked = newcomer.request("GET", "/v1/runs", query={"queue": "parked", "limit": 500})["runs"]
    assert [r["id"] for r in parked] == list(reversed(ids))
    newcomer.request("POST", f"/v1/runs/{other}/kill")


def test_kill_queued_run_is_immediate_and_final(alice):
    run = alice.request("POST", "/v1/runs", PARKED)
    killed = alice.request("POST", f"/v1/runs/{run['id']}/kill")
    assert killed["state"] == "killed"
    assert killed["failure"]["reason"] == "killed"
    status, code, _ = api_status(lambda: alice.request("POST", f"/v1/runs/{run['id']}/kill"))
    assert (status, code) == (409, "conflict")


def test_logs_and_outputs_of_a_queued_run(alice):
    run = alice.request("POST", "/v1/runs", PARKED)
    assert alice.request("GET", f"/v1/runs/{run['id']}/logs") == {"data": "", "next_offset": 0, "complete": False}
    outputs = alice.request("GET", f"/v1/runs/{run['id']}/outputs")
    assert outputs == {"files": [], "next_cursor": None, "complete": False}
    assert api_status(lambda: alice.request("GET", f"/v1/runs/{run['id']}/logs", query={"stream": "x"}))[0] == 422


def test_pools_and_workers(alice):
    alice.request("POST", "/v1/runs", PARKED)

    def listed():
        return {p["name"]: p for p in alice.request("GET", "/v1/pools")["pools"]}

    # the dispatcher's pass for the submit counts it (the view shows that count, not its own)
    wait_for(lambda: listed()["parked"]["backlog"] >= 1 and listed()["parked"]["counted_at"], 30, 0.2, "the count")
    pools = listed()
    assert {"default", "parked", "big"} <= set(pools)
    assert pools["big"]["shape"]["gpus"] == 2
    assert isinstance(alice.request("GET", "/v1/workers")["workers"], list)


def test_both_fronts_answer_bad_requests_alike(devstack, azure_devstack):
    """Status, content type and the whole error body: byte for byte the same error on both clouds."""
    alice = {"Authorization": "Bearer alice-token", "Content-Type": "application/json"}
    requests = [("GET", "/v1/runs", None, headers) for headers, _ in AUTH_CASES]
    requests += [("POST", "/v1/runs", body, alice) for body, _, _ in BAD_BODIES]
    requests += [
        ("POST", "/v1/runs", json.dumps({"command": "x" * 300_000}).encode(), alice),
        ("GET", "/v1/runs?limit=x", None, alice),
        ("GET", "/v1/runs?limit=0", None, alice),
        ("GET", "/v1/runs?state=sleeping", None, alice),
        ("GET", "/v1/runs?cursor=zzz", None, alice),
        ("GET", "/v1/runs/r-doesnotexist", None, alice),
        ("POST", "/v1/runs/r-doesnotexist/kill", None, alice),
        ("GET", "/v1/nothing-here", None, alice),
        ("DELETE", "/v1/runs", None, alice),
        ("POST", "/v1/runs", PARKED, {"Authorization": "Bearer reader-token"}),
    ]
    for method, path, body, headers in requests:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        on_aws = raw(devstack, method, path, data, headers, with_type=True)
        on_azure = raw(azure_devstack, method, path, data, headers, with_type=True)
        assert on_aws == on_azure, (method, path, body)
        assert on_aws[0] >= 400 and set(on_aws[1]) == {"error"}


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"cloud": "gcp"}, "unknown cloud 'gcp'; choose one of local, aws, azure"),
        ({"cloud": "azure", "pools_file": "/nonexistent/pools.yaml"}, "/nonexistent/pools.yaml"),
    ],
)
def test_a_local_stack_that_cannot_start_says_why(tmp_path, config, why):
    stack = DevStackProcess(DevConfig(write_dev_file=False, state_dir=tmp_path, **config), tmp_path / "log")
    with pytest.raises(RuntimeError, match="exited while starting") as failed:
        stack.start(timeout=60)
    assert why in str(failed.value)
    assert "Traceback" not in str(failed.value)
