"""The agent's view of this host's real hardware: NVIDIA GPUs and cgroup v2 files.

These run where the hardware is (a GPU host, a cgroup v2 host) and are skipped elsewhere; the same
code paths are covered with recorded inventories in tests/unit/test_resources.py. They import only
the agent's resource and usage modules, so a GPU host can run them with
``pytest --noconftest -o addopts= tests/integration/test_host_hardware.py``.
"""

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from worker_agent.gpu_access import GpuAccess
from worker_agent.resources import Allocator, _nvml_gpus, _smi_gpus, detect_gpus, select_gpus
from worker_agent.usage import read_cgroup

needs_gpu = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU host (nvidia-smi)")
CGROUP = Path("/sys/fs/cgroup")
needs_cgroup_v2 = pytest.mark.skipif(
    not (CGROUP / "cgroup.controllers").exists(), reason="needs a cgroup v2 host (this one is v1)"
)


@needs_gpu
def test_nvml_and_nvidia_smi_see_the_same_gpus():
    smi = _smi_gpus()
    assert smi, "nvidia-smi answered but listed no GPU"
    nvml = _nvml_gpus()
    if nvml is None:
        pytest.skip("nvidia-ml-py is not installed (it is optional; detection then reads nvidia-smi)")
    assert [(g.index, g.uuid, g.name) for g in nvml] == [(g.index, g.uuid, g.name) for g in smi]
    for a, b in zip(nvml, smi, strict=True):  # nvidia-smi rounds to MiB
        assert abs(a.memory - b.memory) < 2**20


@needs_gpu
def test_detection_finds_what_nvidia_smi_lists():
    smi = _smi_gpus()
    assert smi, "nvidia-smi answered but listed no GPU"
    detected = detect_gpus()
    assert [g.uuid for g in detected] == [g.uuid for g in smi]
    assert all(g.uuid.startswith(("GPU-", "MIG-")) and g.memory > 2**30 for g in detected)


@needs_gpu
def test_every_gpu_goes_to_one_run_and_the_request_names_it():
    gpus = detect_gpus()
    assert gpus, "nvidia-smi is here but no GPU was detected"
    assert select_gpus(gpus, [str(gpus[-1].index)]) == [gpus[-1]]
    assert select_gpus(gpus, [gpus[0].uuid]) == [gpus[0]]
    with pytest.raises(ValueError, match="is not on this host"):
        select_gpus(gpus, ["GPU-00000000-0000-0000-0000-000000000000"])

    allocator = Allocator(cpus=list(range(len(gpus) + 1)), gpus=gpus)
    allocations = [allocator.allocate(f"r{i}", cpus=1, gpus=1) for i in range(len(gpus))]
    assert all(a is not None for a in allocations)
    assert sorted(g.uuid for a in allocations for g in a.gpus) == sorted(g.uuid for g in gpus)
    assert allocator.allocate("one-too-many", cpus=1, gpus=1) is None  # waits, never shares
    first = allocations[0]
    access = GpuAccess("nvidia-runtime")
    (request,) = access.container_kwargs(first.gpus)["device_requests"]
    assert request["Driver"] == "nvidia"
    assert request["DeviceIDs"] == [first.gpus[0].uuid]
    assert request["Capabilities"] == [["gpu"]]
    assert access.environment(first.gpus, {}) == {"NVIDIA_VISIBLE_DEVICES": first.gpus[0].uuid}
    allocator.release("r0")
    again = allocator.allocate("next", cpus=1, gpus=1)
    assert again is not None and again.gpus == first.gpus


def _own_cgroup_as_a_container(tmp_path: Path) -> tuple[Path, str, Path]:
    """Docker's cgroup layout (``<root>/docker/<id>``) pointed at this process's own cgroup:
    (that cgroup, the id, the root)."""
    own = CGROUP / Path(Path("/proc/self/cgroup").read_text().strip().split(":", 2)[2]).relative_to("/")
    if not (own / "cpu.stat").exists():
        pytest.skip("this process's cgroup is not visible under /sys/fs/cgroup")
    container_id = hashlib.sha256(str(tmp_path).encode()).hexdigest()
    root = tmp_path / "cgroup"
    (root / "docker").mkdir(parents=True)
    (root / "cgroup.controllers").write_text((CGROUP / "cgroup.controllers").read_text())
    (root / "docker" / container_id).symlink_to(own)
    return own, container_id, root


@needs_cgroup_v2
def test_usage_is_read_from_real_cgroup_v2_files(tmp_path):
    _, container_id, root = _own_cgroup_as_a_container(tmp_path)
    before = read_cgroup(container_id, root)
    assert before is not None and before.cpu_seconds is not None
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn some cpu inside this cgroup
        hashlib.sha256(b"x" * 4096).digest()
    after = read_cgroup(container_id, root)
    assert after is not None and after.cpu_seconds is not None
    assert after.cpu_seconds >= before.cpu_seconds + 0.25
    assert read_cgroup("0" * 64, root) is None  # a container this host does not have


@needs_cgroup_v2
def test_memory_peak_is_read_from_real_cgroup_v2_files(tmp_path):
    own, container_id, root = _own_cgroup_as_a_container(tmp_path)
    if not (own / "memory.current").exists():
        pytest.skip("the memory controller is not enabled for this process's cgroup")
    ballast = bytearray(64 * 2**20)  # touch 64 MiB
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    after = read_cgroup(container_id, root)
    del ballast
    assert after is not None and after.memory_peak is not None and after.memory_peak >= 64 * 2**20


def test_nvidia_smi_absent_means_no_gpus_here():
    """On a host without an NVIDIA driver detection reports none instead of failing."""
    if shutil.which("nvidia-smi") is not None:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "GPU 0" in out.stdout
        assert len(detect_gpus()) == out.stdout.count("GPU ")
    else:
        assert _smi_gpus() is None
        assert detect_gpus() == (_nvml_gpus() or [])  # NVML alone (a driver without the tool), or none
