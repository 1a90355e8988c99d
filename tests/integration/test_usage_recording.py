"""What the agent's executor records of a run's use at its end, on the real engine: the cpu time
its container used, as measured (a run that computes shows what its own process counted, an idle
one next to none); GPU-seconds and cost from the pool's shape and price, added to what earlier
attempts used; peak memory and disk; and the cgroup reader behind cpu and memory, on this host."""

import time

import pytest

from runplane.domain.accounting import Rates
from runplane.domain.expect import Expect
from runplane.domain.runs import RunSpec, Usage
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.logs import outputs_prefix
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE, wait_for
from worker_agent.executor import RunExecutor
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.usage import CGROUP_ROOT, from_stats, read_cgroup
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker

# computes for about a second of cpu, then writes the utime and stime of its own shell (clock
# ticks of 1/100 s) to its output "ticks": what the kernel counted for it, known without the agent
BURN = "i=0; while [ $i -lt 1200000 ]; do i=$((i+1)); done; cut -d' ' -f14,15 /proc/$$/stat > ticks"


def run_to_its_end(s, docker_client, tmp_path, body, rates, earlier=None, **config):
    """Submit ``body``, record ``earlier`` as what earlier attempts used, claim it and run it on
    this engine with an executor charging ``rates`` (and ``config`` over its ExecutorConfig); the
    run as stored at its end."""
    spec = RunSpec.model_validate(body)
    queued = submit_run(s.ports, Principal(user="a"), spec, None).run
    if earlier is not None:
        queued = s.store.update(queued, Expect(states=frozenset({RunState.QUEUED})), {"usage": earlier})
    run = lifecycle.claim(s.store, queued, 0, "w-usage", lease_seconds=60, now=time.time())
    settings = ExecutorConfig(
        worker_id="w-usage", work_dir=tmp_path, stack_id=s.settings.stack_id(), rates=rates, **config
    )
    ports = AgentPorts(s.store, s.queue, s.objects)
    RunExecutor(run, ports, docker_client, settings, time.time, users=ImageUsers(docker_client)).run_safely()
    final = s.store.get(run.id)
    assert final.state == RunState.SUCCEEDED, final.failure
    return final


def test_gpu_seconds_and_cost_are_added_to_those_of_earlier_attempts(docker_client, aws_stack, tmp_path):
    # asks one of the pool's two GPUs (the engine here has none: the executor is given no
    # allocation, so the container runs without a device, and is charged for what it asked)
    # it computes a little, then idles a second: the agent reads the container's cgroup at each
    # tick (0.2 s), and one that only slept could end before a loaded worker's first look
    command = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; sleep 1"
    body = {"command": command, "queue": "big", "resources": {"gpus": 1, "cpus": 0.5, "memory": "64m"}}
    earlier = Usage(cpu_seconds=2.0, gpu_seconds=100.0, cost=1.0)  # as an earlier attempt left it
    rates = Rates(cpus=2, gpus=2, price_per_hour=7.2)
    final = run_to_its_end(aws_stack, docker_client, tmp_path, body, rates, earlier)
    ran = final.usage.timings["run"]
    assert ran > 0
    assert final.usage.gpu_seconds == pytest.approx(100.0 + ran, abs=1e-3)  # 1 GPU for as long as it ran
    assert final.usage.cost == pytest.approx(1.0 + 7.2 * ran / 3600 * 0.5)  # half the worker: 1 of 2 GPUs
    cpu = final.usage.cpu_seconds
    assert cpu is not None and 2.0 < cpu < 2.0 + ran  # its own (measured, above 0) added on; under 1 cpu


def test_a_pool_without_a_price_records_no_cost(docker_client, aws_stack, tmp_path):
    body = {"command": "echo hi", "queue": "manual", "resources": {"memory": "64m"}}
    final = run_to_its_end(aws_stack, docker_client, tmp_path, body, Rates(cpus=2))
    assert (final.usage.gpu_seconds, final.usage.cost) == (0.0, None)


