"""Runs that wait for runs against a hostile second user and hostile bodies, on both clouds' local
stacks: another user's run or sweep is none to wait for (and waiting for it is refused without
touching it), every bad ``after``/``after_sweep`` is a 4xx with a message that stores nothing,
and a run that ended without success cannot be waited for."""

import json

import pytest

from tests.conftest import api_status, wait_for
from tests.security.conftest import raw

PARKED = {"command": "echo hi", "queue": "parked"}


def body(**extra):
    return json.dumps({**PARKED, **extra}).encode()


HOSTILE = [
    (body(after="r-000000000000000000000000"), 422, "after: Input should be a valid list"),
    (body(after=[1]), 422, "after.0: Input should be a valid string"),
    (body(after=["r-1/../x"]), 422, "after.0: String should match pattern"),
    (body(after=["r-" + "a" * 80]), 422, "after.0: String should match pattern"),
    (body(after=["r-x\u0000"]), 422, "after.0: String should match pattern"),
    (body(after=[f"r-{i}" for i in range(33)]), 422, "after: List should have at most 32 items"),
    (body(after=None), 422, "after: Input should be a valid list"),
    (body(after_sweep=["s-1"]), 422, "after_sweep: Input should be a valid string"),
    (body(after_sweep="sweep:s-1"), 422, "after_sweep: String should match pattern"),
    (body(after=["r-000000000000000000000000"]), 404, "after: run r-000000000000000000000000 not found"),
    (body(after_sweep="s-000000000000000000000000"), 404, "after_sweep: sweep s-000000000000000000000000 not found"),
]


@pytest.mark.parametrize(("data", "status", "fragment"), HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_waits_get_a_4xx_with_a_message_and_store_nothing(front, mallory, data, status, fragment):
    client, token = mallory
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    got, _, answer = raw(front, "POST", "/v1/runs", data, headers)
    assert got == status, answer
    assert fragment in answer["error"]["message"], answer
    assert set(answer) == {"error"} and "Traceback" not in json.dumps(answer)
    assert client.request("GET", "/v1/runs")["runs"] == []


def test_another_users_run_or_sweep_is_none_to_wait_for_and_is_left_as_it_was(front, user, mallory):
    alice, admin = user("alice"), user("admin")
    mallory_client, _ = mallory
    run = alice.request("POST", "/v1/runs", PARKED)
    sweep = alice.request("POST", "/v1/sweeps", {"run": PARKED, "count": 2, "max_parallel": 1})
    for who in (mallory_client, admin):  # an admin too: a run waits only for its owner's runs
        for extra in (
            {"after": [run["id"]]},
            {"inputs": {"d": f"run:{run['id']}/out"}},
            {"after_sweep": sweep["id"]},
        ):
            status, code, message = api_status(lambda: who.request("POST", "/v1/runs", {**PARKED, **extra}))  # noqa: B023
            assert (status, code) == (404, "not_found"), extra
            assert "not found" in message
        status, code, _ = api_status(
            lambda: who.request("POST", "/v1/sweeps", {"run": {**PARKED, "after": [run["id"]]}})  # noqa: B023
        )
        assert (status, code) == (404, "not_found")
    # a sweep's id is no run, a run's id no sweep
    for extra in ({"after": [sweep["id"]]}, {"after_sweep": run["id"]}):
        status, code, _ = api_status(lambda: alice.request("POST", "/v1/runs", {**PARKED, **extra}))  # noqa: B023
        assert (status, code) == (404, "not_found"), extra
    # nothing waits for alice's run: mallory's tries wrote nothing to it
    seen = alice.request("GET", f"/v1/runs/{run['id']}")
    assert seen["state"] == "queued" and seen["waiting_on"] == []
    assert mallory_client.request("GET", "/v1/runs")["runs"] == []
    alice.request("POST", f"/v1/runs/{run['id']}/kill")
    alice.request("POST", f"/v1/sweeps/{sweep['id']}/kill")


def test_a_run_that_ended_without_success_cannot_be_waited_for_and_a_waiting_run_can_be_killed(front, mallory):
    client, _ = mallory
    first = client.request("POST", "/v1/runs", PARKED)
    waiting = client.request("POST", "/v1/runs", {**PARKED, "after": [first["id"]]})
    assert waiting["state"] == "queued" and waiting["waiting_on"] == [first["id"]]
    assert waiting["waiting_reason"] == f"waiting for run {first['id']} (queued)"
    killed = client.request("POST", f"/v1/runs/{waiting['id']}/kill")
    assert killed["state"] == "killed" and killed["waiting_on"] == []
    late = client.request("POST", "/v1/runs", {**PARKED, "after": [first["id"]]})
    client.request("POST", f"/v1/runs/{first['id']}/kill")
    status, code, message = api_status(lambda: client.request("POST", "/v1/runs", {**PARKED, "after": [first["id"]]}))
    assert (status, code) == (422, "unschedulable") and "ended killed" in message
    # the kill's event reaches the dispatcher, which ends what waited for the run
    ended = wait_for(
        lambda: (r := client.request("GET", f"/v1/runs/{late['id']}"))["state"] == "failed" and r,
        timeout=60,
        what="the waiting run to fail",
    )
    assert ended["failure"]["reason"] == "dependency_failed"
    assert ended["failure"]["message"].startswith(f"run {first['id']} ended killed")
