"""Chaos: 40 short runs, 3 agents SIGKILLed and restarted at random every few seconds (at most
MAX_KILLS times, then left alone); the first kill is of an agent while it runs one of the runs
that take 3 s. Every run must end in exactly one terminal state, no attempt may run twice, every
succeeded run must have its outputs, every run that did not succeed must have lost each of its
attempts to a killed worker, and at least one run lost an attempt so and was run again.

The seed (the runs' lengths, the kills) is a fresh one each time, printed and named by a failure;
``RUNPLANE_CHAOS_SEED`` replays one."""

import collections
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from runplane import bootstrap
from runplane.domain.states import RunState
from tests.conftest import FAST, SHORT_LEASE, TERMINAL, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]
RUNS = 40
MAX_KILLS = 16  # bench/soak.py goes on for longer, and kills the dispatcher and the reaper too
LONG_EVERY = 5  # one run in 5 takes 3 s: the first kill is of an agent while it runs one
# how a killed worker's run goes back to the queue: its lease lapses, or the worker comes back
LOSS = re.compile(r"re-queued: (worker chaos-\d stopped renewing its lease|its worker restarted)")
KEEP = Path(tempfile.gettempdir()) / "runplane-chaos-logs"


def start_agent(tmp_path, worker_id, env):
    log = (tmp_path / f"{worker_id}.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker_agent",
            "--pool",
            "chaos",
            "--id",
            worker_id,
            "--slots",
            "2",
            "--work-dir",
            str(tmp_path / "work"),
            *FAST,
            *SHORT_LEASE,  # lost workers' runs come back within seconds
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


@pytest.mark.timeout(900)  # the chaos, then up to 600 s for the runs to end
def test_chaos(docker_client, devstack, alice, tmp_path):
    seed = int(os.environ.get("RUNPLANE_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    again = f"seed {seed}: again with RUNPLANE_CHAOS_SEED={seed}"
    print(f"\nchaos seed {seed}")
    rng = random.Random(seed)
    ids = [
        alice.request(
            "POST",
            "/v1/runs",
            {
                "command": f"echo attempt $RUNPLANE_ATTEMPT; sleep {length(i, rng)}; echo {i} > out",
                "queue": "chaos",
                "resources": {"cpus": 0.5, "memory": "64m"},
            },
        )["id"]
        for i in range(RUNS)
    ]
    shutil.rmtree(KEEP, ignore_errors=True)
    KEEP.mkdir()
    environment = {**os.environ, **devstack.environment}  # the stack it joins
    agents = {f"chaos-{n}": start_agent(tmp_path, f"chaos-{n}", environment) for n in range(3)}
    store = bootstrap.stack().store
    kills = 0

    def all_ended():
        runs = [store.get(i) for i in ids]
        return runs if all(r.state.terminal for r in runs) else None

    def running_long():
        """The agent of a 3 s run that runs now, and that run: killing the agent costs it an attempt."""
        for run in (store.get(i) for i in ids[::LONG_EVERY]):
            if run.state == RunState.RUNNING and run.worker_id in agents:
                return run.worker_id, run.id
        return None

    try:
        victim, first = wait_for(running_long, 120, 0.1, f"a 3 s run to run ({again})")
        agents[victim].send_signal(signal.SIGKILL)
        agents[victim].wait(10)
        kills += 1
        agents[victim] = start_agent(tmp_path, victim, environment)
        while kills < MAX_KILLS and not all_ended():
            time.sleep(rng.uniform(1.5, 4))
            victim = rng.choice(sorted(agents))
            agents[victim].send_signal(signal.SIGKILL)
            agents[victim].wait(10)
            kills += 1
            time.sleep(rng.uniform(0, 1.5))
            agents[victim] = start_agent(tmp_path, victim, environment)
        wait_for(all_ended, 600, 1, f"every run to end (the agents are left alone now; {again})")
    finally:
        for proc in agents.values():
            proc.terminate()
        for proc in agents.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()

    runs = [store.get(i) for i in ids]
    for log in tmp_path.glob("*.log"):  # kept for a look when something fails
        shutil.copy(log, KEEP / log.name)
    counts = collections.Counter(str(r.state) for r in runs)
    attempts = collections.Counter(r.attempt for r in runs)
    by_attempt = dict(sorted(attempts.items()))
    retried = [r.id for r in runs if any(LOSS.fullmatch(e.message) for e in r.events)]
    print(f"chaos: {RUNS} runs, {kills} agent kills (the first during {first}); states {dict(counts)}")
    print(f"attempts {by_attempt}; retried after an attempt lost to a killed agent: {retried}")
    assert sum(counts.values()) == RUNS, again
    assert set(counts) <= TERMINAL, again
    assert first in retried, again  # its agent was killed under it: it went back to its queue
    for run in runs:
        check(run, ids, alice, again)
    leftovers = docker_client.containers.list(all=True, sparse=True, filters={"label": "io.runplane.worker_id"})
    assert not [c for c in leftovers if c.attrs["Labels"].get("io.runplane.run_id") in ids], again


def length(i, rng):
    """How long run ``i`` sleeps: 3 s for one in LONG_EVERY (the forced kill's), else under 1 s."""
    return 3 if i % LONG_EVERY == 0 else f"0.{rng.randint(1, 9)}"


def check(run, ids, alice, again):
    """One run's events and outputs: one end, one claim per attempt, every re-queue a lost worker's."""
    claimed = [e for e in run.events if e.state == RunState.PREPARING]
    started = [e for e in run.events if e.state == RunState.RUNNING]
    ended = [e for e in run.events if e.state is not None and e.state.terminal]
    assert len(ended) == 1, f"{run.id} ended {len(ended)} times ({again})"
    assert len(claimed) == run.attempt, f"{run.id}: {len(claimed)} claims for {run.attempt} attempts ({again})"
    assert len(started) <= run.attempt, f"{run.id}: an attempt started twice ({again})"
    claim_attempts = [int(e.message.split()[1]) for e in claimed]  # "attempt N claimed by ..."
    assert claim_attempts == list(range(1, run.attempt + 1)), f"{run.id}: attempts {claim_attempts} ({again})"
    requeues = [e.message for e in run.events if e.message.startswith("re-queued")]
    assert len(requeues) == run.attempt - 1, f"{run.id}: {len(requeues)} re-queues, {run.attempt} attempts ({again})"
    assert [m for m in requeues if not LOSS.fullmatch(m)] == [], (run.id, again)
    if run.state != RunState.SUCCEEDED:  # every attempt lost to a killed worker, none left
        assert run.state == RunState.FAILED and run.failure is not None, (run.id, again)
        assert run.failure.reason == "worker_lost", (run.id, run.failure, again)
        assert "stopped renewing its lease; no attempts left" in run.failure.message, (run.id, run.failure, again)
        return
    files = alice.request("GET", f"/v1/runs/{run.id}/outputs")["files"]
    assert [f["path"] for f in files] == ["out"], (run.id, again)
    with urllib.request.urlopen(files[0]["url"], timeout=10) as resp:
        assert resp.read() == f"{ids.index(run.id)}\n".encode(), (run.id, again)
