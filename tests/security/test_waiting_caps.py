"""On both fronts, through the API: a user's waiting runs and unfinished sweeps have a cap per
pool, shown in the pools view, and going past it is a 422 that names it; another user's are not
counted, and a run or sweep that ends makes room."""

import uuid

from runplane.client import Client
from tests.conftest import api_status


def fresh_user(front, who):
    made = who.request("POST", "/v1/tokens", {"user": f"flood-{uuid.uuid4().hex[:8]}"})
    return Client(front.api_url, made["token"])


CAPPED = {"command": "true", "queue": "capped"}


def test_a_users_waiting_runs_and_open_sweeps_have_a_cap_named_in_the_refusal(front, user):
    admin = user("admin")
    flooder, other = fresh_user(front, admin), fresh_user(front, admin)
    [capped] = [p for p in flooder.request("GET", "/v1/pools")["pools"] if p["name"] == "capped"]
    assert (capped["max_waiting_runs"], capped["max_open_sweeps"]) == (2, 1)  # the caps are shown
    up = flooder.request("POST", "/v1/runs", CAPPED)
    first = [flooder.request("POST", "/v1/runs", {**CAPPED, "after": [up["id"]]}) for _ in range(2)]
    assert all(run["waiting_on"] == [up["id"]] for run in first)
    status, code, message = api_status(lambda: flooder.request("POST", "/v1/runs", {**CAPPED, "after": [up["id"]]}))
    assert (status, code) == (422, "not_allowed"), message
    assert "at most 2 may wait" in message and "pool capped" in message
    # the cap is the user's: another's waiting runs go on
    theirs = other.request("POST", "/v1/runs", CAPPED)
    assert other.request("POST", "/v1/runs", {**CAPPED, "after": [theirs["id"]]})["waiting_on"] == [theirs["id"]]
    # it counts runs that wait now: one killed makes room
    flooder.request("POST", f"/v1/runs/{first[0]['id']}/kill")
    assert flooder.request("POST", "/v1/runs", {**CAPPED, "after": [up["id"]]})["waiting_on"] == [up["id"]]

    sweep = {"run": CAPPED, "count": 2, "max_parallel": 1}
    made = flooder.request("POST", "/v1/sweeps", sweep)
    status, code, message = api_status(lambda: flooder.request("POST", "/v1/sweeps", sweep))
    assert (status, code) == (422, "not_allowed"), message
    assert "at most 1 may be open" in message
    flooder.request("POST", f"/v1/sweeps/{made['id']}/kill")
    assert flooder.request("POST", "/v1/sweeps", sweep)["id"] != made["id"]
