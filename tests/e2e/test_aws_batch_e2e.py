"""A run on the "batch" pool: API -> SQS -> dispatcher -> AWS Batch (moto, which runs real
Docker containers) -> the agent image as a Batch job -> Docker -> S3."""

from pathlib import Path

import pytest

from tests.conftest import (
    TERMINAL,
    aws_devstack_stack,
    batch_queue,
    cancel_all,
    moto_credentials_for,
    nosuid_work_dir,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def batch_pool(aws_devstack, agent_image):
    """The compute environment and job queue the "batch" pool of tests/pools.yaml names, in the
    AWS local stack's moto; and the work dir its workers mount. Until they exist, the dispatcher's
    passes over the pool fail with a BackendError, which it only logs."""
    stack = aws_devstack_stack(aws_devstack)
    pool = stack.pools.get("batch")
    assert batch_queue(aws_devstack.endpoint, "e2e") == pool.options["job_queue"]
    moto_credentials_for(pool)  # the jobs get the stack's settings, never the dispatcher's keys
    # the host's part: the work dir on a nosuid,nodev mount, which the agent in a job cannot make
    with nosuid_work_dir(Path(pool.options["work_dir"])):
        yield stack, pool
        cancel_all(stack.backend(pool), pool)


@pytest.mark.timeout(900)  # includes a cold agent image build
@pytest.mark.parametrize("alice", ["aws_devstack"], indirect=True)
def test_run_executed_by_an_agent_the_dispatcher_started_as_a_batch_job(alice, batch_pool):
    stack, pool = batch_pool
    run = alice.request("POST", "/v1/runs", {"command": "echo from batch; echo 42 > answer", "queue": "batch"})
    done = wait_state(alice, run["id"], TERMINAL, timeout=180)
    assert done["state"] == "succeeded", done
    backend = stack.backend(pool)
    jobs = backend.list(pool)
    assert done["worker_id"] in {j.worker_id for j in jobs}, "the run's worker is not a live Batch job"
    assert alice.request("GET", f"/v1/runs/{run['id']}/logs")["data"] == "from batch\n"
    files = alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    assert [f["path"] for f in files] == ["answer"]
    # cancel works: the job is terminated and no longer listed
    job = next(j for j in jobs if j.worker_id == done["worker_id"])
    backend.cancel(pool, job.id)
    wait_for(lambda: job.id not in {j.id for j in backend.list(pool)}, 60, 0.5, "the job to end")
    backend.cancel(pool, job.id)  # quiet the second time
