"""The kubernetes backend's Job manifest, option checks and status mapping (pure functions)."""

from pathlib import Path

import pytest

from runplane.compute.kubernetes.compute import KubernetesCompute, job_manifest, job_state
from runplane.compute.kubernetes.options import options as parse_options
from runplane.compute.registry import build_backend
from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Pool, load_pools
from runplane.settings import StackSettings

ARGS = ["--pool", "gpu", "--slots", "2", "--idle-seconds", "120"]
LABELS = {"app.kubernetes.io/managed-by": "runplane", "runplane.io/pool": "gpu", "runplane.io/worker": "gpu-0a1b2c3d"}


def pool(options=None, **shape):
    fields = {"name": "gpu", "backend": "kubernetes", "cpus": 8, "gpus": 2, "memory": "32g", "default_image": "x"}
    return Pool(**{**fields, **shape, "options": {"image": "reg.example/runplane-agent:1", **(options or {})}})


def manifest(p):
    return job_manifest(p, "gpu-0a1b2c3d", ARGS, parse_options(p))


def test_full_manifest_of_a_gpu_pool_on_nfs():
    p = pool(
        {
            "namespace": "runplane",
            "service_account": "runplane-worker",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "image_pull_secrets": ["registry"],
            "env": {"RUNPLANE_PREFIX": "prod", "RUNPLANE_AWS_REGION": "eu-west-1"},
            "env_from_secrets": ["runplane-credentials"],
            "env_from_config_maps": ["runplane-stack"],
            "priority_class": "runplane-workers",
            "work_dir": {"nfs": {"server": "nfs.example", "path": "/exports/runplane"}, "mount_path": "/mnt/runplane"},
            "ttl_seconds_after_finished": 300,
            "active_deadline_seconds": 86400,
            "termination_grace_seconds": 90,
        }
    )
    quantities = {"cpu": "8", "memory": str(32 * 1024**3), "nvidia.com/gpu": "2"}
    assert manifest(p) == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rp-gpu-0a1b2c3d", "namespace": "runplane", "labels": LABELS},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 300,
            "activeDeadlineSeconds": 86400,
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 90,
                    "automountServiceAccountToken": False,
                    "serviceAccountName": "runplane-worker",
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "imagePullSecrets": [{"name": "registry"}],
                    "priorityClassName": "runplane-workers",
                    "containers": [
                        {
                            "name": "agent",
                            "image": "reg.example/runplane-agent:1",
                            "command": ["runplane-agent"],
                            "args": [
                                *("--stop-budget-seconds", "70", *ARGS),  # the pod's 90 s grace less 20
                                *("--work-dir", "/mnt/runplane", "--memory", str(32 * 1024**3)),
                                *("--id", "gpu-0a1b2c3d", "--pass-down-termination"),
                            ],
                            "resources": {"requests": quantities, "limits": quantities},
                            "volumeMounts": [
                                {"name": "docker-socket", "mountPath": "/var/run/docker.sock"},
                                {"name": "work-dir", "mountPath": "/mnt/runplane"},
                            ],
                            "env": [
                                {"name": "RUNPLANE_AWS_REGION", "value": "eu-west-1"},
                                {"name": "RUNPLANE_PREFIX", "value": "prod"},
                            ],
                            "envFrom": [
                                {"configMapRef": {"name": "runplane-stack"}},
                                {"secretRef": {"name": "runplane-credentials"}},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "docker-socket", "hostPath": {"path": "/var/run/docker.sock", "type": "Socket"}},
                        {"name": "work-dir", "nfs": {"server": "nfs.example", "path": "/exports/runplane"}},
                    ],
                },
            },
        },
    }


