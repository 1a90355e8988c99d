"""On the real engine (which has no NVIDIA runtime here), through the agent's own executor: a run
given a GPU fails with a clear reason and leaves no container behind; in devices mode, against
fake GPU device nodes, a run sees its own GPU's node and the driver's files, nothing more."""

import os
import stat
import time

import pytest

from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.logs import read_logs
from runplane.services.runs import submit_run
from worker_agent.executor import RunExecutor
from worker_agent.gpu_access import GpuAccess, GpuModeError, choose, gather
from worker_agent.resources import Allocation, Gpu
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker


def _run_with_gpus(s, docker_client, tmp_path, command, gpus, access):
    spec = RunSpec.model_validate({"command": command, "queue": "manual", "resources": {"memory": "64m"}})
    queued = submit_run(s.ports, Principal(user="a"), spec, None).run
    run = lifecycle.claim(s.store, queued, 0, "w-gpu", lease_seconds=60, now=time.time())
    config = ExecutorConfig(
        worker_id="w-gpu", work_dir=tmp_path / "work", stack_id=s.settings.stack_id(), gpu_access=access
    )
    executor = RunExecutor(
        run,
        AgentPorts(s.store, s.queue, s.objects),
        docker_client,
        config,
        time.time,
        allocation=Allocation((0,), tuple(gpus)),
        users=ImageUsers(docker_client),
    )
    executor.run_safely()
    final = s.store.get(run.id)
    return final, read_logs(s.objects, final, "stdout", 0).data


def test_gpu_run_without_nvidia_runtime_fails_gpu_unavailable(docker_client, aws_stack, tmp_path):
    gpu = Gpu(0, "GPU-00000000-0000-0000-0000-000000000000")
    # in this thread: create, start (refused by the engine), final state
    final, _ = _run_with_gpus(aws_stack, docker_client, tmp_path, "true", [gpu], GpuAccess())
    assert final.state == RunState.FAILED
    assert final.failure is not None and final.failure.reason == "gpu_unavailable"
    assert "no working NVIDIA runtime" in final.failure.message
    label = f"io.runplane.run_id={final.id}"
    assert docker_client.containers.list(all=True, sparse=True, filters={"label": label}) == []


def test_devices_mode_gives_a_run_its_own_nodes_and_the_driver_read_only(docker_client, aws_stack, tmp_path):
    """No runtime at all: fake GPU nodes (made with mknod, as the null device) for two GPUs and the
    control nodes, and a fake driver directory. The run given the second GPU sees its node and the
    control nodes only, can use them, reads the driver's files and cannot change them."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(dev / name, 0o666)  # as the driver makes them, whatever the umask
    driver = tmp_path / "driver"
    (driver / "lib64").mkdir(parents=True)
    (driver / "lib64" / "libcuda.so.1").write_text("not really a driver\n")
    (driver / "bin").mkdir()
    smi = driver / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: '$NVIDIA_VISIBLE_DEVICES')'\n")
    smi.chmod(0o755)
    gpus = [
        Gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", minor=0),
        Gpu(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", minor=1),
    ]
    facts = gather({}, docker_client.version()["Version"], dev_dir=str(dev), driver_dir=str(driver))
    access = choose("devices", gpus, facts)
    command = (
        "ls /dev | grep nvidia | tr '\\n' ' '; echo; "
        "echo x > /dev/nvidia1 && echo node-writable; "
        "cat /usr/local/nvidia/lib64/libcuda.so.1; "
        "(echo y > /usr/local/nvidia/lib64/libcuda.so.1) 2>/dev/null || echo driver-read-only; "
        "/usr/local/nvidia/bin/nvidia-smi; echo cuda=$CUDA_VISIBLE_DEVICES; echo ld=$LD_LIBRARY_PATH; "
        "mknod /tmp/other c 195 0 2>/dev/null || echo cannot-make-nodes"
    )
    final, out = _run_with_gpus(aws_stack, docker_client, tmp_path, command, gpus[1:], access)
    assert final.state == RunState.SUCCEEDED, final.failure
    lines = out.splitlines()
    assert lines[0].split() == ["nvidia-uvm", "nvidia1", "nvidiactl"]  # not nvidia0: the other GPU's
    assert lines[1:] == [
        "node-writable",
        "not really a driver",
        "driver-read-only",
        f"GPU 0: Fake (UUID: {gpus[1].uuid})",
        f"cuda={gpus[1].uuid}",
        "ld=/usr/local/nvidia/lib64",
        "cannot-make-nodes",  # nor make the other GPU's node itself
    ]
    assert (driver / "lib64" / "libcuda.so.1").read_text() == "not really a driver\n"


def test_a_gpu_mode_that_cannot_serve_is_refused_before_any_run(docker_client, tmp_path):
    """This engine has no NVIDIA runtime, and the host no GPU node: named modes say so."""
    gpus = [Gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", minor=0)]
    facts = gather(docker_client.info(), docker_client.version()["Version"], dev_dir=str(tmp_path))
    with pytest.raises(GpuModeError, match=r"--gpu-mode devices: no .*/nvidia0"):
        choose("devices", gpus, facts)
    if "nvidia" not in facts.runtimes and facts.hook is None:
        with pytest.raises(GpuModeError, match="--gpu-mode nvidia-runtime: the engine has no nvidia runtime"):
            choose("nvidia-runtime", gpus, facts)


def test_the_agents_test_container_tells_a_mode_that_works_from_one_the_engine_refuses(docker_client, tmp_path):
    """The probe the agent tries modes with, on the real engine: the nvidia device request is
    refused here (no NVIDIA runtime), the devices mode's arguments start; no container is left."""
    from worker_agent.main import _gpu_probe

    os.mknod(tmp_path / "nvidia0", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    labels = {"io.runplane.gpucheck": f"w-{tmp_path.name}"}
    probe = _gpu_probe(docker_client, "runplane/test-busybox:1", labels)
    assert probe is not None
    gpu = Gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", minor=0)
    refused = probe(GpuAccess("nvidia-runtime").container_kwargs([gpu]))
    assert refused is not None and "nvidia" in refused
    assert probe(GpuAccess("devices", str(tmp_path)).container_kwargs([gpu])) is None
    left = docker_client.containers.list(
        all=True, filters={"label": f"io.runplane.gpucheck={labels['io.runplane.gpucheck']}"}
    )
    assert left == []
    assert _gpu_probe(docker_client, "runplane/not-here:0", labels) is None  # no image: facts alone
