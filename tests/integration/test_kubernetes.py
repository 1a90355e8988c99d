"""The kubernetes backend with the real ``kubernetes`` client against kmock's KubernetesEmulator on
127.0.0.1: the ComputeBackend contract.

The emulator stores objects like an API server but runs no controllers: Jobs never get pods
or status by themselves. Tests write what the Job controller and the kubelet would (a Job's
status, a pod with its phase) through the same API, then check what the backend makes of it.
The emulator also ignores label selectors, so listing another pool's Job checks that the
backend never adopts it.
"""

import asyncio
import threading
import uuid

import kmock
import pytest
import yaml
from kubernetes import client

from runplane.compute.kubernetes.compute import KubernetesCompute, job_manifest
from runplane.compute.kubernetes.options import options as parse_options
from runplane.domain.errors import BackendError, InvalidRequest
from runplane.domain.pools import Pool

NOW = 1_700_000_000.0
NS = "runplane"


class Emulator:
    """A KubernetesEmulator served on 127.0.0.1 from its own event loop in a thread."""

    def __init__(self):
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    async def _serve(self):
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator, host="127.0.0.1") as server:
            self.handler, self.url = emulator, str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(10), "the emulator did not start"
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def emulator():
    with Emulator() as emu:
        yield emu


@pytest.fixture
def api(emulator):
    configuration = client.Configuration()
    configuration.host = emulator.url
    with client.ApiClient(configuration) as api_client:
        yield api_client


@pytest.fixture
def compute(api):
    return KubernetesCompute(api, clock=lambda: NOW, request_timeout=5)


def make_pool(name="gpu", **options):
    return Pool(
        name=name,
        backend="kubernetes",
        cpus=4,
        gpus=1,
        memory="16g",
        default_image="x",
        options={"image": "reg.example/agent:1", "namespace": NS, **options},
    )


def set_status(api, job_id, status):
    """What the Job controller would write."""
    client.BatchV1Api(api).patch_namespaced_job_status(job_id, NS, {"status": status})


def add_pod(api, job, phase):
    """What the Job controller and the kubelet would do: a pod with the Job's labels, in ``phase``."""
    labels = {"app.kubernetes.io/managed-by": "runplane", "runplane.io/pool": job.pool}
    labels |= {"runplane.io/worker": job.worker_id, "job-name": job.id}
    core = client.CoreV1Api(api)
    name = f"{job.id}-{uuid.uuid4().hex[:5]}"
    body = {"metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": {"containers": []}}
    core.create_namespaced_pod(NS, body)
    core.patch_namespaced_pod_status(name, NS, {"status": {"phase": phase}})


def test_contract_launch_list_describe_cancel(compute, api):
    pool = make_pool()
    assert compute.list(pool) == []  # nothing of the kind stored yet: the emulator answers 404
    jobs = compute.launch(pool, 2, ["--pool", pool.name])
    assert len(jobs) == 2 and len({j.worker_id for j in jobs}) == 2 and len({j.id for j in jobs}) == 2
    for job in jobs:
        assert (job.pool, job.state, job.created_at, job.id) == (pool.name, "pending", NOW, f"rp-{job.worker_id}")
        assert job.detail == {"namespace": NS}
    # what reached the server is exactly the manifest
    stored = client.BatchV1Api(api).read_namespaced_job(jobs[0].id, NS)
    expected = job_manifest(pool, jobs[0].worker_id, ["--pool", pool.name], parse_options(pool))
    assert api.sanitize_for_serialization(stored) == expected
    # another pool's Job in the same namespace is never taken for one of ours
    other = compute.launch(make_pool("cpu"), 1, ["--pool", "cpu"])
    listed = compute.list(pool)
    assert sorted((j.id, j.worker_id, j.state) for j in listed) == sorted((j.id, j.worker_id, "pending") for j in jobs)
    assert compute.describe(pool, other[0].id) is None
    assert all(j.created_at == NOW for j in listed)  # the emulator sets no creationTimestamp
    client.BatchV1Api(api).patch_namespaced_job(
        jobs[0].id, NS, {"metadata": {"creationTimestamp": "2024-05-01T10:00:00Z"}}
    )
    assert compute.describe(pool, jobs[0].id).created_at == 1714557600.0
    assert [j.id for j in compute.list(make_pool("cpu"))] == [other[0].id]

    # pending until a pod runs; counts pending and running pods
    first, second = jobs
    set_status(api, first.id, {"active": 1, "ready": 0, "startTime": "2024-05-01T10:00:00Z"})
    add_pod(api, first, "Pending")
    found = compute.describe(pool, first.id)
    assert (found.state, found.detail["pods"]) == ("pending", {"pending": 1, "running": 0})
    add_pod(api, second, "Running")
    assert {j.id: j.state for j in compute.list(pool)} == {first.id: "pending", second.id: "running"}

    # a failed Job leaves the list; describe still finds it, with the controller's reason
    set_status(api, first.id, {"active": 0, "failed": 1, "conditions": [failed("DeadlineExceeded")]})
    assert [j.id for j in compute.list(pool)] == [second.id]
    ended = compute.describe(pool, first.id)
    assert (ended.state, ended.detail["reason"], ended.worker_id) == ("failed", "DeadlineExceeded", first.worker_id)

    compute.cancel(pool, second.id)
    assert compute.describe(pool, second.id) is None
    assert [j.id for j in compute.list(pool)] == []
    compute.cancel(pool, second.id)  # idempotent and quiet
    compute.cancel(pool, "rp-never-existed")
    assert compute.describe(pool, "rp-never-existed") is None