def test_minimal_cpu_pool_defaults_to_a_node_work_dir_and_leaves_optional_fields_out():
    p = pool(gpus=0, cpus=0.5, memory="1g")
    job = manifest(p)
    assert job["metadata"]["namespace"] == "default"
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    assert "activeDeadlineSeconds" not in job["spec"]
    pod = job["spec"]["template"]["spec"]
    assert set(pod) == {
        "restartPolicy",
        "terminationGracePeriodSeconds",
        "automountServiceAccountToken",
        "containers",
        "volumes",
    }
    assert pod["terminationGracePeriodSeconds"] == 120
    assert pod["containers"][0]["args"][:2] == ["--stop-budget-seconds", "100"]  # the agent's own default fits
    (container,) = pod["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": str(1024**3)},
        "limits": {"cpu": "500m", "memory": str(1024**3)},
    }
    assert "env" not in container and "envFrom" not in container
    assert container["args"][len(ARGS) + 2 : len(ARGS) + 4] == ["--work-dir", "/var/lib/runplane"]
    assert pod["volumes"][1] == {
        "name": "work-dir",
        "hostPath": {"path": "/var/lib/runplane", "type": "DirectoryOrCreate"},
    }


def test_pvc_and_host_path_work_dirs():
    pvc = manifest(pool({"work_dir": {"pvc": "runplane-work"}}))["spec"]["template"]["spec"]
    assert pvc["volumes"][1] == {"name": "work-dir", "persistentVolumeClaim": {"claimName": "runplane-work"}}
    assert pvc["containers"][0]["volumeMounts"][1] == {"name": "work-dir", "mountPath": "/var/lib/runplane"}
    node = manifest(pool({"work_dir": {"host_path": "/scratch/runplane"}}))["spec"]["template"]["spec"]
    assert node["volumes"][1]["hostPath"]["path"] == "/scratch/runplane"
    assert node["containers"][0]["volumeMounts"][1]["mountPath"] == "/scratch/runplane"


def test_toleration_with_seconds_uses_kubernetes_spelling():
    tol = {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 30}
    pod = manifest(pool({"tolerations": [tol]}))["spec"]["template"]["spec"]
    assert pod["tolerations"] == [tol]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"image": ""}, "image: String should have at least 1 character"),
        ({"imag": "x"}, "unknown option 'imag'"),
        ({"namespace": "Prod_1"}, "namespace: String should match pattern"),
        ({"node_selector": ["gpu"]}, "node_selector: Input should be a valid dictionary"),
        ({"ttl_seconds_after_finished": "600"}, "ttl_seconds_after_finished: Input should be a valid integer"),
        ({"ttl_seconds_after_finished": -1}, "ttl_seconds_after_finished: Input should be greater than or equal"),
        ({"env": {"A": 1}}, "env.A: Input should be a valid string"),
        ({"env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "env: must not hold credentials (AWS_SECRET_ACCESS_KEY)"),
        ({"env": {"A=B": "x"}}, "env: 'A=B' is not a valid environment variable name"),
        ({"env_from_secrets": "creds"}, "env_from_secrets: Input should be a valid list"),
        ({"work_dir": {"nfs": {"server": "s", "path": "/e"}, "pvc": "w"}}, "work_dir needs exactly one of"),
        ({"work_dir": {}}, "work_dir needs exactly one of host_path, nfs or pvc (got none)"),
        ({"work_dir": {"nfs": {"server": "s", "path": "exports"}}}, "work_dir.nfs.path: 'exports' is not an absolute"),
        ({"work_dir": {"host_path": "/a", "mount_path": "/b"}}, "with host_path the mount path is the host path"),
        ({"work_dir": {"pvc": "w", "size": "1g"}}, "unknown option 'work_dir.size'"),
        ({"tolerations": [{"operator": "Exists", "value": "x"}]}, "operator Exists takes no value"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "tolerationSeconds only applies to effect NoExecute"),
        ({"tolerations": [{"key": "k", "effect": "Sometimes"}]}, "tolerations.0.effect: Input should be"),
    ],
)
def test_option_errors_name_the_option(options, message):
    p = Pool(
        name="gpu", backend="kubernetes", cpus=1, memory="1g", default_image="x", options={"image": "a", **options}
    )
    with pytest.raises(InvalidRequest, match=r"^pool gpu: bad kubernetes options: ") as err:
        parse_options(p)
    assert err.value.message.startswith("pool gpu: bad kubernetes options: ")
    assert message in err.value.message


