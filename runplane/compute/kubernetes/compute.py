"""Workers as Kubernetes Jobs: one ``batch/v1`` Job (one pod, never restarted) per worker agent.

The agent container starts runs through the node's Docker engine (the socket is mounted from
the node), so the nodes of a pool need Docker, and the Job's resource requests reserve the
pool's shape on the node for the runs the agent starts beside it. See ``options.py`` for the
pool options and docs/pools.md for a worked example.

Jobs carry the labels ``app.kubernetes.io/managed-by=runplane``, ``runplane.io/pool`` and
``runplane.io/worker`` (also on their pods); the backend only ever looks at Jobs with its pool's
labels. A job's id is the Job's name in the pool's namespace.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from runplane.backend import BackendJob, ComputeBackend
from runplane.compute.kubernetes.options import KubernetesOptions
from runplane.compute.kubernetes.options import options as pool_options
from runplane.compute.options import new_worker_id, stop_budget_args
from runplane.domain.errors import BackendError, InvalidRequest
from runplane.domain.pools import Pool
from runplane.settings import StackSettings

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_POOL = "runplane.io/pool"
LABEL_WORKER = "runplane.io/worker"
MANAGER = "runplane"
GPU_RESOURCE = "nvidia.com/gpu"
DOCKER_SOCKET_MOUNT = "/var/run/docker.sock"
PAGE_SIZE = 500
REQUEST_TIMEOUT = 30.0

Manifest = dict[str, Any]


def job_name(worker_id: str) -> str:
    """The Job's name: short enough (<= 63) for the ``job-name`` label Kubernetes puts on its pods."""
    return f"rp-{worker_id}"


def _cpu_quantity(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{round(cpus * 1000)}m"


def job_manifest(pool: Pool, worker_id: str, agent_args: Sequence[str], options: KubernetesOptions) -> Manifest:
    """The Job that runs one worker agent of ``pool``. Pure: same inputs, same manifest."""
    labels = {LABEL_MANAGED_BY: MANAGER, LABEL_POOL: pool.name, LABEL_WORKER: worker_id}
    quantities = {"cpu": _cpu_quantity(pool.cpus), "memory": str(pool.memory)}
    if pool.gpus:
        quantities[GPU_RESOURCE] = str(pool.gpus)
    work_dir = options.work_dir.path
    container: Manifest = {
        "name": "agent",
        "image": options.image,
        "command": ["runplane-agent"],
        # The pod sees the whole node's memory: advertise only what the Job reserved.
        "args": [
            *stop_budget_args(options.termination_grace_seconds),  # what a stop may take, within the pod's grace
            *agent_args,
            *("--work-dir", work_dir, "--memory", str(pool.memory)),
            *("--id", worker_id, "--pass-down-termination"),
        ],
        "resources": {"requests": dict(quantities), "limits": dict(quantities)},
        "volumeMounts": [
            {"name": "docker-socket", "mountPath": DOCKER_SOCKET_MOUNT},
            {"name": "work-dir", "mountPath": work_dir},
        ],
    }
    if options.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(options.env.items())]
    # Later sources win over earlier ones: a Secret overrides a ConfigMap.
    env_from = [{"configMapRef": {"name": n}} for n in options.env_from_config_maps]
    env_from += [{"secretRef": {"name": n}} for n in options.env_from_secrets]
    if env_from:
        container["envFrom"] = env_from
    pod: Manifest = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": options.termination_grace_seconds,
        # The agent talks to the runplane stack and Docker, never to the Kubernetes API.
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [
            {"name": "docker-socket", "hostPath": {"path": options.docker_socket, "type": "Socket"}},
            options.work_dir.volume("work-dir"),
        ],
    }
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    if options.node_selector:
        pod["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        pod["tolerations"] = [t.manifest() for t in options.tolerations]
    if options.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in options.image_pull_secrets]
    if options.priority_class:
        pod["priorityClassName"] = options.priority_class
    spec: Manifest = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,  # the control plane re-queues runs itself; a failed agent is not retried
        "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
    }
    if options.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = options.active_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(worker_id), "namespace": options.namespace, "labels": labels},
        "spec": spec,
    }


