"""GPU modes: for a fake inventory, the exact device nodes, mounts and variables each mode gives a
run's container, how a mode is chosen from what the host has, and how those facts are read."""

import json
from pathlib import Path

import pytest
from docker.types import DeviceRequest, Mount

from runplane.domain.runs import Run, RunSpec
from worker_agent.container_spec import container_spec, image_environment
from worker_agent.gpu_access import (
    BIN_DIR,
    LIB_DIR,
    DriverFile,
    GpuAccess,
    GpuModeError,
    HostFacts,
    choose,
    driver_files_in,
    gather,
    libraries_from_cache,
)
from worker_agent.resources import Allocation, Gpu, driver_minors, with_minors
from worker_agent.run_config import ExecutorConfig

A = Gpu(0, "GPU-aaaaaaaa-1111-2222-3333-444444444444", minor=2)
B = Gpu(1, "GPU-bbbbbbbb-1111-2222-3333-444444444444", minor=3)
DRIVER = (
    DriverFile("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", f"{LIB_DIR}/libcuda.so.1"),
    DriverFile("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", f"{LIB_DIR}/libnvidia-ml.so.1"),
    DriverFile("/usr/bin/nvidia-smi", f"{BIN_DIR}/nvidia-smi"),
)
DEVICES = GpuAccess("devices", "/host/dev", ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"), DRIVER)
WORKING = HostFacts(
    runtimes=("nvidia", "runc"),
    engine_version="28.2.2",
    cdi_enabled=True,
    cdi_gpus=(f"nvidia.com/gpu={A.uuid}", f"nvidia.com/gpu={B.uuid}", "nvidia.com/gpu=0", "nvidia.com/gpu=1"),
    dev_dir="/host/dev",
    dev_nodes=("nvidia-uvm", "nvidia2", "nvidia3", "nvidiactl"),
    libraries={"libcuda.so.1": "/lib/libcuda.so.1"},
    tools={"nvidia-smi": "/usr/bin/nvidia-smi"},
)


def test_nvidia_runtime_names_the_runs_gpus_in_a_device_request():
    access = GpuAccess("nvidia-runtime")
    assert access.container_kwargs([B]) == {
        "device_requests": [DeviceRequest(driver="nvidia", device_ids=[B.uuid], capabilities=[["gpu"]])]
    }
    assert access.environment([B], {}) == {"NVIDIA_VISIBLE_DEVICES": B.uuid}


def test_cdi_names_each_gpu_by_uuid():
    assert GpuAccess("cdi").container_kwargs([A, B]) == {
        "device_requests": [
            DeviceRequest(driver="cdi", device_ids=[f"nvidia.com/gpu={A.uuid}", f"nvidia.com/gpu={B.uuid}"])
        ]
    }
    assert GpuAccess("cdi").environment([B], {}) == {"NVIDIA_VISIBLE_DEVICES": B.uuid, "CUDA_VISIBLE_DEVICES": B.uuid}


def test_devices_gives_the_runs_own_nodes_the_control_nodes_and_the_driver_read_only():
    kwargs = DEVICES.container_kwargs([B])
    assert kwargs["devices"] == [
        "/host/dev/nvidia3:/dev/nvidia3:rw",  # B's minor number, not its index
        "/host/dev/nvidiactl:/dev/nvidiactl:rw",
        "/host/dev/nvidia-uvm:/dev/nvidia-uvm:rw",
        "/host/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rw",
    ]
    assert kwargs["mounts"] == [Mount(f.container, f.host, type="bind", read_only=True) for f in DRIVER]
    assert DEVICES.environment([B], {}) == {
        "NVIDIA_VISIBLE_DEVICES": B.uuid,
        "CUDA_VISIBLE_DEVICES": B.uuid,
        "LD_LIBRARY_PATH": LIB_DIR,
    }
    # the image's library path is kept, the driver's after it
    assert DEVICES.environment([A, B], {"LD_LIBRARY_PATH": "/opt/lib"})["LD_LIBRARY_PATH"] == f"/opt/lib:{LIB_DIR}"
    with pytest.raises(ValueError, match="minor number"):
        DEVICES.container_kwargs([Gpu(0, "GPU-no-minor")])
    assert DEVICES.environment([A, B], {})["CUDA_VISIBLE_DEVICES"] == f"{A.uuid},{B.uuid}"


@pytest.mark.parametrize("mode", ["nvidia-runtime", "cdi", "devices"])
def test_a_run_without_gpus_gets_nothing_and_sees_none(mode):
    access = GpuAccess(mode)  # type: ignore[arg-type]
    assert access.container_kwargs([]) == {}
    assert access.environment([], {}) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_a_run_cannot_name_other_gpus_than_its_own(tmp_path):
    """A hostile run sets NVIDIA_VISIBLE_DEVICES=all and CUDA_VISIBLE_DEVICES=0,1: the container
    gets its own GPU's variables, node and driver files, and nothing of the other GPU."""
    run = Run(
        id="r-1",
        owner="mallory",
        spec=RunSpec(command="nvidia-smi", env={"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0,1"}),
        queue="default",
        created_at=0,
    )
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path, gpu_access=DEVICES)
    image_env = image_environment({"Config": {"Env": ["PATH=/bin", "LD_LIBRARY_PATH=/opt/conda/lib"]}})
    spec = container_spec(run, "img", config, Path("/o"), Allocation(cpus=(0,), gpus=(B,)), image_env=image_env)
    assert spec["environment"]["NVIDIA_VISIBLE_DEVICES"] == B.uuid
    assert spec["environment"]["CUDA_VISIBLE_DEVICES"] == B.uuid
    assert spec["environment"]["LD_LIBRARY_PATH"] == f"/opt/conda/lib:{LIB_DIR}"  # the image's, then the driver's
    assert [d for d in spec["devices"] if "/dev/nvidia" in d and d.split(":")[1][len("/dev/nvidia") :].isdigit()] == [
        "/host/dev/nvidia3:/dev/nvidia3:rw"
    ]
    assert spec["mounts"][0] == Mount("/runplane/output", "/o", type="bind")
    assert [m["Target"] for m in spec["mounts"][1:]] == [f.container for f in DRIVER]
    assert all(m["ReadOnly"] for m in spec["mounts"][1:])
    assert "device_requests" not in spec and spec["privileged"] is False


