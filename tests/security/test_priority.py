"""Priorities against a hostile second user: a user gives their own runs a priority up to the
pool's ``max_user_priority`` (50 on "parked", the default; 70 on "big", tests/pools.yaml), at
submit or while the run is queued; only an admin goes above it, on anyone's run; another user's
run answers exactly as one that does not exist; a run that is no longer queued keeps its priority
(409); malformed bodies are a 4xx with a message and change nothing. On both clouds' local stacks.

Every test makes users of its own, so its runs are its own.
"""

import contextlib
import json
import uuid

import pytest

from runplane.client import Client, Conflict
from tests.conftest import api_status
from tests.security.conftest import bearer, raw

PARKED = {"command": "echo hi", "queue": "parked"}
BIG = {"command": "echo hi", "queue": "big"}


@pytest.fixture
def people(front, user):
    """``people()``: (a client of a new user, its user name, its bearer headers)."""

    def make():
        name = f"p-{uuid.uuid4().hex[:8]}"
        made = user("admin").request("POST", "/v1/tokens", {"user": name})
        headers = {"Authorization": f"Bearer {made['token']}", "Content-Type": "application/json"}
        return Client(front.api_url, made["token"]), name, headers

    return make


@pytest.fixture
def submit(user):
    """``submit(client, body)``: a run submitted by ``client``; every one is killed afterwards."""
    made = []

    def run(client, body):
        view = client.request("POST", "/v1/runs", body)
        made.append(view["id"])
        return view

    yield run
    admin = user("admin")
    for run_id in made:
        with contextlib.suppress(Conflict):  # the test ended it itself
            admin.request("POST", f"/v1/runs/{run_id}/kill")


def set_priority(client, run_id, priority):
    return client.request("POST", f"/v1/runs/{run_id}/priority", {"priority": priority})


def test_the_owner_moves_a_queued_run_up_to_the_pools_max(people, submit):
    owner, name, _ = people()
    run = submit(owner, PARKED)
    assert (run["priority"], run["spec"]["priority"]) == (50, 50)
    lowered = set_priority(owner, run["id"], 10)
    assert (lowered["priority"], lowered["spec"]["priority"], lowered["state"]) == (10, 10, "queued")
    assert lowered["events"][-1]["message"] == f"priority 50 -> 10 by {name}"
    assert lowered["spec"] | {"priority": 50} == run["spec"]  # nothing else of the run changed
    assert set_priority(owner, run["id"], 50)["priority"] == 50  # back up to the pool's max
    again = set_priority(owner, run["id"], 50)  # the priority it has: nothing written
    assert again["events"] == owner.request("GET", f"/v1/runs/{run['id']}")["events"]
    assert len(again["events"]) == 3
    status, code, message = api_status(lambda: set_priority(owner, run["id"], 51))
    assert (status, code) == (403, "forbidden")
    assert message == "priority 51 is above 50, the most pool parked allows users; only admins may set more"
    assert owner.request("GET", f"/v1/runs/{run['id']}")["priority"] == 50

    big = submit(owner, {**BIG, "priority": 70})  # this pool lets users go up to 70
    assert big["priority"] == 70
    assert set_priority(owner, big["id"], 65)["priority"] == 65
    status, _, message = api_status(lambda: set_priority(owner, big["id"], 71))
    assert status == 403 and "pool big" in message and "above 70" in message


def test_a_priority_above_the_pools_max_at_submit_needs_an_admin(user, people, submit):
    owner, _, _ = people()
    for body, pool, most in [({**PARKED, "priority": 51}, "parked", 50), ({**BIG, "priority": 71}, "big", 70)]:
        status, code, message = api_status(lambda: owner.request("POST", "/v1/runs", body))  # noqa: B023
        assert (status, code) == (403, "forbidden"), message
        assert f"pool {pool}" in message and f"above {most}," in message
    assert owner.request("GET", "/v1/runs")["runs"] == []  # nothing was stored
    assert submit(owner, {**PARKED, "priority": 0})["priority"] == 0
    urgent = submit(user("admin"), {**PARKED, "priority": 100})
    assert (urgent["priority"], urgent["state"]) == (100, "queued")


def test_an_admin_sets_any_priority_on_anyones_run(user, people, submit):
    owner, name, _ = people()
    run = submit(owner, PARKED)
    raised = set_priority(user("admin"), run["id"], 100)
    assert (raised["priority"], raised["owner"]) == (100, name)
    assert raised["events"][-1]["message"] == "priority 50 -> 100 by admin"
    assert set_priority(owner, run["id"], 40)["priority"] == 40  # the owner may lower it...
    status, code, _ = api_status(lambda: set_priority(owner, run["id"], 90))  # ...not raise it again
    assert (status, code) == (403, "forbidden")
    assert owner.request("GET", f"/v1/runs/{run['id']}")["priority"] == 40


