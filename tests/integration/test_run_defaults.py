"""What a run that gives no memory, disk or time gets (README, docs/pools.md): a share of one worker
of its pool (memory and disk divided by its slots, at most 1g and 10g) and the pool's
``default_time``; in its record, and as the limits its container really runs under, on the real
engine. The pool here is small, so that each limit is met in a second."""

import time
import uuid

import pytest

from runplane.adapters.aws.provision import provision
from runplane.bootstrap import aws_clients, aws_names, build_stack
from runplane.domain.accounting import Rates
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.logs import read_logs
from runplane.services.runs import submit_run
from runplane.settings import StackSettings
from worker_agent.executor import RunExecutor
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker

MIB = 2**20
POOLS = """
pools:
  - name: small
    backend: local
    cpus: 2
    memory: 512m
    disk: 8m
    slots: 2
    max_workers: 0
    default_image: runplane/test-busybox:1
    default_time: 2s
"""


@pytest.fixture
def small(moto_endpoint, tmp_path):
    """A stack on the moto server whose one pool gives a run 256m of memory, 4m of disk and 2 s."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    settings = StackSettings(prefix=f"t{uuid.uuid4().hex[:8]}", aws_endpoint_url=moto_endpoint, pools=str(pools))
    clients = aws_clients(settings)
    stack = build_stack(settings, clients)
    provision(aws_names(settings), ["small"], clients["dynamodb"], clients["sqs"], clients["s3"])
    return stack


def run_to_its_end(s, docker_client, tmp_path, command):
    spec = RunSpec.model_validate({"command": command, "queue": "small"})  # no memory, disk or time
    queued = submit_run(s.ports, Principal(user="a"), spec, None).run
    run = lifecycle.claim(s.store, queued, 0, "w-defaults", lease_seconds=60, now=time.time())
    config = ExecutorConfig(
        worker_id="w-defaults", work_dir=tmp_path / "w", stack_id=s.settings.stack_id(), rates=Rates(cpus=2)
    )
    ports = AgentPorts(s.store, s.queue, s.objects)
    RunExecutor(run, ports, docker_client, config, time.time, users=ImageUsers(docker_client)).run_safely()
    return s.store.get(run.id)


def test_omitted_memory_disk_and_time_get_the_pools_defaults(small, docker_client, tmp_path):
    # the memory limit the container runs under (cgroup v1 or v2), then 6m written into 4m of disk
    limit = "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
    full = run_to_its_end(small, docker_client, tmp_path, f"{limit}; dd if=/dev/zero of=big bs=1M count=6")
    resources = full.spec.resources
    assert (resources.memory, resources.disk, resources.time) == (256 * MIB, 4 * MIB, 2.0)
    assert read_logs(small.objects, full, "stdout", 0).data == f"{256 * MIB}\n"
    assert (full.state, full.failure.reason) == (RunState.FAILED, FailureReason.DISK_LIMIT), full.failure
    # and 2 s of time: a run that sleeps longer is stopped
    slow = run_to_its_end(small, docker_client, tmp_path, "sleep 60")
    assert slow.spec.resources.time == 2.0
    assert slow.state == RunState.TIMED_OUT and slow.failure.reason == FailureReason.TIME_LIMIT, slow.failure


def test_the_share_of_a_large_worker_is_capped_at_1g_and_10g(aws_stack):
    """A pool of 8g memory and 50g disk per slot gives 1g and 10g; with no ``default_time``, 24 h."""
    spec = RunSpec.model_validate({"command": "true", "queue": "big"})
    run = submit_run(aws_stack.ports, Principal(user="a"), spec, None).run
    resources = aws_stack.store.get(run.id).spec.resources
    assert (resources.memory, resources.disk, resources.time) == (2**30, 10 * 2**30, 24 * 3600.0)
