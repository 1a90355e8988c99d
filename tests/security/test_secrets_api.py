"""Secrets against a hostile second user, on both clouds' local stacks: no answer ever holds a value
(an administrator's included); a run or a sweep naming another user's secret, or a group's the
caller is not in, is refused exactly as one naming a secret that does not exist; only the owner
removes or replaces their own, and only administrators a group's; bad names and values are a 4xx
with a message that never echoes the value, never a 5xx.

Every test makes users and groups of its own, so nothing here meets another test's secrets.
"""

import json
import uuid

import pytest

from tests.security.conftest import Caller

PARKED = {"command": "echo hi", "queue": "parked"}


def fresh(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def people(front):
    """``people(groups=(), scopes=None, name=None)``: a Caller with a new token (of a new user, or of
    ``name``); ``people.admin``: the admin's."""
    admin = Caller(front, "admin-token", "admin")

    def make(groups=(), scopes=None, name=None):
        name = name or fresh("s")
        body = {"user": name, "groups": list(groups)} | ({"scopes": scopes} if scopes is not None else {})
        status, made = admin("POST", "/v1/tokens", body)
        assert status == 201, made
        return Caller(front, made["token"], name)

    make.admin = admin
    return make


def _value():
    return f"sekrit-{uuid.uuid4().hex}"


def test_another_users_secret_reads_exactly_as_one_that_does_not_exist(people):
    alice, bob = people(), people()
    assert alice("PUT", "/v1/secrets/wandb", {"value": _value()})[0] == 200
    refused = {}
    for what, body in [
        ("theirs", {**PARKED, "secrets": {"WANDB_API_KEY": "wandb"}}),
        ("missing", {**PARKED, "secrets": {"WANDB_API_KEY": "nothing"}}),
        ("their login", {**PARKED, "image_pull_secret": "wandb"}),
        ("missing login", {**PARKED, "image_pull_secret": "nothing"}),
    ]:
        refused[what] = bob("POST", "/v1/runs", body)
        refused[f"{what} (sweep)"] = bob("POST", "/v1/sweeps", {"run": body, "count": 2})
    assert refused["theirs"] == (404, {"error": {"code": "not_found", "message": "secret wandb does not exist"}})
    assert refused["missing"] == (404, {"error": {"code": "not_found", "message": "secret nothing does not exist"}})
    for what in ("theirs", "missing"):
        assert refused[f"{what} (sweep)"] == refused[what] == refused[f"{what.replace('theirs', 'their')} login"]
    assert bob("GET", "/v1/runs")[1]["runs"] == [] and bob("GET", "/v1/sweeps")[1]["sweeps"] == []  # none stored
    made = alice("POST", "/v1/runs", {**PARKED, "secrets": {"WANDB_API_KEY": "wandb"}})
    assert made[0] == 201 and made[1]["spec"]["secrets"] == {"WANDB_API_KEY": "wandb"}


def test_a_group_secret_is_set_by_admins_and_used_by_members_only(people):
    group = fresh("g")
    member, outsider = people(groups=[group]), people(groups=[fresh("g")])
    value = _value()
    for caller in (member, outsider):
        for method, body in (("PUT", {"value": "mine now"}), ("DELETE", None)):
            status, answer = caller(method, f"/v1/groups/{group}/secrets/hf", body)
            assert (status, answer["error"]["code"]) == (403, "forbidden")
    set_ = people.admin("PUT", f"/v1/groups/{group}/secrets/hf", {"value": value})
    assert set_[0] == 200 and set_[1]["ref"] == f"{group}/hf" and set_[1]["scope"] == "group"
    for caller in (member, outsider):
        assert caller("DELETE", f"/v1/groups/{group}/secrets/hf")[0] == 403
    assert member("POST", "/v1/runs", {**PARKED, "secrets": {"HF_TOKEN": f"{group}/hf"}})[0] == 201
    refused = outsider("POST", "/v1/runs", {**PARKED, "secrets": {"HF_TOKEN": f"{group}/hf"}})
    missing = outsider("POST", "/v1/runs", {**PARKED, "secrets": {"HF_TOKEN": f"{group}/nothing"}})
    assert refused[0] == missing[0] == 404
    assert refused[1]["error"]["message"] == f"secret {group}/hf does not exist"
    assert missing[1]["error"]["message"] == f"secret {group}/nothing does not exist"
    assert people.admin("DELETE", f"/v1/groups/{group}/secrets/hf") == (204, None)
    assert people.admin("DELETE", f"/v1/groups/{group}/secrets/hf")[0] == 404


def test_a_user_replaces_and_removes_only_their_own(people):
    alice, bob = people(), people()
    alice_value, bob_value = _value(), _value() + "-longer"
    assert alice("PUT", "/v1/secrets/token", {"value": alice_value})[0] == 200
    status, mine = bob("PUT", "/v1/secrets/token", {"value": bob_value})  # his own, of the same name
    assert status == 200 and (mine["owner"], mine["size"]) == (bob.name, len(bob_value))
    assert bob("DELETE", "/v1/secrets/token") == (204, None)
    assert bob("DELETE", "/v1/secrets/token")[0] == 404
    [hers] = alice("GET", "/v1/secrets")[1]["secrets"]
    assert (hers["owner"], hers["updated_by"], hers["size"]) == (alice.name, alice.name, len(alice_value))
    assert alice("POST", "/v1/runs", {**PARKED, "secrets": {"T": "token"}})[0] == 201


def test_a_list_holds_the_callers_own_and_their_groups_and_no_value_is_ever_answered(people):
    group, other = fresh("g"), fresh("g")
    member, stranger = people(groups=[group]), people(groups=[other])
    reader = people(groups=[group], scopes=["runs:read"], name=member.name)
    values = [_value() for _ in range(4)]
    answers = [
        member("PUT", "/v1/secrets/wandb", {"value": values[0]}),
        stranger("PUT", "/v1/secrets/wandb", {"value": values[1]}),
        people.admin("PUT", f"/v1/groups/{group}/secrets/hf", {"value": values[2]}),
        people.admin("PUT", f"/v1/groups/{other}/secrets/hf", {"value": values[3]}),
        member("GET", "/v1/secrets"),
        reader("GET", "/v1/secrets"),
        stranger("GET", "/v1/secrets"),
        people.admin("GET", f"/v1/groups/{group}/secrets"),
        people.admin("GET", "/v1/secrets"),
        member("POST", "/v1/runs", {**PARKED, "secrets": {"W": "wandb", "H": f"{group}/hf"}}),
    ]
    answers.append(member("GET", f"/v1/runs/{answers[-1][1]['id']}"))
    assert all(status in (200, 201) for status, _ in answers), answers
    listed = [(s["ref"], s["scope"], s["owner"]) for s in answers[4][1]["secrets"]]
    assert listed == [("wandb", "user", member.name), (f"{group}/hf", "group", group)]
    assert answers[5] == answers[4]  # runs:read is enough to list
    assert [s["ref"] for s in answers[6][1]["secrets"]] == ["wandb", f"{other}/hf"]
    assert [s["ref"] for s in answers[7][1]["secrets"]] == [f"{group}/hf"]
    assert not {s["owner"] for s in answers[8][1]["secrets"]} & {member.name, stranger.name, group, other}
    every = json.dumps(answers)
    assert not [v for v in values if v in every]
    assert "sealed" not in every and "ciphertext" not in every
    assert set(answers[4][1]["secrets"][0]) == {"name", "ref", "scope", "owner", "size", "updated_at", "updated_by"}


def test_a_run_whose_secret_goes_after_submit_stays_as_submitted(people):
    alice = people()
    alice("PUT", "/v1/secrets/token", {"value": _value()})
    status, run = alice("POST", "/v1/runs", {**PARKED, "secrets": {"T": "token"}})
    assert status == 201
    assert alice("DELETE", "/v1/secrets/token") == (204, None)
    status, now = alice("GET", f"/v1/runs/{run['id']}")
    # the worker that starts it reads the secret then (and ends it secret_unavailable); submit is done
    assert (status, now["state"], now["spec"]["secrets"]) == (200, "queued", {"T": "token"})
    assert alice("POST", "/v1/runs", {**PARKED, "secrets": {"T": "token"}})[0] == 404  # a new one is refused


@pytest.mark.parametrize(
    ("path", "body", "data", "status", "words"),
    [
        ("/v1/secrets/Upper", {"value": "v"}, None, 422, "lower-case letters"),
        ("/v1/secrets/-lead", {"value": "v"}, None, 422, "lower-case letters"),
        ("/v1/secrets/" + "x" * 64, {"value": "v"}, None, 422, "at most 63"),
        ("/v1/secrets/ok", {"value": ""}, None, 422, "at least 1 character"),
        ("/v1/secrets/ok", {"value": "sekrit\0tail"}, None, 422, "NUL"),
        ("/v1/secrets/ok", {"value": 12345}, None, 422, "valid string"),
        ("/v1/secrets/ok", {"value": "sekrit", "scope": "group"}, None, 422, "scope"),
        ("/v1/secrets/ok", {}, None, 422, "value"),
        ("/v1/secrets/ok", None, b'{"value": "sekrit\\ud800"}', 422, "unicode"),
        ("/v1/secrets/ok", {"value": "x" * 32769}, None, 422, "at most 32768"),
        ("/v1/secrets/ok", {"value": "é" * 16385}, None, 413, "at most 32768"),
        ("/v1/secrets/ok", None, b'["sekrit"]', 400, "JSON object"),
        ("/v1/secrets/ok", None, b"sekrit", 400, "not valid JSON"),
        ("/v1/groups/Not_A_Group/secrets/ok", {"value": "sekrit"}, None, 422, "group"),
    ],
)
def test_a_bad_name_or_value_is_a_4xx_that_never_echoes_the_value(people, path, body, data, status, words):
    caller = people.admin if path.startswith("/v1/groups") else people()
    got, answer = caller("PUT", path, body, data)
    assert got == status, answer
    message = answer["error"]["message"]
    assert words in message and "sekrit" not in message and "é" not in message
    if caller is not people.admin:
        assert caller("GET", "/v1/secrets")[1] == {"secrets": []}  # nothing stored


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("DELETE", "/v1/secrets/Upper", 404),
        ("DELETE", "/v1/secrets/nothing", 404),
        ("DELETE", "/v1/groups/Not_A_Group/secrets/ok", 404),
        ("GET", "/v1/groups/Not_A_Group/secrets", 404),
        ("GET", "/v1/secrets/ok", 405),  # no route reads one secret, so none can answer a value
        ("POST", "/v1/secrets", 405),
    ],
)
def test_names_that_cannot_be_and_reads_of_one_secret_are_refused(people, method, path, status):
    caller = people.admin if "/groups/" in path else people()
    assert caller(method, path)[0] == status


def test_a_token_without_the_scope_cannot_set_or_remove(front, people):
    reader = people(scopes=["runs:read"])
    assert reader("PUT", "/v1/secrets/token", {"value": "v"})[0] == 403
    assert reader("DELETE", "/v1/secrets/token")[0] == 403
    assert Caller(front, "empty-token", "eve")("GET", "/v1/secrets")[0] == 403  # a token of no scopes
    assert people()("GET", "/v1/groups/vision/secrets")[0] == 403