def test_auto_takes_the_first_mode_that_works_here():
    assert choose("auto", [A, B], WORKING).mode == "nvidia-runtime"
    no_runtime = HostFacts(**{**WORKING.__dict__, "runtimes": ("runc",)})
    assert choose("auto", [A, B], no_runtime).mode == "cdi"
    old_engine = HostFacts(**{**no_runtime.__dict__, "engine_version": "20.10.24", "cdi_enabled": False})
    chosen = choose("auto", [A, B], old_engine)
    assert chosen.mode == "devices"
    assert chosen.control_nodes == ("nvidiactl", "nvidia-uvm")  # those present, in order
    assert chosen.driver_files == (
        DriverFile("/lib/libcuda.so.1", f"{LIB_DIR}/libcuda.so.1"),
        DriverFile("/usr/bin/nvidia-smi", f"{BIN_DIR}/nvidia-smi"),
    )
    # a spec naming GPUs by index only is not used: an index is the host's, not the agent's
    index_only = HostFacts(**{**no_runtime.__dict__, "cdi_gpus": ("nvidia.com/gpu=0", "nvidia.com/gpu=1")})
    assert choose("auto", [B], index_only).mode == "devices"


def test_auto_goes_on_when_the_engine_refuses_a_modes_test_container():
    """The facts can look right (a runtime named nvidia) where the engine still cannot serve it:
    the test container decides."""
    tried = []

    def probe(extra):
        tried.append(extra)
        return 'could not select device driver "nvidia"' if extra["device_requests"][0]["Driver"] == "nvidia" else None

    assert choose("auto", [A, B], WORKING, probe).mode == "cdi"
    assert [t["device_requests"][0]["DeviceIDs"] for t in tried] == [[A.uuid], [f"nvidia.com/gpu={A.uuid}"]]
    with pytest.raises(GpuModeError, match="--gpu-mode nvidia-runtime: the engine refused a test container"):
        choose("nvidia-runtime", [A], WORKING, probe)


