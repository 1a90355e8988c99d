"""The soak (bench/soak.py), small: runs of mixed length on three agents while agents, the
dispatcher and the reaper are killed with SIGKILL at random and come back; every run ends exactly
once, no attempt starts twice, every succeeded run's output is its own, and a run whose agent was
killed under it (the soak's first kill is forced to be one) lost that attempt and was run again.
In a process of its own: the soak's local stack sets the environment the stack is read from.

The seed is a fresh one each time, printed and named by a failure; ``RUNPLANE_SOAK_SEED`` replays
one."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_a_small_soak_loses_doubles_and_misses_nothing():
    seed = int(os.environ.get("RUNPLANE_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"soak seed {seed} (again: RUNPLANE_SOAK_SEED={seed})")
    soak = ["--runs", "24", "--agents", "3", "--kill-every", "3", "--seed", str(seed), "--force-agent-kill"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), *soak],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    again = f"seed {seed}: again with RUNPLANE_SOAK_SEED={seed}"
    assert done.returncode == 0, f"{again}\n{out[-4000:]}"
    assert "RESULT soak: ok" in out, again
    kills = next(line for line in out.splitlines() if line.startswith("24 runs in"))
    assert "first: agent-" in kills, (again, kills)  # the forced kill: an agent, while it ran a run
    retried = next(line for line in out.splitlines() if line.startswith("retried after an attempt lost"))
    assert int(retried.split(": ")[1].split()[0]) >= 1, (again, retried)
    ended = next(line for line in out.splitlines() if line.startswith("ended: ")).removeprefix("ended: ")
    counts = {state: int(n) for state, n in (part.rsplit(" ", 1) for part in ended.split(", "))}
    assert sum(counts.values()) == 24, (again, ended)
    # each either did its work or ran out of attempts to worker deaths, and says so
    assert set(counts) <= {"succeeded", "failed/worker_lost"}, (again, ended)
    assert counts.get("succeeded", 0) >= 12, (again, ended)
