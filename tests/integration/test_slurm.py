"""The slurm backend against a real one-node Slurm: the ComputeBackend contract."""

import time

import pytest

from runplane.compute.slurm import SlurmCompute
from runplane.domain.models import Pool
from tests.conftest import wait_for


@pytest.fixture
def backend(slurm_conf, tmp_path):
    pool = Pool(
        name=f"c{int(time.time() * 1000) % 10**8}",
        backend="slurm",
        cpus=1,
        memory="256m",
        default_image="x",
        options={"log_dir": str(tmp_path)},
    )
    compute = SlurmCompute(python=str(tmp_path / "fake-python"))  # its "agent" only sleeps
    (tmp_path / "fake-python").write_text("#!/bin/sh\nexec sleep 60\n")
    (tmp_path / "fake-python").chmod(0o755)
    yield compute, pool
    for job in compute.list(pool):
        compute.cancel(pool, job.id)


def test_contract_launch_list_cancel(backend):
    compute, pool = backend
    jobs = compute.launch(pool, 2, ["--pool", pool.name])
    assert len(jobs) == 2 and all(j.id.isdigit() for j in jobs)
    listed = wait_for(lambda: js if len(js := compute.list(pool)) == 2 else None, 30, 0.2, "two jobs listed")
    assert {j.id for j in listed} == {j.id for j in jobs}
    assert {j.worker_id for j in listed} == {j.worker_id for j in jobs}
    assert all(j.state in ("pending", "running") for j in listed)
    wait_for(lambda: any(j.state == "running" for j in compute.list(pool)), 30, 0.2, "a job to run")
    compute.cancel(pool, jobs[0].id)
    wait_for(lambda: [j.id for j in compute.list(pool)] == [jobs[1].id], 30, 0.2, "the cancelled job to go")
    compute.cancel(pool, jobs[0].id)  # idempotent and quiet
    compute.cancel(pool, "999999")  # never existed
    compute.cancel(pool, jobs[1].id)
    wait_for(lambda: compute.list(pool) == [], 30, 0.2, "no jobs")


def test_refused_job_is_a_backend_error(backend):
    from runplane.domain.errors import BackendError

    compute, pool = backend
    too_big = pool.model_copy(update={"cpus": 512})
    with pytest.raises(BackendError, match="sbatch refused"):
        compute.launch(too_big, 1, ["--pool", pool.name])
