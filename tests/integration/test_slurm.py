"""The slurm backend against a real one-node Slurm: the ComputeBackend contract through each
way in (sbatch; slurmrestd with a JWT over TCP; slurmrestd with local auth on a unix socket)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runplane.compute.slurm.compute import SlurmCompute
from runplane.domain.errors import BackendError
from runplane.domain.pools import Pool
from tests.conftest import wait_for

TRANSPORTS = ["sbatch", "rest-jwt", "rest-unix"]


def rest_options(slurm_conf: str, transport: str) -> dict[str, str]:
    """Where scripts/start-slurm.sh left slurmrestd's address and a token (next to the conf)."""
    home = Path(slurm_conf).parents[1]
    if transport == "rest-jwt":
        return {"rest_url": (home / "rest.url").read_text().strip(), "jwt_token_file": str(home / "rest.token")}
    if transport == "rest-unix":
        return {"rest_url": (home / "rest-unix.url").read_text().strip()}
    return {}


@pytest.fixture
def work() -> Iterator[Path]:
    # jobs that come in over the unix socket run as user slurm: their files must be reachable
    path = Path(tempfile.mkdtemp(prefix="runplane-slurm-"))
    path.chmod(0o777)
    for name, body in {"fake-python": "exec sleep 60", "failing-python": "exit 3"}.items():
        (path / name).write_text(f"#!/bin/sh\n{body}\n")
        (path / name).chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=TRANSPORTS)
def backend(request: pytest.FixtureRequest, slurm_conf: str, work: Path) -> Iterator[tuple[SlurmCompute, Pool]]:
    pool = Pool(
        name=f"c{uuid.uuid4().hex[:8]}",
        backend="slurm",
        cpus=1,
        memory="256m",
        default_image="x",
        options={"log_dir": str(work), "time": "00:10:00", **rest_options(slurm_conf, request.param)},
    )
    compute = SlurmCompute(python=str(work / "fake-python"))  # its "agent" only sleeps
    yield compute, pool
    for job in compute.list(pool):
        compute.cancel(pool, job.id)


def scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True, check=True)
    return dict(field.split("=", 1) for field in out.stdout.split() if "=" in field)


def test_contract_launch_list_describe_cancel(backend):
    compute, pool = backend
    jobs = compute.launch(pool, 2, ["--pool", pool.name])
    assert len(jobs) == 2 and all(j.id.isdigit() for j in jobs) and jobs[0].worker_id != jobs[1].worker_id
    listed = wait_for(lambda: js if len(js := compute.list(pool)) == 2 else None, 30, 0.2, "two jobs listed")
    assert {(j.id, j.worker_id) for j in listed} == {(j.id, j.worker_id) for j in jobs}
    assert all(j.state in ("pending", "running") for j in listed)
    wait_for(lambda: any(j.state == "running" for j in compute.list(pool)), 30, 0.2, "a job to run")
    seen = compute.describe(pool, jobs[0].id)
    assert seen is not None and (seen.worker_id, seen.pool) == (jobs[0].worker_id, pool.name) and seen.alive
    other_pool = pool.model_copy(update={"name": f"{pool.name}x"})
    assert compute.describe(other_pool, jobs[0].id) is None  # another pool's job is not ours

    compute.cancel(pool, jobs[0].id)
    wait_for(lambda: [j.id for j in compute.list(pool)] == [jobs[1].id], 30, 0.2, "the cancelled job to go")
    ended = wait_for(lambda: (d := compute.describe(pool, jobs[0].id)) and not d.alive and d, 30, 0.2, "it to end")
    assert (ended.state, ended.detail["slurm_state"], ended.worker_id) == ("finished", "CANCELLED", jobs[0].worker_id)
    compute.cancel(pool, jobs[0].id)  # idempotent and quiet
    compute.cancel(pool, "999999")  # never existed
    assert compute.describe(pool, "999999") is None
    compute.cancel(pool, jobs[1].id)
    wait_for(lambda: compute.list(pool) == [], 30, 0.2, "no jobs")


def test_a_worker_that_dies_is_described_as_failed_with_slurms_reason(backend, work):
    compute, pool = backend
    failing = pool.model_copy(update={"options": {**pool.options, "python": str(work / "failing-python")}})
    (job,) = compute.launch(failing, 1, ["--pool", pool.name])
    ended = wait_for(lambda: (d := compute.describe(pool, job.id)) and not d.alive and d, 30, 0.2, "the job to fail")
    assert (ended.state, ended.detail["reason"], ended.detail["slurm_state"]) == ("failed", "NonZeroExitCode", "FAILED")