def test_another_users_run_looks_exactly_like_a_missing_one(front, people, submit):
    owner, _, _ = people()
    _, _, mallory = people()
    run = submit(owner, PARKED)
    missing = "r-" + uuid.uuid4().hex[:24]
    for priority in (10, 50, 99):  # above the max too: a 404, never a 403 that tells the run exists
        body = json.dumps({"priority": priority}).encode()
        theirs = raw(front, "POST", f"/v1/runs/{run['id']}/priority", body, mallory)
        absent = raw(front, "POST", f"/v1/runs/{missing}/priority", body, mallory)
        assert theirs[0] == absent[0] == 404
        assert json.dumps(theirs[2]).replace(run["id"], "ID") == json.dumps(absent[2]).replace(missing, "ID")
    seen = owner.request("GET", f"/v1/runs/{run['id']}")
    assert (seen["priority"], len(seen["events"])) == (50, 1)  # untouched


def test_only_runs_write_may_set_a_priority(user, submit):
    run = submit(user("writer"), PARKED)  # alice, with runs:write alone
    for who in ("reader", "empty"):
        status, code, message = api_status(lambda: set_priority(user(who), run["id"], 10))  # noqa: B023
        assert (status, code) == (403, "forbidden") and "'runs:write'" in message
    assert set_priority(user("writer"), run["id"], 10)["priority"] == 10


def test_a_run_that_is_not_queued_keeps_its_priority(user, people, submit):
    owner, _, _ = people()
    run = submit(owner, PARKED)
    owner.request("POST", f"/v1/runs/{run['id']}/kill")
    # whatever the number: above the pool's max too, a finished run is a 409, not a 403
    for client, priority in [(owner, 10), (user("admin"), 10), (owner, 51), (owner, 100), (user("admin"), 100)]:
        status, code, message = api_status(lambda: set_priority(client, run["id"], priority))  # noqa: B023
        assert (status, code) == (409, "conflict"), priority
        assert message == f"run {run['id']} is killed: only a queued run's priority can change"
    seen = owner.request("GET", f"/v1/runs/{run['id']}")
    assert (seen["state"], seen["priority"]) == ("killed", 50)


@pytest.mark.parametrize(
    ("data", "status", "fragment"),
    [
        (b"{}", 422, "priority: Field required"),
        (b'{"priority": -1}', 422, "priority: Input should be greater than or equal to 0"),
        (b'{"priority": 101}', 422, "priority: Input should be less than or equal to 100"),
        (b'{"priority": "high"}', 422, "priority: Input should be a valid integer"),
        (b'{"priority": "50"}', 422, "priority: Input should be a valid integer"),
        (b'{"priority": 1.5}', 422, "priority: Input should be a valid integer"),
        (b'{"priority": true}', 422, "priority: Input should be a valid integer"),
        (b'{"priority": null}', 422, "priority: Input should be a valid integer"),
        (b'{"priority": [40]}', 422, "priority: Input should be a valid integer"),
        (b'{"priority": 1e400}', 422, "priority: Input should be a valid integer"),
        (b'{"priority": ' + b"9" * 400 + b"}", 422, "priority"),
        (b'{"priority": 40, "owner": "mallory"}', 422, "owner: Extra inputs are not permitted"),
        (b'{"priority": 40, "fair_tag": 0}', 422, "fair_tag: Extra inputs are not permitted"),
        (b'{"priority": NaN}', 400, "NaN is not a number"),
        (b"[40]", 400, "body must be a JSON object"),
        (b"40", 400, "body must be a JSON object"),
        (b"", 400, "body must be a JSON object"),
        (b"{", 400, "not valid JSON"),
        (b'{"priority": 40, "x": "' + b"y" * 300_000 + b'"}', 413, "body is larger than"),
    ],
)
def test_malformed_bodies_are_refused_with_a_message(front, people, submit, data, status, fragment):
    owner, _, headers = people()
    run = submit(owner, PARKED)
    got, _, answer = raw(front, "POST", f"/v1/runs/{run['id']}/priority", data, headers)
    assert got == status, answer
    assert fragment in answer["error"]["message"]
    seen = owner.request("GET", f"/v1/runs/{run['id']}")
    assert (seen["priority"], len(seen["events"])) == (50, 1)  # nothing was written


@pytest.mark.parametrize(
    ("priority", "fragment"),
    [
        ("high", "priority: Input should be a valid integer"),
        (True, "priority: Input should be a valid integer"),
        (1.5, "priority: Input should be a valid integer"),
        (-1, "priority: Input should be greater than or equal to 0"),
        (101, "priority: Input should be less than or equal to 100"),
    ],
)
def test_malformed_priorities_at_submit_are_refused(people, priority, fragment):
    owner, _, _ = people()
    status, code, message = api_status(lambda: owner.request("POST", "/v1/runs", {**PARKED, "priority": priority}))
    assert (status, code) == (422, "invalid_request") and fragment in message, message
    assert owner.request("GET", "/v1/runs")["runs"] == []


def test_wrong_methods_are_405_with_allow(front):
    for method in ("GET", "PUT", "DELETE"):
        status, headers, answer = raw(front, method, "/v1/runs/r-1/priority", b"{}", bearer("admin"))
        assert (status, headers["allow"], answer["error"]["code"]) == (405, "POST", "method_not_allowed")
