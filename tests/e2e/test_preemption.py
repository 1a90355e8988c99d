"""Losing a worker that is not the run's doing never uses up one of the run's attempts: a
preemption notice, SIGTERM with pass-down, a --preemptible machine that vanishes. And SIGTERM
without pass-down lets the run finish, however long it takes. Agents are processes on the
"manual" pool of the local stack, on the real Docker engine; each run may be tried once only."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from runplane import bootstrap
from runplane.domain.expect import Expect
from tests.conftest import FAST, SHORT_LEASE, TERMINAL, AgentProcess, wait_for, wait_state
from tests.e2e.conftest import Notice

pytestmark = pytest.mark.docker

# a long first attempt, a quick second one
LEASE_SECONDS = float(FAST[FAST.index("--lease-seconds") + 1])
SECOND_FINISHES = '[ "$RUNPLANE_ATTEMPT" = 1 ] && sleep 300; echo $RUNPLANE_ATTEMPT > done'


def submit_once(client, command: str) -> dict[str, Any]:
    """A run on "manual" that may be tried once only (set in the store: the API takes no
    max_attempts), before any worker can take it."""
    run = client.request("POST", "/v1/runs", {"command": command, "queue": "manual"})
    store = bootstrap.stack().store
    store.update(store.get(run["id"]), Expect(), {"max_attempts": 1})
    assert client.request("GET", f"/v1/runs/{run['id']}")["max_attempts"] == 1
    return run


def get(client, run_id: str) -> dict[str, Any]:
    return client.request("GET", f"/v1/runs/{run_id}")


def finished_on_a_second_agent(client, agents, run_id: str) -> dict[str, Any]:
    agents()
    done = wait_state(client, run_id, TERMINAL, timeout=90)
    assert (done["state"], done["attempt"]) == ("succeeded", 2), done
    files = client.request("GET", f"/v1/runs/{run_id}/outputs")["files"]
    assert [f["path"] for f in files] == ["done"]
    return done


def test_preemption_notice_does_not_use_up_the_only_attempt(docker_client, alice, agents, notice_url):
    run = submit_once(alice, SECOND_FINISHES)
    first = agents("--preemption-watch", notice_url)
    wait_state(alice, run["id"], {"running"}, timeout=60)
    Notice.given.set()
    assert first.wait(60) == 0
    assert f"exiting: preemption notice at {notice_url}" in first.log.read_text()
    back = get(alice, run["id"])
    assert (back["state"], back["attempt"], back["max_attempts"]) == ("queued", 1, 2)
    assert "worker terminated" in back["waiting_reason"]
    finished_on_a_second_agent(alice, agents, run["id"])


def test_sigterm_with_pass_down_does_not_use_up_the_only_attempt(docker_client, alice, agents):
    run = submit_once(alice, SECOND_FINISHES)
    first = agents("--pass-down-termination")
    wait_state(alice, run["id"], {"running"}, timeout=60)
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0
    back = get(alice, run["id"])
    assert (back["state"], back["attempt"], back["max_attempts"]) == ("queued", 1, 2)
    finished_on_a_second_agent(alice, agents, run["id"])


def test_sigterm_without_pass_down_keeps_the_lease_until_the_run_ends(docker_client, alice, agents, tmp_path):
    """After SIGTERM the agent goes on renewing the lease of the run it lets finish, and reports
    itself draining: a run that outlives its lease is never taken away by the reaper (which, with
    one attempt, would fail it)."""
    run = submit_once(alice, "while [ ! -e go ]; do sleep 0.1; done; echo finished > done")
    agent = agents()
    wait_state(alice, run["id"], {"running"}, timeout=60)
    store, workers = bootstrap.stack().store, bootstrap.stack().workers
    signalled_at = time.time()
    agent.signal(signal.SIGTERM)
    # every lease renewed before the signal ends before this
    wait_for(
        lambda: (store.get(run["id"]).lease_expires_at or 0) > signalled_at + LEASE_SECONDS,
        30,
        0.2,
        "the lease to be renewed after SIGTERM",
    )
    wait_for(lambda: workers.get(agent.id).status == "draining", 30, 0.2, "the worker to report draining")
    (tmp_path / "work" / agent.id / "runs" / f"{run['id']}-1" / "output" / "go").touch()  # the run may end
    assert agent.wait(60) == 0
    done = get(alice, run["id"])
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert workers.get(agent.id).status == "offline"


def vanish(docker_client, agent: AgentProcess, run_id: str) -> None:
    """The machine goes without a word: its agent and the run's container are killed."""
    agent.signal(signal.SIGKILL)
    agent.wait(30)
    containers = docker_client.containers.list(all=True, sparse=True, filters={"label": f"io.runplane.run_id={run_id}"})
    assert containers, "the run's container is not there"
    for container in containers:
        container.remove(force=True)


def test_vanished_preemptible_worker_does_not_use_up_the_only_attempt(docker_client, alice, agents):
    """The reaper hands the run back once its lease ends; from a --preemptible worker, for free."""
    run = submit_once(alice, SECOND_FINISHES)
    first = agents(*SHORT_LEASE, "--preemptible")
    wait_state(alice, run["id"], {"running"}, timeout=60)
    vanish(docker_client, first, run["id"])
    back = wait_state(alice, run["id"], {"queued"}, timeout=60)
    assert (back["attempt"], back["max_attempts"]) == (1, 2)
    assert "stopped renewing its lease" in back["waiting_reason"]
    finished_on_a_second_agent(alice, agents, run["id"])


def test_vanished_worker_not_preemptible_uses_up_the_attempt(docker_client, alice, agents):
    """The same loss on a worker started without --preemptible counts against the run."""
    run = submit_once(alice, SECOND_FINISHES)
    first = agents(*SHORT_LEASE)
    wait_state(alice, run["id"], {"running"}, timeout=60)
    vanish(docker_client, first, run["id"])
    done = wait_state(alice, run["id"], TERMINAL, timeout=60)
    assert (done["state"], done["failure"]["reason"]) == ("failed", "worker_lost")
    assert "no attempts left (1 of 1 used)" in done["failure"]["message"]