def test_the_cpu_time_recorded_is_what_the_container_used(docker_client, aws_stack, tmp_path):
    """The container's cgroup goes when it exits, so its figures are read at every tick (0.2 s),
    not only at each full usage sample (here only the first: one an hour). The loop is over a
    second before the exit: however late a loaded worker's ticks come, one sees all of it."""
    body = {"command": f"{BURN}; sleep 1", "queue": "manual"}
    busy = run_to_its_end(aws_stack, docker_client, tmp_path, body, Rates(cpus=2), usage_seconds=3600)
    ticks = aws_stack.objects.get_bytes(outputs_prefix(busy.id, busy.attempt) + "ticks").split()
    counted = sum(int(t) for t in ticks) / 100  # what the kernel counted for the loop's shell alone
    assert counted >= 0.5, ticks  # the loop did compute
    cpu = busy.usage.cpu_seconds
    # all of the loop's (less the rounding of two clock ticks); what the kernel counted for the
    # container's other processes besides. Read only at full samples, it was about 0.2 s
    assert cpu is not None and counted - 0.02 <= cpu <= counted + 0.5, (cpu, counted)

    idle = run_to_its_end(aws_stack, docker_client, tmp_path, {"command": "sleep 1", "queue": "manual"}, Rates(cpus=2))
    assert idle.usage.cpu_seconds is not None and 0 < idle.usage.cpu_seconds < 0.1, idle.usage


MIB = 2**20


def test_the_cgroup_reader_reads_a_real_container_on_this_host(docker_client):
    """``read_cgroup`` on this host's layout (this CI's engine runs cgroup v1: memory and cpuacct
    under ``docker/<id>``): a container that holds 48 MiB in /dev/shm (charged to its memory
    cgroup) and spins reads as at least that peak and some cpu time, as the engine's own stats say."""
    version = "v2" if (CGROUP_ROOT / "cgroup.controllers").exists() else "v1"
    spin = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"
    command = f"dd if=/dev/zero of=/dev/shm/x bs=1M count=48 2>/dev/null; {spin}; echo ready; sleep 60"
    container = docker_client.containers.run(
        TEST_IMAGE, ["sh", "-c", command], detach=True, network_mode="none", mem_limit="256m", shm_size="128m"
    )
    try:
        wait_for(lambda: b"ready" in container.logs(), 60, 0.1, "the container to fill its memory")
        sample = read_cgroup(container.id)
        assert sample is not None, f"no cgroup of container {container.id} found on this cgroup {version} host"
        assert sample.memory_peak is not None and 48 * MIB <= sample.memory_peak <= 256 * MIB, (version, sample)
        assert sample.cpu_seconds is not None and 0.01 < sample.cpu_seconds < 60, (version, sample)
        engine = from_stats(container.stats(stream=False))
        assert engine.memory_peak is not None and engine.memory_peak >= 48 * MIB  # the engine agrees
    finally:
        container.remove(force=True)
    assert read_cgroup(container.id) is None  # gone with its container


def test_peak_memory_and_disk_are_recorded(docker_client, aws_stack, tmp_path):
    """A run that holds 40 MiB of memory for a while and writes 3 MiB of outputs records a peak
    of at least 40 MiB and a disk of 3 MiB (its home and its layer hold next to nothing)."""
    command = "dd if=/dev/zero of=/dev/shm/x bs=1M count=40 && dd if=/dev/zero of=big bs=1M count=3 && sleep 1"
    body = {"command": command, "queue": "manual", "resources": {"memory": "256m"}}
    usage = run_to_its_end(aws_stack, docker_client, tmp_path, body, Rates(cpus=2)).usage
    assert usage.memory_peak is not None and 40 * MIB <= usage.memory_peak <= 256 * MIB, usage
    assert usage.disk is not None and 3 * MIB <= usage.disk < 4 * MIB, usage
