"""What the agent's executor records of a run's use at its end, on the real engine: GPU-seconds
and cost from the pool's shape and price, added to what earlier attempts used."""

import time

import pytest

from runplane.domain.accounting import Rates
from runplane.domain.models import Principal, RunSpec, RunState, Usage
from runplane.ports import Expect
from runplane.services import lifecycle
from runplane.services.runs import submit_run
from worker_agent.executor import RunExecutor
from worker_agent.run_config import ExecutorConfig, Ports
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker


def run_to_its_end(s, docker_client, tmp_path, body, rates, earlier=None):
    """Submit ``body``, record ``earlier`` as what earlier attempts used, claim it and run it on
    this engine with an executor charging ``rates``; the run as stored at its end."""
    spec = RunSpec.model_validate(body)
    queued = submit_run(s.store, s.queue, s.pools, Principal(user="a"), spec, None, time.time).run
    if earlier is not None:
        queued = s.store.update(queued, Expect(states=frozenset({RunState.QUEUED})), {"usage": earlier})
    run = lifecycle.claim(s.store, queued, 0, "w-usage", lease_seconds=60, now=time.time())
    config = ExecutorConfig(worker_id="w-usage", work_dir=tmp_path, stack_id=s.settings.stack_id(), rates=rates)
    ports = Ports(s.store, s.queue, s.objects)
    RunExecutor(run, ports, docker_client, config, time.time, users=ImageUsers(docker_client)).run_safely()
    final = s.store.get(run.id)
    assert final.state == RunState.SUCCEEDED, final.failure
    return final


def test_gpu_seconds_and_cost_are_added_to_those_of_earlier_attempts(docker_client, aws_stack, tmp_path):
    # asks one of the pool's two GPUs (the engine here has none: the executor is given no
    # allocation, so the container runs without a device, and is charged for what it asked)
    body = {"command": "echo hi", "queue": "big", "resources": {"gpus": 1, "cpus": 0.5, "memory": "64m"}}
    earlier = Usage(cpu_seconds=2.0, gpu_seconds=100.0, cost=1.0)  # as an earlier attempt left it
    rates = Rates(cpus=2, gpus=2, price_per_hour=7.2)
    final = run_to_its_end(aws_stack, docker_client, tmp_path, body, rates, earlier)
    ran = final.usage.timings["run"]
    assert ran > 0
    assert final.usage.gpu_seconds == pytest.approx(100.0 + ran, abs=1e-3)  # 1 GPU for as long as it ran
    assert final.usage.cost == pytest.approx(1.0 + 7.2 * ran / 3600 * 0.5)  # half the worker: 1 of 2 GPUs
    assert final.usage.cpu_seconds is not None and final.usage.cpu_seconds >= 2.0  # carried on, never lost


def test_a_pool_without_a_price_records_no_cost(docker_client, aws_stack, tmp_path):
    body = {"command": "echo hi", "queue": "manual", "resources": {"memory": "64m"}}
    final = run_to_its_end(aws_stack, docker_client, tmp_path, body, Rates(cpus=2))
    assert (final.usage.gpu_seconds, final.usage.cost) == (0.0, None)