def _waiting_reason(pod: Manifest) -> str | None:
    """Why a pending pod is not running yet (e.g. Unschedulable, ImagePullBackOff), if it says."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            return str(reason)
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or "Unschedulable")
    return None


def job_state(job: Manifest, pods: Iterable[Manifest]) -> tuple[str, dict[str, Any]]:
    """``(state, detail)`` of a worker Job from its status and its pods' phases.

    Ended: a true ``Failed``/``FailureTarget`` condition is ``failed`` and a true
    ``Complete``/``SuccessCriteriaMet`` one ``finished``, with the condition's reason (e.g.
    BackoffLimitExceeded, DeadlineExceeded); a Job being deleted is ``finished`` too. Otherwise
    ``running`` once a pod runs (or the Job counts a ready pod), else ``pending``.
    """
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind in ("Failed", "FailureTarget", "Complete", "SuccessCriteriaMet"):
            state = "failed" if kind in ("Failed", "FailureTarget") else "finished"
            return state, {"reason": str(condition.get("reason") or kind), "message": condition.get("message") or ""}
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return "finished", {"reason": "Deleted"}
    pods = list(pods)
    phases = Counter(str((p.get("status") or {}).get("phase") or "Pending") for p in pods)
    detail: dict[str, Any] = {"pods": {"pending": phases["Pending"], "running": phases["Running"]}}
    if status.get("startTime"):
        detail["start_time"] = status["startTime"]
    if phases["Running"] or (status.get("ready") or 0) > 0:
        return "running", detail
    reason = next((r for r in map(_waiting_reason, pods) if r), None)
    if reason:
        detail["waiting"] = reason
    return "pending", detail


def _timestamp(value: Any) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _api_message(e: ApiException) -> str:
    """The API server's own message (its Status object), else the HTTP reason."""
    try:
        status = json.loads(e.body or "")
    except ValueError:
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return f"{e.status} {message or e.reason}"


def load_api_client(kubeconfig: str | None, context: str | None) -> Any:
    """An ApiClient from a kubeconfig file (and context), or else the in-cluster service account,
    or else the default kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``). Raises InvalidRequest."""
    try:
        if kubeconfig is not None:
            path = Path(kubeconfig).expanduser()
            if not path.is_file():
                raise InvalidRequest(f"kubeconfig {kubeconfig} does not exist")
            if not isinstance(yaml.safe_load(path.read_text()), dict):
                raise InvalidRequest(f"kubeconfig {kubeconfig} is not a kubeconfig file")
            return config.new_client_from_config(config_file=str(path), context=context)  # type: ignore[no-untyped-call]
        if context is None:
            configuration = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                return client.ApiClient(configuration)
            except ConfigException:
                pass  # not in a pod: fall back to the default kubeconfig
        default = config.KUBE_CONFIG_DEFAULT_LOCATION
        if not Path(default).expanduser().is_file():
            where = "no in-cluster service account and " if context is None else ""
            raise InvalidRequest(f"{where}no kubeconfig at {default}: set the pool option kubeconfig")
        return config.new_client_from_config(context=context)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        raise InvalidRequest(str(e) or type(e).__name__) from e


