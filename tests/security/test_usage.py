"""Usage reports against a hostile second user: a user reads only their own usage (asking for
another's is a 403 that says so), admins anyone's; dates, groupings and pools that cannot be read
are a 4xx with a message, never a 5xx. The figures are the sums of the runs' own, recorded by real
agents on Docker. On both clouds' local stacks.

Every test makes users of its own, so no other test's runs show in its reports.
"""

import uuid

import pytest

from runplane.bootstrap import make_ports
from runplane.client import Client
from runplane.domain.errors import InvalidRequest
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.services.runs import submit_run
from runplane.services.usage import usage_report
from tests.conftest import TERMINAL, api_status, wait_state
from tests.security.conftest import bearer, raw

PARKED = {"command": "echo hi", "queue": "parked"}
PRICE = 3.6
"""The "default" pool's price_per_hour (tests/pools.yaml); its workers have 2 cpus."""


def fresh(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def people(front, user):
    """``people(groups=())``: (a client of a new user with those groups, its user name)."""

    def make(groups=(), scopes=None):
        name = fresh("u")
        body = {"user": name, "groups": list(groups)} | ({"scopes": scopes} if scopes is not None else {})
        made = user("admin").request("POST", "/v1/tokens", body)
        return Client(front.api_url, made["token"]), name

    return make


# computes for about 0.15 s of cpu, then idles long enough for the agent to look at its cgroup
BUSY = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 0.5; echo {}"


def cpu(run):
    """A run's cpu time as its agent measured it: a run that ran has a figure, and one above 0;
    one that never started has none, which a report counts as 0."""
    figure = run["usage"]["cpu_seconds"]
    if "run" not in (run["usage"].get("timings") or {}):
        assert figure is None, run["id"]
        return 0.0
    assert figure is not None and figure > 0, (run["id"], run["usage"])
    return figure


def sums(runs):
    """What a report's row says of ``runs`` (their views), from the runs' own figures."""
    costs = [r["usage"]["cost"] for r in runs if r["usage"]["cost"] is not None]
    return {
        "runs": len(runs),
        "cpu_seconds": pytest.approx(sum(cpu(r) for r in runs), abs=1e-3),
        "gpu_seconds": pytest.approx(sum(r["usage"]["gpu_seconds"] or 0 for r in runs), abs=1e-3),
        "cost": pytest.approx(sum(costs)) if costs else None,
    }


def row(report, key):
    (found,) = [r for r in report["rows"] if r["key"] == key]
    return {k: v for k, v in found.items() if k != "key"}


@pytest.mark.docker
def test_a_report_sums_the_runs_own_usage(front, user, people):
    group = fresh("g")
    ada, ada_name = people(groups=[group])
    bob, bob_name = people()
    done = [ada.request("POST", "/v1/runs", {"command": BUSY.format(i), "queue": "default"}) for i in range(2)]
    parked = ada.request("POST", "/v1/runs", PARKED)
    bobs = bob.request("POST", "/v1/runs", PARKED)
    done = [wait_state(ada, r["id"], TERMINAL, timeout=120) for r in done]
    assert [r["state"] for r in done] == ["succeeded", "succeeded"]
    for r in done:  # what the agent recorded: its share of the worker (1 of 2 cpus) for as long as it ran
        ran = r["usage"]["timings"]["run"]
        assert r["usage"]["gpu_seconds"] == 0
        assert cpu(r) >= 0.05  # the loop's, measured
        assert r["usage"]["cost"] == pytest.approx(PRICE * ran / 3600 * 0.5)
    parked = ada.request("GET", f"/v1/runs/{parked['id']}")

    mine = ada.request("GET", "/v1/usage", query={"by": "pool"})
    assert (mine["by"], mine["user"], mine["group"], mine["pool"]) == ("pool", ada_name, None, None)
    assert [r["key"] for r in mine["rows"]] == ["default", "parked"]
    assert row(mine, "default") == sums(done)
    assert row(mine, "parked") == {"runs": 1, "cpu_seconds": 0, "gpu_seconds": 0, "cost": None}
    assert {k: v for k, v in mine["total"].items() if k != "key"} == sums([*done, parked])
    assert mine["total"]["key"] is None

    # the same report for an admin who asks for ada; by group: ada's only group, charged by default
    assert user("admin").request("GET", "/v1/usage", query={"by": "pool", "user": ada_name})["rows"] == mine["rows"]
    by_group = ada.request("GET", "/v1/usage", query={"by": "group", "group": group})
    assert [r["key"] for r in by_group["rows"]] == [group] and row(by_group, group) == sums([*done, parked])
    # an admin's report of every user of one pool: ada's and bob's parked runs, each on a row of its own
    every = user("admin").request("GET", "/v1/usage", query={"pool": "parked", "since": parked["created_at"]})
    assert row(every, ada_name)["runs"] == 1 and row(every, bob_name)["runs"] == 1
    # a window that ends before the runs were submitted holds none of them
    before = ada.request("GET", "/v1/usage", query={"until": done[0]["created_at"], "since": "2000-01-01"})
    assert before["rows"] == [] and before["total"]["runs"] == 0
    bob.request("POST", f"/v1/runs/{bobs['id']}/kill")
    ada.request("POST", f"/v1/runs/{parked['id']}/kill")


def test_a_user_reads_only_their_own_usage(user, people):
    ada, ada_name = people()
    mallory, mallory_name = people()
    ada.request("POST", "/v1/runs", PARKED)
    status, code, message = api_status(lambda: mallory.request("GET", "/v1/usage", query={"user": ada_name}))
    assert (status, code) == (403, "forbidden")
    assert message == f"only admins may read another user's usage; {mallory_name} may read their own"
    # a report of every user, a pool's or a group's, is only ever the caller's own
    for query in ({}, {"pool": "parked"}, {"by": "user"}):
        seen = mallory.request("GET", "/v1/usage", query=query)
        assert seen["user"] == mallory_name and seen["rows"] == [], query
    assert mallory.request("GET", "/v1/usage", query={"user": mallory_name})["total"]["runs"] == 0
    assert ada_name in [r["key"] for r in user("admin").request("GET", "/v1/usage", query={"pool": "parked"})["rows"]]
    reader, _ = people(scopes=["runs:read"])
    assert reader.request("GET", "/v1/usage")["rows"] == []  # runs:read is enough
    assert api_status(lambda: user("empty").request("GET", "/v1/usage"))[:2] == (403, "forbidden")


@pytest.mark.parametrize(
    ("query", "status", "fragment"),
    [
        ("since=yesterday", 400, "since must be an ISO 8601 date or time"),
        ("since=2026-13-01", 400, "since must be an ISO 8601 date or time"),
        ("until=2026-11-01T25:00:00Z", 400, "until must be an ISO 8601 date or time"),
        ("since=nan", 400, "since must be between 1970-01-01 and 9999-12-31"),
        ("since=inf", 400, "since must be between 1970-01-01 and 9999-12-31"),
        ("until=1e400", 400, "until must be between 1970-01-01 and 9999-12-31"),
        ("since=-1", 400, "since must be between 1970-01-01 and 9999-12-31"),
        ("since=", 400, "since must be an ISO 8601 date or time"),
        ("since=" + "9" * 100, 400, "since must be an ISO 8601 date or time"),
        ("since=%00", 400, "since must be an ISO 8601 date or time"),
        ("since=2026-11-02&until=2026-11-01", 422, "until is before since"),
        ("by=colour", 422, "by must be user, group or pool, not 'colour'"),
        ("by=USER", 422, "by must be user, group or pool"),
        ("by=%E2%80%AE", 422, "by must be user, group or pool"),
        ("pool=nowhere", 422, "no pool 'nowhere'; pools are default, parked"),
        ("pool=" + "p" * 3000, 422, "no pool 'ppp"),
    ],
)
def test_bad_queries_are_refused_with_a_message(front, query, status, fragment):
    for who in ("alice", "admin"):
        got, _, answer = raw(front, "GET", f"/v1/usage?{query}", headers=bearer(who))
        assert got == status, answer
        assert fragment in answer["error"]["message"]


def test_dates_are_read_as_iso_8601_or_unix_seconds(user):
    alice = user("alice")
    for since, until, shown in [
        ("2026-11-01", "2026-11-02", ("2026-11-01T00:00:00.000Z", "2026-11-02T00:00:00.000Z")),
        ("2026-10-31T09:30:00+02:00", "1793491200.5", ("2026-10-31T07:30:00.000Z", "2026-11-01T00:00:00.500Z")),
        ("1793491200", "2026-11-01T00:00:01z", ("2026-11-01T00:00:00.000Z", "2026-11-01T00:00:01.000Z")),
    ]:
        report = alice.request("GET", "/v1/usage", query={"since": since, "until": until})
        assert (report["since"], report["until"]) == shown


def test_wrong_methods_are_405_with_allow(front):
    status, headers, answer = raw(front, "POST", "/v1/usage", b"{}", bearer("admin"))
    assert (status, headers["allow"]) == (405, "GET")
    assert answer["error"]["code"] == "method_not_allowed"


@pytest.fixture(params=["aws-moto", "azure-azurite"])
def stack(request):
    return request.getfixturevalue({"aws-moto": "aws_stack", "azure-azurite": "azure_stack"}[request.param])


def test_a_report_reads_at_most_max_runs_runs(stack):
    """No report makes the API read more than the service's cap of runs, not even a user's own:
    past it the answer is a 422 that asks for a narrower window. A listing stops at the first run
    older than the window, so the runs before it cost nothing."""
    owner = Principal(user=fresh("u"), scopes=["runs:read", "runs:write"])
    for at in (1000.0, 1001.0, 1002.0, 2000.0, 2001.0):
        submit_run(make_ports(stack, lambda at=at: at), owner, RunSpec(**PARKED), None)
    clock = lambda: 3000.0  # noqa: E731
    with pytest.raises(InvalidRequest, match=r"would read more than 3 runs: narrow the window"):
        usage_report(make_ports(stack, clock), owner, since=0.0, max_runs=3)
    # the two runs since 1500 and the one older run that ends the listing: three read
    recent = usage_report(make_ports(stack, clock), owner, since=1500.0, max_runs=3)
    assert recent.total.runs == 2
    assert usage_report(make_ports(stack, clock), owner, since=0.0).total.runs == 5
