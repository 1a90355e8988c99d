"""The azure-batch backend's ComputeBackend contract, against the stateful fake of the Batch task
REST endpoints (tests/fakes/azure_batch.py) as its azure-core transport. No Batch emulator
exists; the fake checks every request as the service would (route, api-version, Shared Key
signature, body) and keeps tasks between calls, so the backend is tested at the REST boundary."""

from __future__ import annotations

import pytest

from runplane.compute.azure_batch.compute import AzureBatchCompute
from runplane.compute.azure_batch.rest import BatchServiceError
from runplane.domain.errors import BackendError
from runplane.domain.pools import Pool
from runplane.settings import StackSettings
from tests.fakes.azure_batch import TEST_KEY, FakeBatchService, FakeBatchTransport

JOB = "runplane-workers"


@pytest.fixture
def service() -> FakeBatchService:
    svc = FakeBatchService(page_size=1)  # every list goes through odata.nextLink
    svc.add_job(JOB)
    return svc


@pytest.fixture
def compute(service: FakeBatchService) -> AzureBatchCompute:
    settings = StackSettings.from_env(
        {
            "RUNPLANE_CLOUD": "azure",
            "RUNPLANE_AZURE_STORAGE_ACCOUNT": "runplanedata",
            "RUNPLANE_AZURE_BATCH_ACCOUNT_URL": service.endpoint,
            "RUNPLANE_AZURE_BATCH_ACCOUNT_KEY": TEST_KEY,
        }
    )
    return AzureBatchCompute.from_settings(settings, transport=FakeBatchTransport(service))


def make_pool(name: str = "gpu", job_id: str = JOB) -> Pool:
    return Pool(
        name=name,
        backend="azure-batch",
        cpus=8,
        gpus=1,
        memory="56g",
        default_image="my/cuda:12",
        options={"job_id": job_id, "batch_pool_id": "runplane-gpu", "max_wall_clock": "1d"},
    )


def test_contract_launch_list_describe_cancel(compute, service):
    pool = make_pool()
    jobs = compute.launch(pool, 2, ["--pool", pool.name])
    assert len(jobs) == 2 and len({j.worker_id for j in jobs}) == 2
    assert all(j.id == j.worker_id and j.state == "pending" and j.pool == "gpu" for j in jobs)

    listed = compute.list(pool)
    assert {(j.id, j.worker_id, j.state) for j in listed} == {(j.id, j.worker_id, "pending") for j in jobs}
    assert all(j.created_at > 0 for j in listed)

    # the task as added: the agent with its id, in the agent image, with the stack's settings
    task = service.task(JOB, jobs[0].id)
    assert (
        task["commandLine"] == f"--stop-budget-seconds 15 --pool gpu --id {jobs[0].worker_id} --pass-down-termination"
    )
    assert task["constraints"]["maxWallClockTime"] == "P1D"
    env = {s["name"]: s["value"] for s in task["environmentSettings"]}
    assert env["RUNPLANE_AZURE_STORAGE_ACCOUNT"] == "runplanedata"
    assert "RUNPLANE_AZURE_BATCH_ACCOUNT_KEY" not in env

    service.start(JOB, jobs[0].id)
    running = compute.describe(pool, jobs[0].id)
    assert running is not None and (running.state, running.worker_id) == ("running", jobs[0].worker_id)
    assert {j.id: j.state for j in compute.list(pool)} == {jobs[0].id: "running", jobs[1].id: "pending"}

    compute.cancel(pool, jobs[0].id)
    assert [j.id for j in compute.list(pool)] == [jobs[1].id]
    ended = compute.describe(pool, jobs[0].id)
    assert ended is not None and ended.state == "failed" and ended.detail["reason"].startswith("TaskEnded")
    compute.cancel(pool, jobs[0].id)  # idempotent and quiet
    compute.cancel(pool, "gpu-00000000")  # never existed
    assert compute.describe(pool, "gpu-00000000") is None

    service.complete(JOB, jobs[1].id, exit_code=0)
    done = compute.describe(pool, jobs[1].id)
    assert done is not None and (done.state, done.detail["exit_code"]) == ("finished", 0)
    assert compute.list(pool) == []


def test_pools_sharing_a_job_never_see_each_others_workers(compute):
    gpu, cpu = make_pool("gpu"), make_pool("gpu-cpu")
    mine = compute.launch(gpu, 3, ["--pool", "gpu"])
    theirs = compute.launch(cpu, 1, ["--pool", "gpu-cpu"])
    assert {j.id for j in compute.list(gpu)} == {j.id for j in mine}
    assert [j.id for j in compute.list(cpu)] == [theirs[0].id]
    assert compute.describe(gpu, theirs[0].id) is None


def test_refusals_are_backend_errors(compute, service):
    lost = make_pool(job_id="no-such-job")
    with pytest.raises(BackendError, match="HTTP 404 JobNotFound: The specified job does not exist") as info:
        compute.launch(lost, 2, ["--pool", "gpu"])
    assert info.value.details["jobs"] == [] and info.value.details["batch_code"] == "JobNotFound"
    with pytest.raises(BatchServiceError, match="JobNotFound"):
        compute.list(lost)
    assert service.jobs == {JOB: {}}


def test_the_service_checks_every_signature(service):
    settings = StackSettings(azure_batch_account_url=service.endpoint, azure_batch_account_key="AAAA" + TEST_KEY[4:])
    forged = AzureBatchCompute.from_settings(settings, transport=FakeBatchTransport(service))
    with pytest.raises(BatchServiceError, match="HTTP 403 AuthenticationFailed: Server failed to authenticate") as info:
        forged.launch(make_pool(), 1, ["--pool", "gpu"])
    assert (info.value.status, info.value.batch_code) == (403, "AuthenticationFailed")
    assert service.jobs[JOB] == {}
