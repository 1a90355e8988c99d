"""On the real engine (which has no NVIDIA runtime here): a GPU request fails with a clear
reason and leaves no container behind."""

from pathlib import Path

import docker.errors
import pytest

from runplane.domain.models import Run, RunSpec
from worker_agent.executor import ExecutorConfig, _create_failure, container_spec
from worker_agent.resources import Allocation, Gpu

pytestmark = pytest.mark.docker


def test_gpu_request_without_nvidia_runtime(docker_client, tmp_path):
    run = Run(
        id="r-gputest",
        owner="a",
        queue="q",
        attempt=1,
        created_at=0,
        spec=RunSpec(command="true", resources={"gpus": 1, "memory": "64m"}),
    )
    gpu = Gpu(0, "GPU-00000000-0000-0000-0000-000000000000")
    spec = container_spec(
        run,
        "runplane/test-busybox:1",
        ExecutorConfig(worker_id="w", work_dir=tmp_path),
        Path(tmp_path),
        Allocation(cpus=(0,), gpus=(gpu,)),
    )
    container = None
    try:
        container = docker_client.containers.create(**spec)
        with pytest.raises(docker.errors.APIError) as info:
            container.start()
    finally:
        if container is not None:
            container.remove(force=True)
    outcome = _create_failure(info.value, Allocation(cpus=(0,), gpus=(gpu,)), "start")
    assert outcome.reason == "gpu_unavailable"
    assert "no working NVIDIA runtime" in outcome.message
    assert not docker_client.containers.list(all=True, sparse=True, filters={"name": "runplane-r-gputest-1"})
