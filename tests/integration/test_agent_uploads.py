"""A run's uploaded directory as its worker gives it: unpacked from the owner's upload into the input
cache and bound read-only at /inputs/NAME, the run's ``workdir`` its working directory; a hostile
archive ends the run ``input_unavailable`` before any container exists. A real executor on the real
engine, on the stack of one machine."""

import hashlib
import io
import tarfile
import time

import pytest

from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.domain.uploads import upload_key
from runplane.services import lifecycle
from runplane.services.logs import read_logs
from runplane.services.runs import submit_run
from worker_agent.executor import RunExecutor
from worker_agent.inputs import InputCache
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker

WORKER = "w-uploads"
ALICE = Principal(user="alice")


def upload(stack, owner, members):
    """``members`` (TarInfo, bytes or None) packed as a gzip'd tar and stored as ``owner``'s upload; its sha."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    sha = hashlib.sha256(buf.getvalue()).hexdigest()
    stack.objects.put_bytes(upload_key(owner, sha), buf.getvalue())
    return sha


def entry(name, data=None, kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info, data


def execute(stack, docker_client, tmp_path, run):
    claimed = lifecycle.claim(stack.store, run, run.attempt, WORKER, lease_seconds=60, now=time.time())
    config = ExecutorConfig(
        worker_id=WORKER, work_dir=tmp_path / WORKER, stack_id=stack.settings.stack_id(), pull="never"
    )
    ports = AgentPorts(stack.store, stack.queue, stack.objects)
    cache = InputCache(tmp_path / "cache", stack.objects, stack.store)
    RunExecutor(
        claimed, ports, docker_client, config, time.time, inputs=cache, users=ImageUsers(docker_client)
    ).run_safely()
    return stack.store.get(run.id)


def submit(stack, command, **extra):
    spec = RunSpec.model_validate({"command": command, "queue": "manual", **extra})
    return submit_run(stack.ports, ALICE, spec, None).run


def test_a_run_reads_its_upload_read_only_from_its_workdir(local_stack, docker_client, tmp_path):
    sha = upload(
        local_stack,
        "alice",
        [entry("src/", kind=tarfile.DIRTYPE), entry("src/data.txt", b"forty-two\n"), entry("top.txt", b"top\n")],
    )
    command = "pwd; cat data.txt ../top.txt; touch new 2>/dev/null && echo writable || echo read-only"
    run = submit(local_stack, command, inputs={"code": f"upload:{sha}"}, workdir="/inputs/code/src")
    ran = execute(local_stack, docker_client, tmp_path, run)
    assert ran.state == RunState.SUCCEEDED, ran.failure
    assert read_logs(local_stack.objects, ran, "stdout", 0).data == "/inputs/code/src\nforty-two\ntop\nread-only\n"


def test_a_hostile_upload_ends_the_run_before_any_container(local_stack, docker_client, tmp_path):
    sha = upload(local_stack, "alice", [entry("ok.txt", b"x"), entry("../escaped.txt", b"owned")])
    run = submit(local_stack, "echo ran", inputs={"code": f"upload:{sha}"})
    failed = execute(local_stack, docker_client, tmp_path, run)
    assert (failed.state, failed.failure.reason) == (RunState.FAILED, FailureReason.INPUT_UNAVAILABLE)
    assert "refused: the archive names '../escaped.txt': it leaves the directory" in failed.failure.message
    containers = docker_client.containers.list(all=True, sparse=True, filters={"label": f"io.runplane.run_id={run.id}"})
    assert containers == []
    assert not (tmp_path / "escaped.txt").exists()
    assert not any(tmp_path.rglob("escaped.txt"))


def test_a_run_whose_upload_is_gone_fails_naming_it_and_saying_to_upload_again(local_stack, docker_client, tmp_path):
    """Deleted after submit (retention: unused too long): no container, and what to do next."""
    sha = upload(local_stack, "alice", [entry("train.py", b"print(1)\n")])
    run = submit(local_stack, "echo ran", inputs={"code": f"upload:{sha}"})
    local_stack.objects.delete([upload_key("alice", sha)])
    failed = execute(local_stack, docker_client, tmp_path, run)
    assert (failed.state, failed.failure.reason) == (RunState.FAILED, FailureReason.INPUT_UNAVAILABLE)
    assert failed.failure.message.startswith(f"input code unavailable: upload {sha} is gone ("), failed.failure.message
    assert "upload the directory again" in failed.failure.message
    assert docker_client.containers.list(all=True, sparse=True, filters={"label": f"io.runplane.run_id={run.id}"}) == []
