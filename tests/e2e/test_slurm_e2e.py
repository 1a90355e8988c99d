"""A run on the "slurm" pool: API -> SQS -> dispatcher -> sbatch -> agent as a Slurm job ->
Docker -> S3, on a real one-node Slurm."""

import subprocess

import pytest

from runplane import bootstrap
from tests.conftest import wait_for, wait_state

pytestmark = pytest.mark.docker
TERMINAL = {"succeeded", "failed", "killed", "timed_out"}


def test_run_executed_by_an_agent_the_dispatcher_started_as_a_slurm_job(docker_client, alice, slurm_conf):
    run = alice.request("POST", "/v1/runs", {"command": "echo from slurm; echo 42 > answer", "queue": "slurm"})
    done = wait_state(alice, run["id"], TERMINAL, timeout=120)
    assert done["state"] == "succeeded", done
    stack = bootstrap.stack()
    pool = stack.pools.get("slurm")
    jobs = stack.backend(pool).list(pool)
    assert done["worker_id"] in {j.worker_id for j in jobs}, "the run's worker is not a live Slurm job"
    assert alice.request("GET", f"/v1/runs/{run['id']}/logs")["data"] == "from slurm\n"
    files = alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    assert [f["path"] for f in files] == ["answer"]
    # cancel works: the job goes, and the worker reports itself offline on its way out
    job = next(j for j in jobs if j.worker_id == done["worker_id"])
    stack.backend(pool).cancel(pool, job.id)
    wait_for(lambda: job.id not in {j.id for j in stack.backend(pool).list(pool)}, 60, 0.5, "the job to end")
    squeue = subprocess.run(["squeue", "--noheader", "--jobs", job.id], capture_output=True, text=True, check=False)
    assert job.id not in squeue.stdout
    wait_for(lambda: stack.workers.get(done["worker_id"]).status == "offline", 30, 0.5, "the worker to go offline")