def test_a_named_mode_this_host_cannot_serve_says_what_is_missing():
    bare = HostFacts(engine_version="20.10.24")
    with pytest.raises(GpuModeError, match="--gpu-mode nvidia-runtime: the engine has no nvidia runtime"):
        choose("nvidia-runtime", [A], bare)
    with pytest.raises(GpuModeError, match=r"--gpu-mode cdi: Docker 20\.10\.24 reads no CDI specs"):
        choose("cdi", [A], bare)
    no_spec = HostFacts(engine_version="28.2.2", cdi_enabled=True)
    with pytest.raises(GpuModeError, match=f"no CDI spec in /etc/cdi or /var/run/cdi names {A.uuid} by UUID"):
        choose("cdi", [A], no_spec)
    with pytest.raises(GpuModeError, match="--gpu-mode devices: no /dev/nvidia2, /dev/nvidiactl, /dev/nvidia-uvm"):
        choose("devices", [A], bare)
    with pytest.raises(GpuModeError, match="the minor number of GPU-x is unknown"):
        choose("devices", [Gpu(0, "GPU-x")], WORKING)
    nodes_only = HostFacts(dev_nodes=("nvidia2", "nvidiactl", "nvidia-uvm"))
    with pytest.raises(GpuModeError, match=r"no libcuda\.so\.1 in the loader cache or --gpu-driver-dir"):
        choose("devices", [A], nodes_only)
    with pytest.raises(GpuModeError, match=r"no GPU mode works on this host: nvidia-runtime: .*; cdi: .*; devices: "):
        choose("auto", [A], bare)
    with pytest.raises(GpuModeError, match="is not one of auto, nvidia-runtime, cdi, devices"):
        choose("vulkan", [A], WORKING)


LDCONFIG = """\
1543 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so
\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
"""


def test_the_driver_libraries_are_read_from_the_loader_cache():
    """The 64-bit driver libraries under their sonames; not the toolkit's (libcudart: the image's)."""
    assert libraries_from_cache(LDCONFIG) == {
        "libnvidia-ml.so.1": "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "libcuda.so.1": "/lib/x86_64-linux-gnu/libcuda.so.1",
    }


def test_gather_reads_nodes_driver_dir_and_cdi_specs(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl", "null"):
        (dev / name).touch()
    driver = tmp_path / "driver"
    (driver / "lib64").mkdir(parents=True)
    (driver / "bin").mkdir()
    for name in ("libcuda.so.1", "libcuda.so.550.54.15", "libnvidia-ml.so.1", "libcudart.so.12"):
        (driver / "lib64" / name).touch()
    smi = driver / "bin" / "nvidia-smi"
    smi.touch()
    smi.chmod(0o755)
    (driver / "bin" / "nvidia-debugdump").touch()  # not executable: not a tool
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0"}, {"name": A.uuid}]}
    (cdi / "nvidia.json").write_text(json.dumps(spec))
    (cdi / "other.yaml").write_text("cdiVersion: 0.5.0\nkind: vendor.com/fpga\ndevices:\n  - name: f0\n")
    (cdi / "broken.json").write_text("{")
    info = {"Runtimes": {"runc": {}, "nvidia": {}}, "CDISpecDirs": [str(cdi)]}
    facts = gather(info, "28.2.2", dev_dir=str(dev), driver_dir=str(driver), which=lambda name: None)
    assert facts.runtimes == ("nvidia", "runc") and facts.hook is None and facts.cdi_enabled
    assert facts.cdi_gpus == ("nvidia.com/gpu=0", f"nvidia.com/gpu={A.uuid}", "vendor.com/fpga=f0")
    assert facts.dev_nodes == ("nvidia0", "nvidiactl")
    assert facts.libraries == {
        "libcuda.so.1": str(driver / "lib64" / "libcuda.so.1"),
        "libnvidia-ml.so.1": str(driver / "lib64" / "libnvidia-ml.so.1"),
    }
    assert facts.tools == {"nvidia-smi": str(smi)}
    assert driver_files_in(tmp_path / "nowhere") == ({}, {})
    no_cdi = gather({}, "24.0.7", dev_dir=str(tmp_path / "none"), loader_cache=lambda: LDCONFIG, which=lambda n: None)
    assert (no_cdi.cdi_enabled, no_cdi.dev_nodes, sorted(no_cdi.libraries)) == (
        False,
        (),
        ["libcuda.so.1", "libnvidia-ml.so.1"],
    )


def test_minor_numbers_come_from_the_driver_where_nvml_gave_none(tmp_path):
    for bus, uuid, minor in (("0000:18:00.0", A.uuid, 5), ("0000:2a:00.0", B.uuid, 4)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {uuid}\n"
            f"Bus Location: \t {bus}\nDevice Minor: \t {minor}\n"
        )
    minors = driver_minors(str(tmp_path))
    assert minors == {A.uuid: 5, B.uuid: 4}
    plain = [Gpu(0, A.uuid), Gpu(1, B.uuid), Gpu(2, "GPU-cccc")]
    assert [g.minor for g in with_minors(plain, minors)] == [5, 4, None]
    assert driver_minors(str(tmp_path / "absent")) == {}
