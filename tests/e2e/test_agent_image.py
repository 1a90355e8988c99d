"""The worker agent's container image (infra/agent-image/Dockerfile), as AWS Batch or Kubernetes
would run it: built by scripts/build-agent-image.sh (kept once built from the same sources),
started on the host network with the Docker socket and its work dir mounted at the same path,
serving the "manual" pool of the AWS local stack (moto)."""

import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import FAST as FAST_FLAGS
from tests.conftest import TERMINAL, aws_devstack_settings, nosuid_work_dir, wait_for, wait_state

pytestmark = [pytest.mark.docker, pytest.mark.slow]
# What of the local stack's environment an agent needs to find DynamoDB, SQS and S3.
STACK_ENV = [
    "RUNPLANE_AWS_ENDPOINT_URL",
    "RUNPLANE_AWS_REGION",
    "RUNPLANE_PREFIX",
    "RUNPLANE_POOLS",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
]
# The same leases and polls as the agents of tests/e2e/test_agent.py, as RUNPLANE_AGENT_<FLAG> variables.
FAST = {
    "RUNPLANE_AGENT_" + flag.removeprefix("--").upper().replace("-", "_"): value
    for flag, value in zip(FAST_FLAGS[::2], FAST_FLAGS[1::2], strict=True)
}


def docker_socket(docker_client) -> str:
    url = docker_client.api.base_url
    if url.startswith("http+docker://localhost"):  # docker-py's spelling of the default unix socket
        return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    raise AssertionError(f"the agent container needs a unix Docker socket, not {url}")


@pytest.fixture
def agent_container(docker_client, agent_image, aws_devstack):
    started = []

    def start(worker_id: str, work_dir: Path, **extra_env: str):
        sock = docker_socket(docker_client)
        stack_env = {**os.environ, **aws_devstack_settings(aws_devstack).environment()}
        env = {name: stack_env[name] for name in STACK_ENV if name in stack_env}
        env.update(FAST)
        env.update(
            RUNPLANE_AGENT_POOL="manual",
            RUNPLANE_AGENT_ID=worker_id,
            RUNPLANE_AGENT_WORK_DIR=str(work_dir),
            RUNPLANE_AGENT_IDLE_SECONDS="60",
            RUNPLANE_AGENT_PASS_DOWN_TERMINATION="1",
            **extra_env,
        )
        container = docker_client.containers.run(
            agent_image.id,
            name=f"runplane-agent-test-{worker_id}",
            network_mode="host",
            environment=env,
            volumes={
                sock: {"bind": "/var/run/docker.sock", "mode": "rw"},
                # the host engine bind-mounts run directories: same path inside and outside
                str(work_dir): {"bind": str(work_dir), "mode": "rw"},
            },
            detach=True,
        )
        started.append(container)
        return container

    yield start
    for container in started:
        try:
            container.reload()
            if container.status == "running":
                container.stop(timeout=20)  # SIGTERM, then SIGKILL after 20 s
        finally:
            container.remove(force=True)


@pytest.fixture
def host_work_dir(tmp_path):
    """The host's part: the agent's work dir on a nosuid,nodev mount, which the agent in its
    container cannot make (it would exit with status 2)."""
    with nosuid_work_dir(tmp_path / "work") as work_dir:
        yield work_dir


def logs_of(container) -> str:
    return container.logs().decode(errors="replace")[-4000:]


@pytest.mark.timeout(900)  # includes a cold image build
@pytest.mark.parametrize("alice", ["aws_devstack"], indirect=True)
def test_agent_image_runs_a_job_through_the_host_engine(docker_client, alice, agent_container, host_work_dir):
    worker_id = f"image-{uuid.uuid4().hex[:6]}"
    work_dir = host_work_dir
    container = agent_container(worker_id, work_dir)
    run = alice.request("POST", "/v1/runs", {"command": "echo hi; echo 42 > answer", "queue": "manual"})
    try:
        done = wait_state(alice, run["id"], TERMINAL, timeout=90)
    except AssertionError as e:
        raise AssertionError(f"{e}\nagent container log:\n{logs_of(container)}") from None
    assert done["state"] == "succeeded", f"{done.get('failure')}\n{logs_of(container)}"
    assert done["worker_id"] == worker_id
    assert done["exit_code"] == 0
    assert alice.request("GET", f"/v1/runs/{run['id']}/logs")["data"] == "hi\n"
    files = alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    assert [(f["path"], f["size"]) for f in files] == [("answer", 3)]
    # the agent, as root in its container, removes the run's directory on the shared path
    runs_dir = work_dir / worker_id / "runs"
    wait_for(lambda: not runs_dir.exists() or not any(runs_dir.iterdir()), 10, 0.1, "the run directory to go")
    # SIGTERM (with pass-down) makes the agent leave cleanly
    container.stop(timeout=20)
    assert container.wait(timeout=30)["StatusCode"] == 0, logs_of(container)
    text = logs_of(container)
    assert f"worker {worker_id} serving pool manual" in text
    assert "exiting" in text
