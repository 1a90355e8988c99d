"""Quotas against a hostile second user: only admins set or remove them; a user reads only the
quotas that apply to them (their own, their groups'), and any other answers exactly as one that
does not exist; malformed limits and names are a 4xx with a message, never a 5xx; a run may be
charged only to a group of its owner's. On both clouds' local stacks.

Every test makes users and groups of its own, so no quota here binds another test's runs.
"""

import contextlib
import json
import uuid

import pytest

from runplane.client import Client, NotFound
from tests.conftest import api_status
from tests.security.conftest import bearer, raw

PARKED = {"command": "echo hi", "queue": "parked"}


def fresh(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def people(front, user):
    """``people(groups=())``: (a client of a new user with those groups, its user name)."""

    def make(groups=(), scopes=None):
        name = fresh("q")
        body = {"user": name, "groups": list(groups)} | ({"scopes": scopes} if scopes is not None else {})
        made = user("admin").request("POST", "/v1/tokens", body)
        return Client(front.api_url, made["token"]), name

    return make


@pytest.fixture
def quotas(user):
    """``quotas.set(path, body)`` as the admin; every quota set is removed afterwards."""
    admin = user("admin")
    made = []

    class Quotas:
        @staticmethod
        def set(path, body):
            made.append(path)
            return admin.request("PUT", path, body)

    yield Quotas
    for path in made:
        with contextlib.suppress(NotFound):  # the test removed it itself
            admin.request("DELETE", path)


def test_an_admin_sets_reads_lists_and_removes_quotas(front, user, people, quotas):
    admin = user("admin")
    _, name = people()
    group = fresh("g")
    stored = quotas.set(f"/v1/quotas/users/{name}", {"max_running": 3, "max_gpus": 2, "gpu_hours": 12.5})
    assert {k: stored[k] for k in ("kind", "name", "max_running", "max_gpus", "max_cpus", "gpu_hours", "period")} == {
        "kind": "user",
        "name": name,
        "max_running": 3,
        "max_gpus": 2,
        "max_cpus": None,
        "gpu_hours": 12.5,
        "period": "month",
    }
    assert stored["usage"] | {"period": None} == {
        "running": 0, "gpus": 0, "cpus": 0, "gpu_hours": 0, "cpu_hours": 0, "period": None,
    }  # fmt: skip
    assert stored["usage"]["period"].startswith("month:")
    # a PUT replaces the quota whole: what it leaves out no longer applies
    again = quotas.set(f"/v1/quotas/users/{name}", {"cpu_hours": 50, "period": "day"})
    assert (again["max_gpus"], again["cpu_hours"], again["period"]) == (None, 50, "day")
    assert again["usage"]["period"].startswith("day:")
    assert admin.request("GET", f"/v1/quotas/users/{name}") == again
    quotas.set(f"/v1/quotas/groups/{group}", {})  # no limit: only counts use
    listed = [(q["kind"], q["name"]) for q in admin.request("GET", "/v1/quotas")["quotas"]]
    assert ("user", name) in listed and ("group", group) in listed
    assert listed.index(("user", name)) < listed.index(("group", group))  # users first
    assert admin.request("DELETE", f"/v1/quotas/groups/{group}") is None
    assert api_status(lambda: admin.request("GET", f"/v1/quotas/groups/{group}"))[:2] == (404, "not_found")
    assert api_status(lambda: admin.request("DELETE", f"/v1/quotas/groups/{group}"))[:2] == (404, "not_found")


@pytest.mark.parametrize("who", ["alice", "reader", "writer", "carol", "empty"])
def test_only_admins_set_or_remove_quotas(user, people, quotas, who):
    _, victim = people()
    path = f"/v1/quotas/users/{victim}"
    before = quotas.set(path, {"max_running": 1})
    mallory = user(who)
    for method, target, body in [
        ("PUT", path, {"max_running": 1000}),
        ("PUT", f"/v1/quotas/users/{who}", {}),  # not even their own
        ("PUT", "/v1/quotas/groups/vision", {"max_gpus": 100}),  # nor their group's (carol's)
        ("DELETE", path, None),
        ("DELETE", "/v1/quotas/groups/vision", None),
    ]:
        status, code, message = api_status(lambda: mallory.request(method, target, body))  # noqa: B023
        assert (status, code) == (403, "forbidden"), (method, target)
        assert "'admin'" in message
    assert user("admin").request("GET", path) == before


def test_a_user_reads_their_own_and_their_groups_quotas_only(user, people, quotas):
    group, other = fresh("g"), fresh("g")
    member, member_name = people(groups=[group])
    reader, _ = people(groups=[group], scopes=["runs:read"])
    stranger, stranger_name = people(groups=[other])
    quotas.set(f"/v1/quotas/users/{member_name}", {"max_gpus": 1})
    quotas.set(f"/v1/quotas/users/{stranger_name}", {"max_gpus": 8})
    quotas.set(f"/v1/quotas/groups/{group}", {"gpu_hours": 100})
    quotas.set(f"/v1/quotas/groups/{other}", {"gpu_hours": 900})

    assert member.request("GET", f"/v1/quotas/users/{member_name}")["max_gpus"] == 1
    assert member.request("GET", f"/v1/quotas/groups/{group}")["gpu_hours"] == 100
    assert reader.request("GET", f"/v1/quotas/groups/{group}")["gpu_hours"] == 100  # runs:read is enough
    mine = [(q["kind"], q["name"]) for q in member.request("GET", "/v1/quotas")["quotas"]]
    assert mine == [("user", member_name), ("group", group)]
    assert [q["name"] for q in reader.request("GET", "/v1/quotas")["quotas"]] == [group]
    assert user("bob").request("GET", "/v1/quotas") == {"quotas": []}

    # another user's quota, or a group's not theirs, is exactly a quota that does not exist
    hidden = [
        api_status(lambda: member.request("GET", f"/v1/quotas/users/{stranger_name}")),
        api_status(lambda: member.request("GET", f"/v1/quotas/groups/{other}")),
        api_status(lambda: stranger.request("GET", f"/v1/quotas/users/{member_name}")),
    ]
    assert all(h[:2] == (404, "not_found") for h in hidden)
    admin = user("admin")
    for path in (f"/v1/quotas/users/{stranger_name}", f"/v1/quotas/groups/{other}", f"/v1/quotas/users/{member_name}"):
        admin.request("DELETE", path)
    missing = [
        api_status(lambda: member.request("GET", f"/v1/quotas/users/{stranger_name}")),
        api_status(lambda: member.request("GET", f"/v1/quotas/groups/{other}")),
        api_status(lambda: stranger.request("GET", f"/v1/quotas/users/{member_name}")),
    ]
    assert hidden == missing
    assert api_status(lambda: user("empty").request("GET", "/v1/quotas"))[:2] == (403, "forbidden")


@pytest.mark.parametrize(
    ("data", "status", "fragment"),
    [
        (b'{"max_gpus": -1}', 422, "max_gpus: Input should be greater than or equal to 0"),
        (b'{"gpu_hours": -0.5}', 422, "gpu_hours: Input should be greater than or equal to 0"),
        (b'{"max_cpus": NaN}', 400, "NaN is not a number"),
        (b'{"gpu_hours": Infinity}', 400, "Infinity is not a number"),
        (b'{"cpu_hours": -Infinity}', 400, "-Infinity is not a number"),
        (b'{"gpu_hours": 1e400}', 422, "gpu_hours: Input should be a finite number"),
        (b'{"max_running": 1e400}', 422, "max_running: Input should be a valid integer"),
        (b'{"max_running": 10000000}', 422, "max_running: Input should be less than or equal to 1000000"),
        (b'{"gpu_hours": 1e10}', 422, "gpu_hours: Input should be less than or equal to 1000000000"),
        (b'{"max_gpus": ' + b"9" * 400 + b"}", 422, "max_gpus"),
        (b'{"max_gpus": "2"}', 422, "max_gpus: Input should be a valid integer"),
        (b'{"max_gpus": true}', 422, "max_gpus: Input should be a valid integer"),
        (b'{"max_gpus": 1.5}', 422, "max_gpus: Input should be a valid integer"),
        (b'{"max_cpus": "4"}', 422, "max_cpus: Input should be a valid number"),
        (b'{"max_cpus": [4]}', 422, "max_cpus: Input should be a valid number"),
        (b'{"max_gpu": 1}', 422, "max_gpu: Extra inputs are not permitted"),
        (b'{"updated_by": "root"}', 422, "updated_by: Extra inputs are not permitted"),
        (b'{"period": "year"}', 422, "period: Input should be 'day', 'week' or 'month'"),
        (b'{"period": null}', 422, "period: Input should be 'day', 'week' or 'month'"),
        (b"[]", 400, "body must be a JSON object"),
        (b"", 400, "body must be a JSON object"),
        (b"{", 400, "not valid JSON"),
    ],
)
def test_malformed_limits_are_refused_with_a_message(front, user, people, quotas, data, status, fragment):
    _, name = people()
    path = f"/v1/quotas/users/{name}"
    before = quotas.set(path, {"max_running": 2})
    got, _, answer = raw(front, "PUT", path, data, bearer("admin"))
    assert got == status, answer
    assert fragment in answer["error"]["message"]
    assert user("admin").request("GET", path) == before  # nothing was stored


@pytest.mark.parametrize(
    "name",
    ["%00", "a" * 3000, "..", "a%2Fb", "-dash", "%E2%80%AEevil", "%ff", "has%20space", "x%0Ay"],
)
def test_names_that_cannot_be_users_or_groups(front, name):
    for kind in ("users", "groups"):
        path = f"/v1/quotas/{kind}/{name}"
        status, _, answer = raw(front, "GET", path, headers=bearer("admin"))
        assert (status, answer["error"]["code"]) == (404, "not_found"), path
        status, _, answer = raw(front, "DELETE", path, headers=bearer("admin"))
        assert (status, answer["error"]["code"]) == (404, "not_found"), path
        status, _, answer = raw(front, "PUT", path, b'{"max_gpus": 1}', bearer("admin"))
        assert 400 <= status < 500 and answer["error"]["message"], (path, status)
    status, _, answer = raw(front, "PUT", "/v1/quotas/groups/Vision", b"{}", bearer("admin"))
    assert status == 422 and "group 'Vision' is not valid" in answer["error"]["message"]


def test_a_user_name_with_at_and_dots_round_trips(user, quotas):
    name = f"{fresh('ada')}.x@example.com"
    stored = quotas.set(f"/v1/quotas/users/{name.replace('@', '%40')}", {"max_running": 1})
    assert stored["name"] == name
    assert user("admin").quota(name).max_running == 1  # the SDK quotes the name itself


def test_a_run_is_charged_only_to_a_group_of_its_owner(front, user, people):
    group, other = fresh("g"), fresh("g")
    solo, _ = people()
    member, _ = people(groups=[group])
    several, _ = people(groups=[group, other])
    for client, asked in [(solo, group), (member, other), (several, "nobody")]:
        status, code, message = api_status(lambda: client.request("POST", "/v1/runs", {**PARKED, "group": asked}))  # noqa: B023
        assert (status, code) == (422, "not_allowed") and asked in message, message
        assert client.request("GET", "/v1/runs")["runs"] == []  # nothing was stored
    bad = api_status(lambda: member.request("POST", "/v1/runs", {**PARKED, "group": "Not A Group"}))
    assert bad[:2] == (422, "invalid_request") and "group" in bad[2]
    assert member.request("POST", "/v1/runs", PARKED)["group"] == group  # the only group of theirs
    assert several.request("POST", "/v1/runs", {**PARKED, "group": other})["group"] == other
    assert solo.request("POST", "/v1/runs", PARKED)["group"] is None


def test_a_run_that_alone_exceeds_a_quota_is_refused_at_submit(user, people, quotas):
    group = fresh("g")
    member, name = people(groups=[group])
    quotas.set(f"/v1/quotas/groups/{group}", {"max_gpus": 1})
    quotas.set(f"/v1/quotas/users/{name}", {"cpu_hours": 1})
    asks = [
        ({**PARKED, "queue": "big", "resources": {"gpus": 2, "time": "10m"}}, f"quota: group {group} "),
        ({**PARKED, "resources": {"cpus": 2, "time": "1h"}}, f"budget: {name} "),
        ({**PARKED, "resources": {"cpus": 0.5}}, f"budget: {name} "),  # the pool's default time: a day
    ]
    for body, start in asks:
        status, code, message = api_status(lambda: member.request("POST", "/v1/runs", body))  # noqa: B023
        assert (status, code) == (422, "not_allowed"), message
        assert message.startswith(start), message
    assert member.request("GET", "/v1/runs")["runs"] == []
    fits = member.request("POST", "/v1/runs", {**PARKED, "queue": "big", "resources": {"gpus": 1, "time": "10m"}})
    assert fits["state"] == "queued" and fits["group"] == group
    member.request("POST", f"/v1/runs/{fits['id']}/kill")


def test_the_answers_hold_no_more_than_the_document_says(user, people, quotas):
    """No field beyond the quota's own: who set it is not shown to its users."""
    member, name = people()
    quotas.set(f"/v1/quotas/users/{name}", {"max_running": 1})
    seen = member.request("GET", f"/v1/quotas/users/{name}")
    assert "updated_by" not in json.dumps(seen) and "admin" not in json.dumps(seen)
    assert set(seen) == {
        "kind", "name", "max_running", "max_gpus", "max_cpus", "gpu_hours", "cpu_hours", "period",
        "updated_at", "usage",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/v1/quotas", "GET"),
        ("POST", "/v1/quotas/users/alice", "DELETE, GET, PUT"),
        ("PATCH", "/v1/quotas/groups/vision", "DELETE, GET, PUT"),
    ],
)
def test_wrong_methods_are_405_with_allow(front, method, path, allow):
    status, headers, answer = raw(front, method, path, b"{}", bearer("admin"))
    assert (status, headers["allow"]) == (405, allow)
    assert answer["error"]["code"] == "method_not_allowed"
