"""CPU/GPU assignment and the exact container request, with a fake GPU inventory."""

import threading
from pathlib import Path

import docker.errors
import pytest
from docker.types import DeviceRequest, LogConfig, Mount

from runplane.domain.runs import Run, RunSpec
from worker_agent.container_spec import container_name, container_spec
from worker_agent.containers import create_failure
from worker_agent.resources import Allocation, Allocator, Gpu, _smi_gpus, parse_nvidia_smi, parse_set, select_gpus
from worker_agent.run_config import ExecutorConfig

SMI = """0, GPU-aaaaaaaa-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 81559
1, GPU-bbbbbbbb-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 81559
"""
GPUS = parse_nvidia_smi(SMI)


def test_parse_nvidia_smi():
    assert [
        Gpu(0, "GPU-aaaaaaaa-1111-2222-3333-444444444444", "NVIDIA H100 80GB HBM3", 81559 * 2**20),
        Gpu(1, "GPU-bbbbbbbb-1111-2222-3333-444444444444", "NVIDIA H100 80GB HBM3", 81559 * 2**20),
    ] == GPUS
    assert parse_nvidia_smi("") == []
    assert parse_nvidia_smi("No devices were found\n") == []


def test_smi_probe_failure_means_no_answer():
    def broken(cmd):
        raise OSError("nvidia-smi: not found")

    assert _smi_gpus(broken) is None
    assert _smi_gpus(lambda cmd: SMI) == GPUS


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-3,8", ["0", "1", "2", "3", "8"]), ("1", ["1"]), ("GPU-abc,2", ["GPU-abc", "2"]), (" 0 , 1 ", ["0", "1"])],
)
def test_parse_set(text, expected):
    assert parse_set(text, "--cpuset") == expected


@pytest.mark.parametrize(("text", "message"), [("3-1", "backwards"), ("a", "not an index"), ("1,1", "twice")])
def test_parse_set_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_set(text, "--gpuset")


def test_select_gpus_by_index_or_uuid():
    assert select_gpus(GPUS, None) == GPUS
    assert select_gpus(GPUS, ["1"]) == [GPUS[1]]
    assert select_gpus(GPUS, [GPUS[0].uuid]) == [GPUS[0]]
    with pytest.raises(ValueError, match="GPU 5 is not on this host"):
        select_gpus(GPUS, ["5"])


def test_allocator_never_shares_and_waits_when_full():
    alloc = Allocator(cpus=[0, 1, 2, 3], gpus=list(GPUS))
    a = alloc.allocate("r1", cpus=2, gpus=1)
    b = alloc.allocate("r2", cpus=1.5, gpus=1)
    assert a is not None and b is not None
    assert set(a.cpus).isdisjoint(b.cpus)
    assert set(a.gpus).isdisjoint(b.gpus)
    assert len(b.cpus) == 2  # 1.5 cpus take two whole cores
    assert alloc.allocate("r3", cpus=1, gpus=0) is None  # no core left
    assert alloc.free() == (0, 0)
    alloc.release("r1")
    c = alloc.allocate("r3", cpus=1, gpus=1)
    assert c is not None and c.gpus == (a.gpus[0],)
    assert alloc.fits_at_all(8, 0) == "asks 8 cpus; this worker has 4"
    assert alloc.fits_at_all(1, 3) == "asks 3 gpus; this worker has 2"
    assert alloc.fits_at_all(4, 2) is None


def test_allocator_sets_memory_and_disk_aside_per_run():
    """Memory and disk are handed out like cores: a run that asks all of the worker's memory (or
    disk) keeps the next one waiting, however many cores are free, until it gives them back."""
    g = 2**30
    alloc = Allocator(cpus=[0, 1, 2, 3], memory=8 * g, disk=100 * g)
    whole = alloc.allocate("r1", cpus=1, gpus=0, memory=8 * g, disk=10 * g)
    assert whole is not None and (whole.memory, whole.disk) == (8 * g, 10 * g)
    assert alloc.allocate("r2", cpus=1, gpus=0, memory=1, disk=g) is None  # no memory left: waits
    assert alloc.free() == (3, 0) and alloc.free_bytes() == (0, 90 * g)
    alloc.release("r1")  # given back whole
    assert alloc.free_bytes() == (8 * g, 100 * g)
    disks = [alloc.allocate(f"d{i}", cpus=1, gpus=0, memory=g, disk=40 * g) for i in range(3)]
    assert disks[0] is not None and disks[1] is not None and disks[2] is None  # 40g + 40g, 20g left
    assert "d2" not in alloc._used  # a refusal holds nothing
    assert alloc.allocate("d2", cpus=1, gpus=0, memory=g, disk=20 * g) is not None  # exactly what is left
    assert alloc.free_bytes() == (5 * g, 0)
    assert alloc.fits_at_all(1, 0, 9 * g, g) == "asks 9g memory; this worker has 8g"
    assert alloc.fits_at_all(1, 0, g, 101 * g) == "asks 101g disk; this worker has 100g"
    assert alloc.fits_at_all(1, 0, 8 * g, 100 * g) is None


