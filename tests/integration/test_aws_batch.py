"""The aws-batch backend against moto's AWS Batch, which runs real Docker containers: the
ComputeBackend contract."""

import io
import uuid

import pytest

from runplane.adapters.aws.clients import AwsConfig, make_client
from runplane.compute.aws_batch.compute import AwsBatchCompute
from runplane.domain.pools import Pool
from tests.conftest import TEST_IMAGE, batch_queue, wait_for

pytestmark = pytest.mark.docker
SLEEPER = "runplane/test-sleeper:1"


@pytest.fixture(scope="module")
def sleeper_image(docker_client):
    """An "agent" that only sleeps: the agent arguments become its positional parameters."""
    dockerfile = f'FROM {TEST_IMAGE}\nENTRYPOINT ["sh", "-c", "exec sleep 60", "agent"]\n'
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=SLEEPER, rm=True)
    return image


@pytest.fixture
def backend(moto_endpoint, sleeper_image, tmp_path):
    queue = batch_queue(moto_endpoint, f"i{uuid.uuid4().hex[:6]}")
    client = make_client("batch", AwsConfig(endpoint_url=moto_endpoint))
    pool = Pool(
        name=f"c{uuid.uuid4().hex[:8]}",
        backend="aws-batch",
        cpus=1,
        memory="256m",
        default_image="x",
        options={"job_queue": queue, "image": SLEEPER, "work_dir": str(tmp_path)},
    )
    compute = AwsBatchCompute(client, environ={"RUNPLANE_PREFIX": "contract"})
    yield compute, pool, client
    for job in compute.list(pool):
        compute.cancel(pool, job.id)


def test_contract_launch_list_cancel(backend):
    compute, pool, client = backend
    jobs = compute.launch(pool, 2, ["--pool", pool.name])
    assert len(jobs) == 2 and len({j.worker_id for j in jobs}) == 2
    listed = wait_for(lambda: js if len(js := compute.list(pool)) == 2 else None, 30, 0.2, "two jobs listed")
    assert {j.id for j in listed} == {j.id for j in jobs}
    assert {j.worker_id for j in listed} == {j.worker_id for j in jobs}
    assert all(j.state in ("pending", "running") and j.created_at > 0 for j in listed)
    wait_for(lambda: [j.state for j in compute.list(pool)] == ["running"] * 2, 60, 0.2, "the jobs to run")
    # the job as submitted: the agent arguments with the worker's id, on one definition
    described = client.describe_jobs(jobs=[jobs[0].id])["jobs"][0]
    assert described["jobName"] == f"runplane-{pool.name}--{jobs[0].worker_id}"
    assert described["container"]["command"] == [
        *("--stop-budget-seconds", "15"),  # within ECS's 30 s from SIGTERM to SIGKILL
        "--pool",
        pool.name,
        "--id",
        jobs[0].worker_id,
        "--pass-down-termination",
    ]
    running = compute.describe(pool, jobs[0].id)
    assert running is not None and running.state == "running" and running.worker_id == jobs[0].worker_id
    compute.cancel(pool, jobs[0].id)
    wait_for(lambda: [j.id for j in compute.list(pool)] == [jobs[1].id], 60, 0.2, "the cancelled job to go")
    ended = compute.describe(pool, jobs[0].id)  # Batch remembers it: failed, with the reason
    assert ended is not None and ended.state == "failed" and "cancelled" in ended.detail["reason"]
    compute.cancel(pool, jobs[0].id)  # idempotent and quiet
    compute.cancel(pool, str(uuid.uuid4()))  # never existed
    assert compute.describe(pool, str(uuid.uuid4())) is None
    # a later launch reuses the job definition: one definition, one revision
    more = compute.launch(pool, 1, ["--pool", pool.name])
    definitions = client.describe_job_definitions(
        jobDefinitionName=more[0].detail["job_definition"].split("/")[-1].split(":")[0]
    )["jobDefinitions"]
    assert [d["revision"] for d in definitions] == [1]
    assert described["jobDefinition"] == more[0].detail["job_definition"]
    # a fresh backend (another dispatcher process) finds it instead of registering again
    again = AwsBatchCompute(client, environ={"RUNPLANE_PREFIX": "contract"})
    assert again.job_definition(pool) == more[0].detail["job_definition"]
    for job in (jobs[1], more[0]):
        compute.cancel(pool, job.id)
    wait_for(lambda: compute.list(pool) == [], 60, 0.2, "no jobs")


def test_unknown_queue_is_a_backend_error(backend):
    from runplane.domain.errors import BackendError

    compute, pool, _ = backend
    lost = pool.model_copy(update={"options": {**pool.options, "job_queue": "no-such-queue"}})
    with pytest.raises(BackendError, match="Job queue no-such-queue does not exist"):
        compute.list(lost)