def test_both_ways_in_ask_slurm_for_the_same_job(backend, work):
    compute, pool = backend
    (job,) = compute.launch(pool, 1, ["--pool", pool.name])
    fields = scontrol(job.id)
    assert fields["JobName"] == f"runplane-{pool.name}--{job.worker_id}"
    assert (fields["NumCPUs"], fields["MinMemoryNode"], fields["TimeLimit"]) == ("1", "256M", "00:10:00")
    assert fields["StdOut"] == f"{work}/{job.worker_id}.log"


def test_refused_job_is_a_backend_error(backend):
    compute, pool = backend
    too_big = pool.model_copy(update={"cpus": 512})
    with pytest.raises(BackendError, match="More processors requested than permitted") as caught:
        compute.launch(too_big, 1, ["--pool", pool.name])
    assert caught.value.details["jobs"] == []


@pytest.mark.parametrize("transport", ["rest-jwt", "rest-unix"])
def test_rest_worker_gets_the_stack_settings_the_pool_environment_and_no_credentials(slurm_conf, work, transport):
    (work / "env-python").write_text(f'#!/bin/sh\nenv > "{work}/env-$SLURM_JOB_ID"\n')
    (work / "env-python").chmod(0o755)
    options = {"log_dir": str(work), "environment": {"EXTRA": "1"}, **rest_options(slurm_conf, transport)}
    pool = Pool(
        name=f"e{uuid.uuid4().hex[:8]}", backend="slurm", cpus=1, memory="64m", default_image="x", options=options
    )
    environ = {"RUNPLANE_PREFIX": "p1", "RUNPLANE_AGENT_ARGS": "--x", "AWS_SECRET_ACCESS_KEY": "secret"}
    compute = SlurmCompute(python=str(work / "env-python"), environ=environ)
    (job,) = compute.launch(pool, 1, ["--pool", pool.name])
    wait_for(lambda: (d := compute.describe(pool, job.id)) and not d.alive, 30, 0.2, "the job to end")
    env = dict(line.split("=", 1) for line in (work / f"env-{job.id}").read_text().splitlines() if "=" in line)
    assert (env["RUNPLANE_PREFIX"], env["EXTRA"], env["SLURM_JOB_NAME"]) == (
        "p1",
        "1",
        f"runplane-{pool.name}--{job.worker_id}",
    )
    assert "RUNPLANE_AGENT_ARGS" not in env and "AWS_SECRET_ACCESS_KEY" not in env


def jwt_pool(slurm_conf: str, token_file: Path) -> Pool:
    options = {**rest_options(slurm_conf, "rest-jwt"), "jwt_token_file": str(token_file)}
    return Pool(name="jwt", backend="slurm", cpus=1, memory="64m", default_image="x", options=options)


def test_a_token_slurm_does_not_accept_is_a_clear_backend_error(slurm_conf, tmp_path):
    token = (Path(slurm_conf).parents[1] / "rest.token").read_text().strip()
    head, claims, signature = token.split(".")
    forged = tmp_path / "forged"
    forged.write_text(f"{head}.{claims}.{signature[::-1]}")  # the right claims, a wrong signature
    compute = SlurmCompute()
    with pytest.raises(BackendError, match="Failed while looking for jobs") as caught:
        compute.list(jwt_pool(slurm_conf, forged))
    assert f"JWT from {forged}" in caught.value.message and "Failed while looking for jobs" in caught.value.message
    with pytest.raises(BackendError, match=f"JWT from {forged}.*HTTP 500"):
        compute.launch(jwt_pool(slurm_conf, forged), 1, ["--pool", "jwt"])


def test_an_expired_token_is_refused_before_it_is_sent(slurm_conf):
    token_file = Path(slurm_conf).parents[1] / "rest.token"
    later = SlurmCompute(clock=lambda: time.time() + 8 * 24 * 3600)  # past the week start-slurm.sh gives it
    with pytest.raises(BackendError, match=f"the JWT in {token_file} expired at .*scontrol token"):
        later.list(jwt_pool(slurm_conf, token_file))


def test_an_unreachable_slurmrestd_is_a_backend_error(tmp_path: Any):
    pool = Pool(
        name="gone",
        backend="slurm",
        cpus=1,
        memory="64m",
        default_image="x",
        options={"rest_url": f"unix:{tmp_path}/no.sock"},
    )
    with pytest.raises(BackendError, match="slurmrestd is unreachable"):
        SlurmCompute().list(pool)