def failed(reason):
    return {"type": "Failed", "status": "True", "reason": reason, "message": f"Job failed: {reason}"}


def test_cancel_deletes_in_the_background(compute, emulator):
    pool = make_pool()
    (job,) = compute.launch(pool, 1, [])
    compute.cancel(pool, job.id)
    deletes = [r for r in emulator.handler if r.action == kmock.action.DELETE]
    assert [(r.name, r.namespace, r.params.get("propagationPolicy")) for r in deletes] == [(job.id, NS, "Background")]


def test_refused_launch_is_a_backend_error_with_the_jobs_already_started(compute, emulator):
    pool = make_pool()
    message = 'jobs.batch "x" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1'
    refuse = kmock.KubernetesError(403, "Forbidden", message)
    emulator.handler[kmock.resource("batch/v1/jobs"), kmock.action.CREATE][1:] << refuse
    with pytest.raises(BackendError, match="Kubernetes refused the worker job: 403") as err:
        compute.launch(pool, 3, [])
    assert err.value.message == f"Kubernetes refused the worker job: 403 {message}"
    assert err.value.details["status"] == 403
    assert [j.state for j in err.value.details["jobs"]] == ["pending"]


def test_refused_list_and_describe_are_backend_errors(compute, emulator):
    pool = make_pool()
    refuse = kmock.KubernetesError(403, "Forbidden", 'jobs.batch is forbidden: User "x" cannot list resource')
    emulator.handler[kmock.resource("batch/v1/jobs"), kmock.action.LIST] << refuse
    emulator.handler[kmock.resource("batch/v1/jobs"), kmock.action.FETCH] << refuse
    with pytest.raises(BackendError, match=r'^Kubernetes list jobs failed: 403 jobs\.batch is forbidden: User "x"'):
        compute.list(pool)
    with pytest.raises(BackendError, match=r"^Kubernetes read job failed: 403 "):
        compute.describe(pool, "rp-gpu-1")


def test_unreachable_api_server_is_a_backend_error():
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    configuration.retries = 0
    with client.ApiClient(configuration) as api_client:
        compute = KubernetesCompute(api_client, request_timeout=2)
        with pytest.raises(BackendError, match=r"^Kubernetes API unreachable \(create job\)") as err:
            compute.launch(make_pool(), 1, [])
        assert err.value.details["jobs"] == []
        with pytest.raises(BackendError, match=r"^Kubernetes API unreachable \(list jobs\)"):
            compute.list(make_pool())


def test_invalid_options_fail_before_any_request(compute, emulator):
    with pytest.raises(InvalidRequest, match="unknown option 'namespce'"):
        compute.launch(make_pool(namespce="x"), 1, [])
    assert list(emulator.handler) == []


def test_pools_pick_their_cluster_from_a_kubeconfig(emulator, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": emulator.url}}],
                "users": [{"name": "dispatcher", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "dispatcher"}}],
                "current-context": "emu",
            }
        )
    )
    compute = KubernetesCompute(clock=lambda: NOW)
    try:
        pool = make_pool(kubeconfig=str(kubeconfig), context="emu")
        (job,) = compute.launch(pool, 1, [])
        assert [j.id for j in compute.list(pool)] == [job.id]
        assert {r.headers.get("Authorization") for r in emulator.handler} == {"Bearer t0ken"}
        with pytest.raises(InvalidRequest, match=r"pool gpu: cannot load a Kubernetes config: .*nowhere"):
            compute.list(make_pool(kubeconfig=str(kubeconfig), context="nowhere"))
    finally:
        compute.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "pool gpu: cannot load a Kubernetes config: kubeconfig {path} does not exist"),
        ("just text", "pool gpu: cannot load a Kubernetes config: kubeconfig {path} is not a kubeconfig file"),
        ("{unclosed", "pool gpu: cannot load a Kubernetes config: while parsing a flow mapping"),
    ],
)
def test_unusable_kubeconfig_is_an_invalid_request(tmp_path, content, message):
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidRequest, match="pool gpu: cannot load a Kubernetes config: ") as err:
        KubernetesCompute().list(make_pool(kubeconfig=str(path)))
    assert err.value.message.startswith(message.format(path=path))