def test_image_is_required_and_every_problem_is_reported_at_once():
    p = Pool(name="gpu", backend="kubernetes", cpus=1, memory="1g", default_image="x", options={"namespace": 3})
    with pytest.raises(InvalidRequest, match="bad kubernetes options: image: required; namespace: ") as err:
        parse_options(p)
    assert err.value.message == (
        "pool gpu: bad kubernetes options: image: required; namespace: Input should be a valid string"
    )


def test_pool_name_must_be_a_label_value():
    p = Pool(name="gpu-", backend="kubernetes", cpus=1, memory="1g", default_image="x", options={"image": "a"})
    with pytest.raises(InvalidRequest, match="must end with a letter or digit"):
        parse_options(p)


def job(status=None, **meta):
    return {"metadata": {"name": "rp-gpu-1", **meta}, "status": status or {}}


def pod(phase, **status):
    return {"metadata": {"labels": {"runplane.io/worker": "gpu-1"}}, "status": {"phase": phase, **status}}


def condition(kind, reason, status="True"):
    return {"type": kind, "status": status, "reason": reason, "message": f"{reason} happened"}


def test_job_state_pending_until_a_pod_runs():
    assert job_state(job(), []) == ("pending", {"pods": {"pending": 0, "running": 0}})
    started = {"active": 1, "ready": 0, "startTime": "2024-05-01T10:00:00Z"}
    waiting = pod("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff"}}}])
    assert job_state(job(started), [waiting]) == (
        "pending",
        {"pods": {"pending": 1, "running": 0}, "start_time": "2024-05-01T10:00:00Z", "waiting": "ImagePullBackOff"},
    )
    unscheduled = pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])
    assert job_state(job({"active": 1}), [unscheduled])[1]["waiting"] == "Unschedulable"


def test_job_state_running_from_pod_phase_or_ready_count():
    assert job_state(job({"active": 1}), [pod("Running")]) == ("running", {"pods": {"pending": 0, "running": 1}})
    assert job_state(job({"active": 1, "ready": 1}), [])[0] == "running"


def test_job_state_ended_from_conditions():
    failed = {"failed": 1, "conditions": [condition("Failed", "DeadlineExceeded")]}
    assert job_state(job(failed), [pod("Running")]) == (
        "failed",
        {"reason": "DeadlineExceeded", "message": "DeadlineExceeded happened"},
    )
    target = {"conditions": [condition("FailureTarget", "BackoffLimitExceeded")]}
    assert job_state(job(target), [])[1]["reason"] == "BackoffLimitExceeded"
    done = {"succeeded": 1, "conditions": [condition("Complete", "")]}
    assert job_state(job(done), []) == ("finished", {"reason": "Complete", "message": " happened"})
    not_yet = {"active": 1, "conditions": [condition("Failed", "BackoffLimitExceeded", status="False")]}
    assert job_state(job(not_yet), [pod("Running")])[0] == "running"
    assert job_state(job(deletionTimestamp="2024-05-01T10:00:00Z"), []) == ("finished", {"reason": "Deleted"})


def test_builder_is_registered_and_makes_the_backend():
    assert isinstance(build_backend("kubernetes", StackSettings()), KubernetesCompute)


def test_example_pools_in_infra_are_valid():
    pools = load_pools(str(Path(__file__).resolve().parents[2] / "infra" / "kubernetes" / "pools.yaml")).pools
    options = {p.name: parse_options(p) for p in pools}
    assert {name: o.work_dir.path for name, o in options.items()} == {
        "k8s-gpu": "/var/lib/runplane",
        "k8s-cpu": "/mnt/runplane",
    }
    documented = set(options["k8s-gpu"].model_fields_set) | set(options["k8s-cpu"].model_fields_set)
    assert documented == set(type(options["k8s-gpu"]).model_fields)  # the examples use every option
