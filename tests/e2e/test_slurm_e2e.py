"""A run on the "slurm" pool: API -> run queue -> dispatcher -> slurmrestd (JWT over TCP) -> the
agent as a Slurm job -> Docker -> object store, on a real one-node Slurm and the embedded default
stack: the job reaches the stack's database and objects by the settings it is given (its state
directory on this machine)."""

from pathlib import Path

import pytest

from runplane import bootstrap
from tests.conftest import TERMINAL, cancel_all, wait_for, wait_state

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def slurm_pool(devstack, slurm_conf):
    """The "slurm" pool of tests/pools.yaml, pointed at the slurmrestd that start-slurm.sh runs;
    and the directory its workers log to, which slurmrestd (unlike the sbatch path) never makes."""
    stack = bootstrap.stack()
    pool = stack.pools.get("slurm")
    assert pool.options["rest_url"] == (Path(slurm_conf).parents[1] / "rest.url").read_text().strip()
    Path(pool.options["log_dir"]).mkdir(parents=True, exist_ok=True)
    yield stack, pool
    cancel_all(stack.backend(pool), pool)


def test_run_executed_by_an_agent_the_dispatcher_started_through_slurmrestd(docker_client, alice, slurm_pool):
    stack, pool = slurm_pool
    run = alice.request("POST", "/v1/runs", {"command": "echo from slurm; echo 42 > answer", "queue": "slurm"})
    done = wait_state(alice, run["id"], TERMINAL, timeout=120)
    assert done["state"] == "succeeded", done
    backend = stack.backend(pool)
    jobs = backend.list(pool)
    job = next((j for j in jobs if j.worker_id == done["worker_id"]), None)
    assert job is not None, "the run's worker is not a live Slurm job"
    assert job.detail["via"] == f"slurmrestd at {pool.options['rest_url']}"
    assert alice.request("GET", f"/v1/runs/{run['id']}/logs")["data"] == "from slurm\n"
    files = alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    assert [f["path"] for f in files] == ["answer"]
    # cancel works: Slurm reports the job CANCELLED, and the worker reports itself offline on its way out
    backend.cancel(pool, job.id)
    ended = wait_for(lambda: (d := backend.describe(pool, job.id)) and not d.alive and d, 60, 0.5, "the job to end")
    assert (ended.state, ended.detail["slurm_state"]) == ("finished", "CANCELLED")
    assert job.id not in {j.id for j in backend.list(pool)}
    backend.cancel(pool, job.id)  # quiet the second time
    wait_for(lambda: stack.workers.get(done["worker_id"]).status == "offline", 30, 0.5, "the worker to go offline")
