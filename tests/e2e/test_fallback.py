"""Fallback between pools on the local stack with real Docker: a run whose first pool never gets a
worker ("parked") starts on its second, served by an agent, once its time on the first is up, and
its timeline says so; a run preempted on its first pool as often as it allows is queued on its
second and finishes there, no attempt used."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import pytest

from runplane.services import reap
from tests.conftest import TERMINAL, wait_for, wait_state
from tests.e2e.conftest import Notice

pytestmark = pytest.mark.docker

TIMER_SLACK = 10.0
"""Seconds a timer may come after its time (a delay rounded up, the dispatcher's poll): less than
the reaper's grace, so that a move within it is the timer's."""
START_SLACK = 60.0
"""Seconds the second pool's idle worker may take to start the run once it is moved there."""
assert TIMER_SLACK < reap.TIMER_GRACE


def seconds(at: str) -> float:
    """A time as the API gives it (ISO 8601), in seconds since the epoch."""
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def get(client, run_id: str) -> dict[str, Any]:
    return client.request("GET", f"/v1/runs/{run_id}")


def test_a_run_not_started_on_its_first_pool_starts_on_its_second(docker_client, alice, agents):
    run = alice.request(
        "POST",
        "/v1/runs",
        {"command": "echo ran > where", "queue": ["parked", "manual"], "fallback_after": "3s"},
    )
    assert run["queue"] == "parked"
    assert "; falls back to pool manual at " in get(alice, run["id"])["waiting_reason"]
    agents()  # the second pool's worker; the first never gets one (max_workers 0)
    done = wait_state(alice, run["id"], TERMINAL, timeout=90)
    assert (done["state"], done["queue"], done["attempt"]) == ("succeeded", "manual", 1), done
    moved = [e for e in done["events"] if "moved to pool" in e["message"]]
    # its timer's words (the reaper's backstop says it moved a run) and its timer's time: the
    # reaper, which runs every second here, moves a run only TIMER_GRACE past its time
    assert [e["message"] for e in moved] == ["not started on pool parked within 3s: moved to pool manual"]
    created, at, started = (seconds(t) for t in (done["created_at"], moved[0]["at"], done["started_at"]))
    assert 3 <= at - created <= 3 + TIMER_SLACK, (created, at)
    assert 0 <= started - at <= START_SLACK, (at, started)


def test_a_run_preempted_as_often_as_it_allows_finishes_on_its_next_pool(docker_client, alice, agents, notice_url):
    command = '[ "$RUNPLANE_ATTEMPT" = 1 ] && sleep 300; echo $RUNPLANE_ATTEMPT > done'
    run = alice.request(
        "POST", "/v1/runs", {"command": command, "queue": ["manual", "chaos"], "fallback_after_preemptions": 1}
    )
    first = agents("--preemption-watch", notice_url)
    wait_state(alice, run["id"], {"running"}, timeout=60)
    Notice.given.set()
    assert first.wait(60) == 0
    back = wait_for(lambda: (r := get(alice, run["id"]))["state"] == "queued" and r, 30, what="run handed back")
    assert back["queue"] == "chaos"
    assert back["events"][-1]["message"].endswith("preempted 1 time on pool manual: moved to pool chaos")
    agents("--pool", "chaos", worker_id=f"chaos-{os.urandom(3).hex()}")  # the last --pool given wins
    done = wait_state(alice, run["id"], TERMINAL, timeout=90)
    assert (done["state"], done["queue"], done["attempt"]) == ("succeeded", "chaos", 2), done
