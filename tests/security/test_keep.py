"""Keeping a run from its pool's retention, against a hostile second user: only its owner (or an admin)
keeps it or lets it go; another user's run answers exactly as one that does not exist, and stays as
it was; a body that is not ``{"keep": bool}`` is a 4xx with a message and changes nothing; an id that
cannot be a run's is a 404. On both clouds' local stacks.

Every test makes users of its own, so its runs are its own.
"""

import contextlib
import json
import uuid

import pytest

from runplane.client import Conflict
from tests.security.conftest import raw

PARKED = {"command": "echo hi", "queue": "parked"}
KEPT = {"kept": True, "outputs_until": None, "logs_until": None, "record_until": None, "deleted": []}


@pytest.fixture
def parked(user):
    """``parked(client)``: a queued run of ``client``'s that no worker takes; killed afterwards."""
    made = []

    def submit(client):
        view = client.request("POST", "/v1/runs", PARKED)
        made.append(view["id"])
        return view

    yield submit
    for run_id in made:
        with contextlib.suppress(Conflict):  # the test ended it itself
            user("admin").request("POST", f"/v1/runs/{run_id}/kill")


def keep(client, run_id, keep=True):
    return client.request("POST", f"/v1/runs/{run_id}/keep", {"keep": keep})


def refused_alike(front, headers, run_id):
    """Every keep and let-go of ``run_id`` by the holder of ``headers`` answers as for a run that does
    not exist."""
    missing = "r-" + uuid.uuid4().hex[:24]
    for wanted in (True, False):
        body = json.dumps({"keep": wanted}).encode()
        theirs = raw(front, "POST", f"/v1/runs/{run_id}/keep", body, headers)
        absent = raw(front, "POST", f"/v1/runs/{missing}/keep", body, headers)
        assert theirs[0] == absent[0] == 404
        assert json.dumps(theirs[2]).replace(run_id, "ID") == json.dumps(absent[2]).replace(missing, "ID")


def test_another_users_run_cannot_be_kept_or_let_go_and_looks_missing(front, user, people, parked):
    owner, _ = people()
    _, mallory = people()
    run = parked(owner)
    kept = keep(owner, run["id"])
    assert kept["retention"] == KEPT  # a run that has not ended may be kept
    refused_alike(front, mallory, run["id"])
    seen = owner.request("GET", f"/v1/runs/{run['id']}")
    assert (seen["retention"], seen["revision"]) == (KEPT, kept["revision"])  # untouched
    owner.request("POST", f"/v1/runs/{run['id']}/kill")
    ended = owner.request("GET", f"/v1/runs/{run['id']}")
    refused_alike(front, mallory, run["id"])
    seen = owner.request("GET", f"/v1/runs/{run['id']}")
    assert (seen["retention"], seen["revision"]) == (KEPT, ended["revision"])
    let_go = keep(user("admin"), run["id"], False)  # an admin may, as for kill
    assert let_go["retention"]["kept"] is False and let_go["state"] == "killed"
    assert owner.request("GET", f"/v1/runs/{run['id']}")["retention"]["kept"] is False


BAD_BODIES = [
    (b'{"keep": "yes"}', 422, "keep: Input should be a valid boolean"),
    (b'{"keep": 1}', 422, "keep: Input should be a valid boolean"),
    (b'{"keep": null}', 422, "keep: Input should be a valid boolean"),
    (b'{"keep": true, "owner": "mallory"}', 422, "owner: Extra inputs are not permitted"),
    (b'{"keep": true, "until": 4102444800}', 422, "until: Extra inputs are not permitted"),
    (b"[true]", 400, "body must be a JSON object"),
    (b"true", 400, "body must be a JSON object"),
    (b"", 400, "body must be a JSON object"),
    (b"keep", 400, "not valid JSON"),
    (b'{"keep": true, "x": "' + b"y" * 300_000 + b'"}', 413, "body is larger than"),
]


def test_malformed_bodies_and_impossible_ids_are_refused_with_a_message(front, people, parked):
    owner, headers = people()
    run = parked(owner)
    path = f"/v1/runs/{run['id']}/keep"
    for data, status, fragment in BAD_BODIES:
        got, _, answer = raw(front, "POST", path, data, headers)
        assert (got, fragment in answer["error"]["message"]) == (status, True), (data[:40], answer)
    for bad in ("r-" + "0" * 100, "r-%2E%2E", "not%20a%20run", "r-1%00"):
        got, _, answer = raw(front, "POST", f"/v1/runs/{bad}/keep", b'{"keep": true}', headers)
        assert got == 404 and answer["error"]["code"] == "not_found", (bad, answer)
    seen = owner.request("GET", f"/v1/runs/{run['id']}")
    assert "retention" not in seen and seen["revision"] == run["revision"]  # nothing was written
