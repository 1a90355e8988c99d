"""The order runs start in, on the local stack: one agent process on the "manual" pool, on the
real Docker engine, busy with a run while the others queue. When it is free, it starts the run
first in its pool's line (higher priority, then the user who is furthest behind), whichever hint
it receives. Each test's runs and agent share a tag of their own, so runs other tests left in the
pool's queue are not taken here."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runplane import bootstrap
from runplane.client import Client
from runplane.services.auth import register_token
from tests.conftest import TERMINAL, wait_state
from tests.gate import GATE, open_gate, output_dir

pytestmark = pytest.mark.docker


@pytest.fixture
def tag() -> str:
    return f"o{uuid.uuid4().hex[:8]}"


def user(devstack: Any) -> Client:
    """A user of its own: the local stack (and its users' places in line) is shared by the session."""
    name = f"u{uuid.uuid4().hex[:8]}"
    stack = bootstrap.stack()
    register_token(stack.tokens, f"{name}-token", name, now=stack.clock())
    return Client(devstack.api_url, f"{name}-token")


def submit(client: Client, tag: str, command: str = "true", **fields: Any) -> str:
    body = {"command": command, "queue": "manual", "tag": tag, **fields}
    run_id: str = client.request("POST", "/v1/runs", body)["id"]
    return run_id


def busy_worker(agents: Any, admin: Client, tag: str, tmp_path: Any) -> str:
    """One agent with one slot, running a run that waits at its gate: the gated run's id."""
    agents("--tag", tag, "--tag-exclusive", "--slots", "1", "--idle-seconds", "120")
    blocker = submit(admin, tag, f"echo started; {GATE}")
    wait_state(admin, blocker, {"running"}, timeout=90)
    return blocker


def started_in_order(client: Client, run_ids: list[str]) -> list[str]:
    """The runs in the order they started, once all of them succeeded."""
    views = [wait_state(client, run_id, TERMINAL, timeout=120) for run_id in run_ids]
    assert [v["state"] for v in views] == ["succeeded"] * len(views)
    return [v["id"] for v in sorted(views, key=lambda v: v["started_at"])]


def test_a_higher_priority_run_submitted_later_starts_first(devstack, agents, tmp_path, tag):
    admin = Client(devstack.api_url, "admin-token")  # above the pool's max_user_priority
    blocker = busy_worker(agents, admin, tag, tmp_path)
    low = submit(admin, tag, priority=10)
    high = submit(admin, tag, priority=90)
    assert [
        r["state"] for r in (admin.request("GET", f"/v1/runs/{low}"), admin.request("GET", f"/v1/runs/{high}"))
    ] == [
        "queued",
        "queued",
    ]
    open_gate(output_dir(tmp_path / "work", blocker))
    assert started_in_order(admin, [low, high]) == [high, low]


def test_a_user_behind_a_backlog_starts_within_the_next_two(devstack, agents, tmp_path, tag):
    admin = Client(devstack.api_url, "admin-token")
    alice, bob = user(devstack), user(devstack)
    blocker = busy_worker(agents, admin, tag, tmp_path)
    backlog = [submit(alice, tag) for _ in range(6)]
    newcomer = submit(bob, tag)
    open_gate(output_dir(tmp_path / "work", blocker))
    order = started_in_order(admin, [*backlog, newcomer])
    assert newcomer in order[:2], f"bob's run started {order.index(newcomer) + 1}th of 7"
    assert [r for r in order if r != newcomer] == backlog  # alice's own runs in the order she sent them