def test_allocator_leaves_uncounted_what_it_was_not_given():
    """A worker given no memory or disk (0) sets none aside; a run record without memory or disk
    (written before they were filled in) sets none aside either, and still takes its cores."""
    uncounted = Allocator(cpus=[0, 1])
    assert uncounted.fits_at_all(1, 0, 2**60, 2**60) is None
    first = uncounted.allocate("r1", cpus=1, gpus=0, memory=2**60, disk=2**60)
    assert first is not None and (first.memory, first.disk) == (0, 0)
    assert uncounted.allocate("r2", cpus=1, gpus=0, memory=2**60, disk=2**60) is not None
    counted = Allocator(cpus=[0, 1], memory=2**30, disk=2**30)
    old = counted.allocate("old", cpus=1, gpus=0, memory=None, disk=None)
    assert old is not None and (old.memory, old.disk) == (0, 0)
    assert counted.allocate("new", cpus=1, gpus=0, memory=2**30, disk=2**30) is not None


def test_allocator_waits_only_for_the_room_runs_that_are_over_still_hold():
    """A run that fits once the runs over here give back the disk their files hold waits until
    they do; one that would not fit even then, or a worker stopping, does not wait."""
    g = 2**30
    alloc = Allocator(cpus=[0, 1], disk=2 * g)
    never = threading.Event()
    assert alloc.allocate("r1", cpus=1, gpus=0, disk=2 * g) is not None
    alloc.release("r1", keep_disk_as="r1 leaving")  # its cores back, its disk while its files go
    assert alloc.allocate("busy", cpus=2, gpus=0) is not None  # both cores: busy, not leaving
    alloc.wait_for_leaving(1, 0, None, g, timeout=60, stop=never)  # no use waiting (else 60 s)
    assert alloc.free_bytes() == (0, 0)
    alloc.release("busy")
    stop = threading.Event()
    stop.set()
    alloc.wait_for_leaving(1, 0, None, g, timeout=60, stop=stop)  # stopping: no wait
    assert alloc.free_bytes() == (0, 0)
    threading.Timer(0.2, alloc.release, ("r1 leaving",)).start()
    alloc.wait_for_leaving(1, 0, None, g, timeout=60, stop=never)
    assert alloc.free_bytes() == (0, 2 * g)  # back, and nothing reserved by the wait
    assert alloc.allocate("r2", cpus=1, gpus=0, disk=g) is not None


def run(**resources):
    return Run(
        id="r-1",
        owner="a",
        queue="q",
        attempt=2,
        created_at=0,
        spec=RunSpec(
            command="nvidia-smi", image="cuda:12", env={"SEED": "3"}, resources={"cpus": 2, "memory": "1g", **resources}
        ),
    )


def test_container_request_with_gpus_is_exact(tmp_path):
    config = ExecutorConfig(worker_id="w-1", work_dir=tmp_path, shm_size="2g", stack_id="stack-a")
    allocation = Allocation(cpus=(2, 3), gpus=(GPUS[1],))
    spec = container_spec(run(gpus=1), "cuda:12", config, Path("/work/out"), allocation)
    assert spec == {
        "image": "cuda:12",
        "entrypoint": ["/bin/sh", "-c"],
        "command": ["nvidia-smi"],
        "name": container_name("stack-a", "r-1", 2),
        "working_dir": "/runplane/output",
        "environment": {
            "SEED": "3",
            "RUNPLANE_RUN_ID": "r-1",
            "RUNPLANE_ATTEMPT": "2",
            "RUNPLANE_OUTPUT": "/runplane/output",
            "NVIDIA_VISIBLE_DEVICES": GPUS[1].uuid,
        },
        "mounts": [Mount("/runplane/output", "/work/out", type="bind")],
        "network_mode": "none",
        "mem_limit": 2**30,
        "memswap_limit": 2**30,
        "pids_limit": 4096,
        "user": "65534:65534",
        "cap_drop": ["ALL"],
        "cap_add": [],
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "labels": {
            "io.runplane.run_id": "r-1",
            "io.runplane.attempt": "2",
            "io.runplane.worker_id": "w-1",
            "io.runplane.stack": "stack-a",
        },
        "log_config": LogConfig(type="json-file", config={"max-size": "10m", "max-file": "2"}),
        "detach": True,
        "nano_cpus": 2_000_000_000,
        "cpuset_cpus": "2,3",
        "device_requests": [DeviceRequest(driver="nvidia", device_ids=[GPUS[1].uuid], capabilities=[["gpu"]])],
        "shm_size": "2g",
    }


def test_run_without_gpus_sees_none(tmp_path):
    config = ExecutorConfig(worker_id="w-1", work_dir=tmp_path)
    spec = container_spec(run(), "img", config, Path("/o"), Allocation(cpus=(0,), gpus=()))
    assert "device_requests" not in spec
    assert spec["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # even where nvidia is the default runtime
    assert spec["cpuset_cpus"] == "0"


def test_every_run_starts_without_a_network(tmp_path):
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)
    with_net = run()
    with_net.spec.network = True
    # a networked run too starts without one: RunNetwork connects it once its rules are in
    assert container_spec(with_net, "i", config, Path("/o"), None)["network_mode"] == "none"
    assert container_spec(run(), "i", config, Path("/o"), None)["network_mode"] == "none"


def test_missing_nvidia_runtime_is_a_clear_reason():
    error = docker.errors.APIError(
        "500", explanation='could not select device driver "nvidia" with capabilities: [[gpu]]'
    )
    outcome = create_failure(error, Allocation(cpus=(0,), gpus=(GPUS[0],)))
    assert outcome.reason == "gpu_unavailable"
    assert GPUS[0].uuid in outcome.message
    assert "no working NVIDIA runtime" in outcome.message
    other = create_failure(docker.errors.APIError("500", explanation="no space left"), None)
    assert other.reason == "container_error"
