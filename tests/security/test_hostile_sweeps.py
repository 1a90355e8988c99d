"""Sweeps against a hostile second user and hostile bodies, on both clouds' local stacks: every
bad body is a 4xx with a message that stores nothing, another user's sweep (and its members) is
one that does not exist, and cursors and ids not made here are refused."""

import base64
import json

import pytest

from tests.conftest import api_status
from tests.security.conftest import bearer, raw

PARKED = {"command": "echo hi", "queue": "parked"}


def sweep(**extra):
    return json.dumps({"run": PARKED, **extra}).encode()


HOSTILE = [
    (b'{"run": {"command": "x"}, "count": NaN}', 400, "NaN is not a number"),
    (b'{"run": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "nests deeper than 32 levels"),
    (sweep(count=10_001), 422, "count: Input should be less than or equal to 10000"),
    (sweep(count="5"), 422, "count: Input should be a valid integer"),
    (sweep(count=True), 422, "count: Input should be a valid integer"),
    (sweep(count=0), 422, "count: Input should be greater than or equal to 1"),
    (sweep(max_parallel=0), 422, "max_parallel: Input should be greater than or equal to 1"),
    (sweep(parameters={"A": list(range(101)), "B": list(range(100))}), 422, "the sweep has 10100 members"),
    (sweep(parameters={"A": []}), 422, "parameter 'A' has no values"),
    (sweep(parameters={"A": [1]}, count=10_000, max_parallel=2), 201, ""),
    (sweep(parameters={"RUNPLANE_SWEEP_ID": ["x"]}), 422, "the RUNPLANE_ prefix is reserved"),
    (sweep(parameters={"LD_PRELOAD": ["/tmp/x.so"]}), 422, "changes the dynamic loader"),
    (sweep(parameters={"A=B": ["x"]}), 422, "environment variable name 'A=B' is not valid"),
    (sweep(parameters={"A": ["x\u0000y"]}), 422, "holds the control character \\x00"),
    (sweep(parameters={"A": ["x" * 1001]}), 422, "at most 1000 characters"),
    (sweep(parameters={"A": [{"nested": 1}]}), 422, "parameters.A.0"),
    (sweep(parameters={"A": [None]}), 422, "parameters.A.0"),
    (sweep(parameters={f"P{i}": [1] for i in range(33)}), 422, "at most 32 parameters"),
    (sweep(parameters=["A"]), 422, "parameters: Input should be a valid dictionary"),
    (json.dumps({"run": {**PARKED, "env": {"A": "1"}}, "parameters": {"A": [2]}}).encode(), 422, "also in run.env"),
    (
        json.dumps({"run": {**PARKED, "env": {f"E{i}": "x" for i in range(256)}}, "parameters": {"P": [1]}}).encode(),
        422,
        "more than 256 environment variables together",
    ),
    (sweep(parameters={"A": ["x" * 1000] * 200}, count=50), 413, "bytes to keep"),
    (sweep(name="a\nb"), 422, "name: must be printable text on one line"),
    (sweep(name="grid\u2067x"), 422, "name: holds \\u2067"),
    (sweep(extra=1), 422, "extra: Extra inputs are not permitted"),
    (b'{"count": 2}', 422, "run: Field required"),
    (json.dumps({"run": {**PARKED, "env": {"LD_AUDIT": "x"}}}).encode(), 422, "changes the dynamic loader"),
    (json.dumps({"run": {**PARKED, "queue": "nope"}}).encode(), 422, "nope"),
    (json.dumps({"run": {**PARKED, "inputs": {"d": "run:r-000000000000000000000000"}}}).encode(), 404, "not found"),
    (json.dumps({"run": {**PARKED, "priority": 99}}).encode(), 403, "priority 99 is above 50"),
]


@pytest.mark.parametrize(("data", "status", "fragment"), HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_sweeps_get_a_4xx_with_a_message_and_store_nothing(front, mallory, data, status, fragment):
    client, token = mallory
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    got, _, answer = raw(front, "POST", "/v1/sweeps", data, headers)
    assert got == status, answer
    if status == 201:  # 10,000 members in one call: the sweep is one record, a member released
        assert (answer["size"], answer["waiting"]) == (10_000, 9_998)
        client.request("POST", f"/v1/sweeps/{answer['id']}/kill")
        return
    assert fragment in answer["error"]["message"], answer
    assert set(answer) == {"error"} and "Traceback" not in json.dumps(answer)
    assert [s for s in client.request("GET", "/v1/sweeps")["sweeps"] if s["size"] != 10_000] == []


def test_another_users_sweep_and_its_members_are_none_of_theirs(front, user):
    alice, bob, admin = user("alice"), user("bob"), user("admin")
    made = alice.request("POST", "/v1/sweeps", {"run": PARKED, "count": 3, "max_parallel": 1})
    path = f"/v1/sweeps/{made['id']}"
    member = alice.request("GET", "/v1/runs", query={"sweep": made["id"]})["runs"][0]
    for method, where, body in [
        ("GET", path, None),
        ("PATCH", path, {"max_parallel": 3}),
        ("POST", f"{path}/kill", None),
        ("POST", f"{path}/retry", None),
        ("GET", "/v1/runs?sweep=" + made["id"], None),
        ("POST", f"/v1/runs/{member['id']}/kill", None),
    ]:
        status, code, message = api_status(lambda: bob.request(method, where, body))  # noqa: B023
        assert (status, code) == (404, "not_found"), (method, where)
        assert made["id"] not in message or "not found" in message
    assert made["id"] not in [s["id"] for s in bob.request("GET", "/v1/sweeps")["sweeps"]]
    status, code, _ = api_status(lambda: bob.request("GET", "/v1/sweeps", query={"owner": "alice"}))
    assert (status, code) == (403, "forbidden")
    # nothing bob tried changed it; an admin may read it
    after = admin.request("GET", path)
    assert (after["max_parallel"], after["killed"], after["waiting"]) == (1, False, 2)
    assert alice.request("GET", f"/v1/runs/{member['id']}")["state"] == "queued"
    alice.request("POST", f"{path}/kill")


def _b64(data):
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    ["zzz", _b64({"after": "x"}), _b64({"id": "s-1", "owner": "sweeps#bob", "created_at": 1}), "A" * 5000],
)
def test_crafted_sweep_cursors_are_400(front, user, cursor):
    status, code, message = api_status(lambda: user("alice").request("GET", "/v1/sweeps", query={"cursor": cursor}))
    assert (status, code) == (400, "bad_request") and "cursor is not valid" in message


@pytest.mark.parametrize("cursor", ["-1", "x", "99999999", "1e3", "00000001", "\u00b2", "\u0663"])
def test_crafted_member_cursors_are_400(front, user, cursor):
    alice = user("alice")
    made = alice.request("POST", "/v1/sweeps", {"run": PARKED, "count": 2})
    query = {"sweep": made["id"], "cursor": cursor}
    status, code, _ = api_status(lambda: alice.request("GET", "/v1/runs", query=query))
    assert (status, code) == (400, "bad_request")
    alice.request("POST", f"/v1/sweeps/{made['id']}/kill")


@pytest.mark.parametrize("path", ["/v1/sweeps/%00", "/v1/sweeps/" + "s" * 3000, "/v1/sweeps/..", "/v1/sweeps/r-1"])
def test_sweep_ids_that_cannot_be_sweeps_are_404(front, path):
    status, _, answer = raw(front, "GET", path, headers=bearer("alice"))
    assert status == 404 and answer["error"]["code"] == "not_found"


def test_a_run_id_is_no_sweep_and_a_sweep_id_no_run(front, user):
    alice = user("alice")
    run = alice.request("POST", "/v1/runs", PARKED)
    made = alice.request("POST", "/v1/sweeps", {"run": PARKED, "count": 1})
    for path in (f"/v1/sweeps/{run['id']}", f"/v1/runs/{made['id']}", f"/v1/runs/{made['id']}/kill"):
        method = "POST" if path.endswith("kill") else "GET"
        status, code, _ = api_status(lambda: alice.request(method, path))  # noqa: B023
        assert (status, code) == (404, "not_found"), path
