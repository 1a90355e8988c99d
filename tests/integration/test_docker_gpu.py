"""On the real engine (which has no NVIDIA runtime here): a run given a GPU fails with a clear
reason, through the agent's own executor, and leaves no container behind."""

import time

import pytest

from runplane.domain.models import Principal, RunSpec, RunState
from runplane.services import lifecycle
from runplane.services.runs import submit_run
from worker_agent.executor import RunExecutor
from worker_agent.resources import Allocation, Gpu
from worker_agent.run_config import ExecutorConfig, Ports
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker


def test_gpu_run_without_nvidia_runtime_fails_gpu_unavailable(docker_client, aws_stack, tmp_path):
    s = aws_stack
    spec = RunSpec.model_validate({"command": "true", "queue": "manual", "resources": {"memory": "64m"}})
    queued = submit_run(s.store, s.queue, s.pools, Principal(user="a"), spec, None, time.time).run
    run = lifecycle.claim(s.store, queued, 0, "w-gpu", lease_seconds=60, now=time.time())
    gpu = Gpu(0, "GPU-00000000-0000-0000-0000-000000000000")
    config = ExecutorConfig(worker_id="w-gpu", work_dir=tmp_path, stack_id=s.settings.stack_id())
    executor = RunExecutor(
        run,
        Ports(s.store, s.queue, s.objects),
        docker_client,
        config,
        time.time,
        allocation=Allocation((0,), (gpu,)),
        users=ImageUsers(docker_client),
    )
    executor.run_safely()  # in this thread: create, start (refused by the engine), final state
    final = s.store.get(run.id)
    assert final.state == RunState.FAILED
    assert final.failure is not None and final.failure.reason == "gpu_unavailable"
    assert "no working NVIDIA runtime" in final.failure.message
    label = f"io.runplane.run_id={run.id}"
    assert docker_client.containers.list(all=True, sparse=True, filters={"label": label}) == []
