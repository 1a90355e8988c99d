"""``LocalCompute.signal_all``: a stopping local stack tells its agents to stop, and kills those that
do not; each stays listed until it has exited. Their records and logs are in directories of this
user's alone."""

import os
import signal
import stat
import sys

from runplane.compute.local.compute import LocalCompute
from runplane.domain.pools import Pool
from tests.conftest import wait_for

# an "agent" that, like one draining its runs, does not exit on SIGTERM
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]


def test_sigterm_leaves_an_agent_listed_until_it_exits_and_sigkill_ends_it(tmp_path):
    pool = Pool(name="p", cpus=1, memory=2**30, default_image="x")
    backend = LocalCompute(tmp_path, command=STUBBORN)
    jobs = backend.launch(pool, 2, ["--pool", "p"])
    ids = sorted(job.id for job in jobs)
    # the handler is set once Python runs the command: until then SIGTERM would end it
    wait_for(lambda: all(_ignores_sigterm(job.detail["pid"]) for job in jobs), 10, 0.02, "SIGTERM to be ignored")

    assert sorted(job.id for job in backend.signal_all(pool, signal.SIGTERM)) == ids
    assert sorted(job.id for job in backend.list(pool)) == ids  # told, still there (draining)

    assert sorted(job.id for job in backend.signal_all(pool, signal.SIGKILL)) == ids
    wait_for(lambda: backend.list(pool) == [], 10, what="the killed agents to be gone")
    assert backend.signal_all(pool, signal.SIGKILL) == []
    assert [getattr(backend.describe(pool, i), "state", None) for i in ids] == ["failed", "failed"]


def test_the_agents_directories_are_made_private_whatever_the_umask(tmp_path):
    pool = Pool(name="p", cpus=1, memory=2**30, default_image="x")
    backend = LocalCompute(tmp_path / "stack" / "workers", command=[sys.executable, "-c", "pass"])
    before = os.umask(0o022)
    try:
        assert len(backend.launch(pool, 1, [])) == 1
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "stack" / "workers").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "stack" / "workers" / "p").stat().st_mode) == 0o700
    wait_for(lambda: backend.list(pool) == [], 10, what="the agent to exit")


def _ignores_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        ignored = next(line for line in status if line.startswith("SigIgn:")).split()[1]
    return bool(int(ignored, 16) & (1 << (signal.SIGTERM - 1)))
