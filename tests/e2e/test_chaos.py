"""Chaos: 40 short runs, 3 agents SIGKILLed and restarted at random every few seconds (at most
MAX_KILLS times, then left alone). Every run must end in exactly one terminal state, no attempt
may run twice, every succeeded run must have its outputs, and every run that did not succeed
must have lost each of its attempts to a killed worker."""

import collections
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
from runplane.domain.models import RunState
from tests.conftest import FAST, SHORT_LEASE, TERMINAL, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]
RUNS = 40
MAX_KILLS = 16  # bench/soak.py goes on for longer, and kills the dispatcher and the reaper too
# how a killed worker's run goes back to the queue: its lease lapses, or the worker comes back
LOSS = re.compile(r"re-queued: (worker chaos-\d stopped renewing its lease|its worker restarted)")
KEEP = Path(tempfile.gettempdir()) / "runplane-chaos-logs"


def start_agent(tmp_path, worker_id):
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
    )


@pytest.mark.timeout(900)  # the chaos, then up to 600 s for the runs to end
def test_chaos(docker_client, alice, tmp_path):
    rng = random.Random(20261122)
    ids = [
        alice.request(
            "POST",
            "/v1/runs",
            {
                "command": f"echo attempt $RUNPLANE_ATTEMPT; sleep 0.{rng.randint(1, 9)}; echo {i} > out",
                "queue": "chaos",
                "resources": {"cpus": 0.5, "memory": "64m"},
            },
        )["id"]
        for i in range(RUNS)
    ]
    shutil.rmtree(KEEP, ignore_errors=True)
    KEEP.mkdir()
    agents = {f"chaos-{n}": start_agent(tmp_path, f"chaos-{n}") for n in range(3)}
    store = bootstrap.stack().store
    kills = 0

    def all_ended():
        runs = [store.get(i) for i in ids]
        return runs if all(r.state.terminal for r in runs) else None

    try:
        while kills < MAX_KILLS and not all_ended():
            time.sleep(rng.uniform(1.5, 4))
            victim = rng.choice(sorted(agents))
            agents[victim].send_signal(signal.SIGKILL)
            agents[victim].wait(10)
            kills += 1
            time.sleep(rng.uniform(0, 1.5))
            agents[victim] = start_agent(tmp_path, victim)
        wait_for(all_ended, 600, 1, "every run to end (the agents are left alone now)")
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
    print(f"\nchaos: {RUNS} runs, {kills} agent kills; states {dict(counts)}; attempts {by_attempt}")
    assert sum(counts.values()) == RUNS
    assert set(counts) <= TERMINAL
    for run in runs:
        claimed = [e for e in run.events if e.state == RunState.PREPARING]
        started = [e for e in run.events if e.state == RunState.RUNNING]
        ended = [e for e in run.events if e.state is not None and e.state.terminal]
        assert len(ended) == 1, f"{run.id} ended {len(ended)} times"
        assert len(claimed) == run.attempt, f"{run.id}: {len(claimed)} claims for {run.attempt} attempts"
        assert len(started) <= run.attempt, f"{run.id}: an attempt started twice"
        claim_attempts = [int(e.message.split()[1]) for e in claimed]  # "attempt N claimed by ..."
        assert claim_attempts == list(range(1, run.attempt + 1)), f"{run.id}: attempts {claim_attempts}"
        requeues = [e.message for e in run.events if e.message.startswith("re-queued")]
        assert len(requeues) == run.attempt - 1, f"{run.id}: {len(requeues)} re-queues for {run.attempt} attempts"
        assert [m for m in requeues if not LOSS.fullmatch(m)] == [], run.id
        if run.state != RunState.SUCCEEDED:  # every attempt lost to a killed worker, none left
            assert run.state == RunState.FAILED and run.failure is not None, run.id
            assert run.failure.reason == "worker_lost", (run.id, run.failure)
            assert "stopped renewing its lease; no attempts left" in run.failure.message, (run.id, run.failure)
            continue
        files = alice.request("GET", f"/v1/runs/{run.id}/outputs")["files"]
        assert [f["path"] for f in files] == ["out"], run.id
        with urllib.request.urlopen(files[0]["url"], timeout=10) as resp:
            assert resp.read() == f"{ids.index(run.id)}\n".encode()
    leftovers = docker_client.containers.list(all=True, sparse=True, filters={"label": "io.runplane.worker_id"})
    assert not [c for c in leftovers if c.attrs["Labels"].get("io.runplane.run_id") in ids]