class KubernetesCompute(ComputeBackend):
    """The ``kubernetes`` backend. Thread-safe: API clients are made once per (kubeconfig, context)."""

    def __init__(
        self,
        api_client: Any | None = None,
        clock: Callable[[], float] = time.time,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient`` used for every pool; without one, each
        pool's ``kubeconfig``/``context`` options (or the in-cluster config) pick the cluster."""
        self._injected = api_client
        self.clock = clock
        self.request_timeout = request_timeout
        self._clients: dict[tuple[str | None, str | None], Any] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the API clients this backend made (not an injected one)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for api in clients:
            api.close()

    def _api(self, pool: Pool, options: KubernetesOptions) -> Any:
        if self._injected is not None:
            return self._injected
        key = (options.kubeconfig, options.context)
        with self._lock:
            if key not in self._clients:
                try:
                    self._clients[key] = load_api_client(*key)
                except InvalidRequest as e:
                    raise InvalidRequest(f"pool {pool.name}: cannot load a Kubernetes config: {e.message}") from e
            return self._clients[key]

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call, its JSON body decoded. ApiException passes through (callers look at its
        status); a transport failure becomes BackendError."""
        try:
            response = fn(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs)
        except HTTPError as e:
            raise BackendError(f"Kubernetes API unreachable ({what}): {e}") from e
        try:
            return json.loads(response.data or b"null")
        finally:
            response.release_conn()

    def _list(self, what: str, fn: Callable[..., Any], namespace: str, selector: str) -> list[Manifest]:
        """Every object matching ``selector``, page by page. A 404 is an empty list: the API server
        answers a list with 404 only when it does not serve the kind at all."""
        items: list[Manifest] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"label_selector": selector, "limit": PAGE_SIZE}
            if token:
                kwargs["_continue"] = token
            try:
                page = self._call(what, fn, namespace, **kwargs)
            except ApiException as e:
                if e.status == 404:
                    return items
                raise BackendError(f"Kubernetes {what} failed: {_api_message(e)}", status=e.status) from e
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def launch(self, pool: Pool, count: int, agent_args: Sequence[str]) -> list[BackendJob]:
        options = pool_options(pool)
        batch = client.BatchV1Api(self._api(pool, options))
        jobs: list[BackendJob] = []
        for _ in range(count):
            worker_id = new_worker_id(pool.name)
            manifest = job_manifest(pool, worker_id, agent_args, options)
            try:
                created = self._call("create job", batch.create_namespaced_job, options.namespace, manifest)
            except ApiException as e:
                raise BackendError(
                    f"Kubernetes refused the worker job: {_api_message(e)}", jobs=jobs, status=e.status
                ) from e
            except BackendError as e:
                raise BackendError(e.message, jobs=jobs) from e
            meta = created.get("metadata") or {}
            jobs.append(
                BackendJob(
                    str(meta.get("name") or job_name(worker_id)),
                    pool.name,
                    "pending",
                    worker_id,
                    _timestamp(meta.get("creationTimestamp")) or self.clock(),
                    {"namespace": options.namespace},
                )
            )
        return jobs

    def _pods(self, api: Any, namespace: str, selector: str) -> dict[str, list[Manifest]]:
        """Pods matching ``selector``, by the worker they belong to."""
        by_worker: dict[str, list[Manifest]] = {}
        for pod in self._list("list pods", client.CoreV1Api(api).list_namespaced_pod, namespace, selector):
            worker_id = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_WORKER)
            if worker_id:
                by_worker.setdefault(str(worker_id), []).append(pod)
        return by_worker

    def _backend_job(
        self, pool: Pool, namespace: str, job: Manifest, pods: dict[str, list[Manifest]]
    ) -> BackendJob | None:
        """The BackendJob of a Job of ``pool``; None for any other Job. The server applies label
        selectors already; checking again keeps a pool off Jobs that are not its own."""
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        worker_id = labels.get(LABEL_WORKER)
        if labels.get(LABEL_MANAGED_BY) != MANAGER or labels.get(LABEL_POOL) != pool.name or not worker_id:
            return None
        state, detail = job_state(job, pods.get(str(worker_id), []))
        # The API server always sets creationTimestamp; without one, "now" never makes a Job look
        # older than it is (which could get it cancelled as a worker that never registered).
        created = _timestamp(meta.get("creationTimestamp")) or self.clock()
        return BackendJob(
            str(meta["name"]), pool.name, state, str(worker_id), created, {"namespace": namespace, **detail}
        )

    def list(self, pool: Pool) -> list[BackendJob]:
        options = pool_options(pool)
        api = self._api(pool, options)
        ns = options.namespace
        selector = f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_POOL}={pool.name}"
        found = self._list("list jobs", client.BatchV1Api(api).list_namespaced_job, ns, selector)
        pods = self._pods(api, ns, selector)
        jobs = (self._backend_job(pool, ns, job, pods) for job in found)
        return [job for job in jobs if job is not None and job.alive]

    def describe(self, pool: Pool, job_id: str) -> BackendJob | None:
        """The pool's Job named ``job_id`` in any state, ended ones with the reason of their
        Failed/Complete condition in ``detail['reason']``; None when no such Job of this pool exists."""
        options = pool_options(pool)
        api = self._api(pool, options)
        ns = options.namespace
        try:
            job = self._call("read job", client.BatchV1Api(api).read_namespaced_job, job_id, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise BackendError(f"Kubernetes read job failed: {_api_message(e)}", status=e.status) from e
        worker_id = ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_WORKER)
        if not worker_id:
            return None
        pods = self._pods(api, ns, f"{LABEL_POOL}={pool.name},{LABEL_WORKER}={worker_id}")
        return self._backend_job(pool, ns, job, pods)

    def cancel(self, pool: Pool, job_id: str) -> None:
        """Delete the Job; its pod gets SIGTERM (the agent hands its runs back) and is removed in
        the background. Quiet when the Job is already gone."""
        options = pool_options(pool)
        batch = client.BatchV1Api(self._api(pool, options))
        try:
            self._call(
                "delete job", batch.delete_namespaced_job, job_id, options.namespace, propagation_policy="Background"
            )
        except ApiException as e:
            if e.status != 404:
                raise BackendError(f"Kubernetes delete job failed: {_api_message(e)}", status=e.status) from e


def build(settings: StackSettings) -> KubernetesCompute:
    """The backend of ``kubernetes`` pools. Each pool picks its cluster (options kubeconfig and
    context, else the in-cluster config); a config that cannot be loaded fails that pool's calls
    with InvalidRequest."""
    return KubernetesCompute()
