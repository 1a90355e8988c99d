"""A run's labels from a hostile user: what cannot be a label is refused with a 422 that names the
field, and a label filter shows only the caller's own runs, whoever else uses the same label. On
both clouds' local stacks."""

import json
import uuid

import pytest

from tests.security.conftest import bearer, raw

PARKED = {"command": "echo hi", "queue": "parked"}


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        ({"Team": "vision"}, "labels.Team.[key]"),  # upper case: not a label's key
        ({"-team": "vision"}, "labels.-team.[key]"),
        ({"k" * 64: "v"}, "[key]: String should match pattern"),
        ({f"k{i}": "v" for i in range(33)}, "labels: Dictionary should have at most 32 items"),
        ({"team": "x" * 129}, "labels.team: String should have at most 128 characters"),
        ({"team": "vis\u202eion"}, "labels: label 'team' holds \\u202e"),  # right-to-left override
        ({"team": "vis\nion"}, "labels: label 'team' holds \\x0a"),
        ({"team": 3}, "labels.team: Input should be a valid string"),
        (["team=vision"], "labels: Input should be a valid dictionary"),
    ],
)
def test_what_cannot_be_a_label_is_refused_naming_the_field(front, labels, fragment):
    status, _, body = raw(front, "POST", "/v1/runs", json.dumps({**PARKED, "labels": labels}).encode(), bearer("bob"))
    assert status == 422, body
    assert fragment in body["error"]["message"]


@pytest.mark.parametrize("label", ["Team=vision", "team", "=vision", "team=" + "x" * 129])
def test_a_label_filter_that_cannot_match_a_label_is_refused(front, label):
    status, _, body = raw(front, "GET", f"/v1/runs?label={label}", headers=bearer("bob"))
    assert status == 422, body
    assert body["error"]["message"].startswith(f"label {label[:80]!r} is not key=value")


def test_a_label_filter_shows_only_the_callers_runs(front, user, mallory):
    mine, _ = mallory
    label = {"experiment": f"e-{uuid.uuid4().hex[:8]}"}
    alices = user("alice").request("POST", "/v1/runs", {**PARKED, "labels": label})
    theirs = mine.request("POST", "/v1/runs", {**PARKED, "labels": label})
    unlabelled = mine.request("POST", "/v1/runs", PARKED)
    wanted = {"label": f"experiment={label['experiment']}", "limit": 500}
    assert [r["id"] for r in mine.request("GET", "/v1/runs", query=wanted)["runs"]] == [theirs["id"]]
    assert alices["id"] not in json.dumps(mine.request("GET", "/v1/runs", query=wanted))
    assert [r["id"] for r in user("alice").request("GET", "/v1/runs", query=wanted)["runs"]] == [alices["id"]]
    as_admin = user("admin").request("GET", "/v1/runs", query={**wanted, "owner": "alice"})["runs"]
    assert [r["id"] for r in as_admin] == [alices["id"]]
    assert theirs["spec"]["labels"] == label
    assert "labels" not in unlabelled["spec"]  # left out at its default, as the previous SDK reads it
