"""Workers as Azure Batch tasks: one container task of the agent image per worker, all in one
Batch job (which names the Batch pool the tasks run on). See ``options.py`` for the pool
options and infra/azure/batch/README.md for the Batch pool, job and autoscale formula.

A worker's task id is its worker id (``<pool>-<8 hex>``) and its display name is
``runplane-<pool>--<task id>``: ``list`` and ``describe`` take a task as this pool's only when its
display name is exactly that, so pools sharing a job never see each other's workers.

The task's container runs ``runplane-agent`` (the entrypoint is set, so any image with the
agent on its PATH works) with the host's Docker socket and the work dir mounted at the same
path on both sides, because the agent starts runs as sibling containers on the node's engine.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from azure.core.pipeline.transport import HttpTransport

from runplane import extras
from runplane.backend import BackendJob, ComputeBackend
from runplane.compute.azure_batch.options import BATCH_ID, AzureBatchOptions
from runplane.compute.azure_batch.options import options as pool_options
from runplane.compute.azure_batch.rest import BatchClient, BatchServiceError
from runplane.compute.options import job_name, new_worker_id, stack_environment, stop_budget_args
from runplane.domain.errors import BackendError, InvalidRequest
from runplane.domain.pools import Pool
from runplane.settings import StackSettings

LIVE_STATES = {"active": "pending", "preparing": "pending", "running": "running"}
CONTAINER_SOCKET = "/var/run/docker.sock"
LIST_FILTER = "state ne 'completed'"
LIST_SELECT = "id,displayName,state,creationTime"
DESCRIBE_SELECT = "id,displayName,state,creationTime,executionInfo"
COLLECTION_MAX_TASKS = 100  # the service's limit per addtaskcollection call
COLLECTION_MAX_BYTES = 1_000_000  # ... and the body must stay under 1 MB
_TASK_ID = re.compile(BATCH_ID.removeprefix("^").removesuffix("$"))
_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$")


def display_name(pool: str, worker_id: str) -> str:
    return job_name(pool, worker_id)


def iso_duration(seconds: float) -> str:
    """ISO 8601 duration, as Batch constraints take it: 90061 -> 'P1DT1H1M1S'."""
    days, rest = divmod(max(1, round(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (secs, "S")) if n)
    return "P" + (f"{days}D" if days else "") + (f"T{clock}" if clock else "")


def parse_time(text: Any) -> float:
    """Seconds since the epoch from Batch's ``2024-01-02T03:04:05.1234567Z`` (0 if unreadable)."""
    match = _TIME.match(text) if isinstance(text, str) else None
    if match is None:
        return 0.0
    zone = (match[3] or "Z").replace("Z", "+00:00")
    return datetime.fromisoformat(match[1] + zone).timestamp() + float("0" + (match[2] or ""))


def container_run_options(pool: Pool, options: AzureBatchOptions) -> str:
    words = [
        "--entrypoint",
        "runplane-agent",
        "-v",
        f"{options.docker_socket}:{CONTAINER_SOCKET}",
        "-v",
        f"{options.work_dir}:{options.work_dir}",
        "--stop-timeout",
        str(options.stop_timeout_seconds),
    ]
    if pool.gpus:
        words += ["--gpus", "all"]  # the agent lists the node's GPUs and hands them to runs
    extra = options.container_run_options.strip()
    return shlex.join(words) + (f" {extra}" if extra else "")


def task_request(
    pool: Pool,
    options: AzureBatchOptions,
    worker_id: str,
    agent_args: Sequence[str],
    stack_env: Mapping[str, str],
) -> dict[str, Any]:
    """The Batch task (``BatchTaskCreateContent``) that starts one worker agent for ``pool``."""
    env = {**stack_env, **options.environment, "RUNPLANE_AGENT_WORK_DIR": options.work_dir}
    container: dict[str, Any] = {
        "imageName": options.image,
        "containerRunOptions": container_run_options(pool, options),
    }
    if options.registry is not None:
        container["registry"] = {
            "registryServer": options.registry.server,
            "identityReference": {"resourceId": options.registry.identity},
        }
    constraints: dict[str, Any] = {"maxTaskRetryCount": 0}  # the control plane re-queues runs itself
    if options.max_wall_clock is not None:
        constraints["maxWallClockTime"] = iso_duration(options.max_wall_clock)
    task: dict[str, Any] = {
        "id": worker_id,
        "displayName": display_name(pool.name, worker_id),
        "commandLine": shlex.join(
            [*stop_budget_args(options.stop_timeout_seconds), *agent_args, "--id", worker_id, "--pass-down-termination"]
        ),
        "containerSettings": container,
        "environmentSettings": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "constraints": constraints,
        "requiredSlots": options.required_slots,
        "userIdentity": {"autoUser": {"scope": "pool", "elevationLevel": options.elevation_level}},
    }
    if options.output_container_url is not None:
        destination: dict[str, Any] = {
            "containerUrl": options.output_container_url,
            "path": f"workers/{pool.name}/{worker_id}",
        }
        if options.output_identity is not None:
            destination["identityReference"] = {"resourceId": options.output_identity}
        # The task's stdout.txt and stderr.txt (the agent's log) sit one level above its working dir.
        task["outputFiles"] = [
            {
                "filePattern": "../std*.txt",
                "destination": {"container": destination},
                "uploadOptions": {"uploadCondition": "taskcompletion"},
            }
        ]
    return task


def _size(task: Mapping[str, Any]) -> int:
    return len(json.dumps(task, separators=(",", ":")).encode())


def collection_chunks(tasks: Sequence[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Tasks in groups the service takes in one addtaskcollection call: at most 100, and a body
    under 1 MB (a single task over it goes alone, for the service to refuse)."""
    chunk: list[dict[str, Any]] = []
    size = len('{"value":[]}')
    for task in tasks:
        grows = _size(task) + (1 if chunk else 0)
        if chunk and (len(chunk) == COLLECTION_MAX_TASKS or size + grows >= COLLECTION_MAX_BYTES):
            yield chunk
            chunk, size, grows = [], len('{"value":[]}'), _size(task)
        chunk.append(task)
        size += grows
    if chunk:
        yield chunk


def _new_worker_id(pool: Pool) -> str:
    return new_worker_id(pool.name)


class AzureBatchCompute(ComputeBackend):
    def __init__(
        self,
        client: BatchClient,
        environment: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        worker_ids: Callable[[Pool], str] = _new_worker_id,
    ) -> None:
        """``environment``: the stack settings handed to every agent (``stack_environment``)."""
        self.client = client
        self.environment = dict(environment or {})
        self.clock = clock
        self.worker_ids = worker_ids

    @classmethod
    def from_settings(
        cls, settings: StackSettings, transport: HttpTransport[Any, Any] | None = None
    ) -> AzureBatchCompute:
        """The backend for the account at ``azure_batch_account_url``, with its shared key or,
        without one, the managed identity (DefaultAzureCredential)."""
        if not settings.azure_batch_account_url:
            raise InvalidRequest(
                "compute backend 'azure-batch' needs RUNPLANE_AZURE_BATCH_ACCOUNT_URL "
                "(https://<account>.<region>.batch.azure.com)"
            )
        credential = None
        if not settings.azure_batch_account_key:
            missing = extras.requirement(
                "compute backend 'azure-batch' with the managed identity (no account key)", ("azure",)
            )
            if missing is not None:
                raise InvalidRequest(missing)
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        client = BatchClient(
            settings.azure_batch_account_url,
            account_key=settings.azure_batch_account_key,
            credential=credential,
            transport=transport,
        )
        # less the keys: agents on Batch nodes reach storage with the node's managed identity
        return cls(client, environment=stack_environment(settings.environment(), hide_credentials=True))

    def _job(self, pool: Pool, options: AzureBatchOptions, worker_id: str) -> BackendJob:
        detail = {"job_id": options.job_id, "batch_pool_id": options.batch_pool_id}
        return BackendJob(worker_id, pool.name, "pending", worker_id, self.clock(), detail)

    def launch(self, pool: Pool, count: int, agent_args: Sequence[str]) -> list[BackendJob]:
        """One task per worker: a single add for one worker, addtaskcollection calls for more."""
        options = pool_options(pool)
        tasks = [task_request(pool, options, self.worker_ids(pool), agent_args, self.environment) for _ in range(count)]
        jobs: list[BackendJob] = []
        if len(tasks) == 1:
            try:
                url = self.client.url(f"/jobs/{options.job_id}/tasks")
                self.client.call("add task", "POST", url, tasks[0], retry=False)
            except BackendError as e:
                e.details["jobs"] = []
                raise
            return [self._job(pool, options, tasks[0]["id"])]
        for chunk in collection_chunks(tasks):
            self._add_collection(pool, options, chunk, jobs)
        return jobs

    def _add_collection(
        self, pool: Pool, options: AzureBatchOptions, chunk: list[dict[str, Any]], jobs: list[BackendJob]
    ) -> None:
        url = self.client.url(f"/jobs/{options.job_id}/addtaskcollection")
        try:
            reply = self.client.call("add task collection", "POST", url, {"value": chunk}, retry=False)
        except BatchServiceError as e:
            if e.batch_code == "RequestBodyTooLarge" and len(chunk) > 1:
                half = len(chunk) // 2
                self._add_collection(pool, options, chunk[:half], jobs)
                self._add_collection(pool, options, chunk[half:], jobs)
                return
            e.details["jobs"] = list(jobs)
            raise
        except BackendError as e:
            e.details["jobs"] = list(jobs)
            raise
        results = {str(r.get("taskId")): r for r in (reply.body or {}).get("value", []) if isinstance(r, dict)}
        refused: dict[str, str] = {}
        messages: list[str] = []
        for task in chunk:
            result = results.get(task["id"], {})
            if result.get("status") == "success":
                jobs.append(self._job(pool, options, task["id"]))
                continue
            error = result.get("error") or {}
            code = str(error.get("code") or result.get("status") or "no result")
            message = error.get("message")
            text = str(message.get("value", "")) if isinstance(message, dict) else str(message or "")
            refused[task["id"]] = code
            messages.append(f"{code}: {text.splitlines()[0] if text else 'no message'}")
        if refused:
            raise BackendError(
                f"Azure Batch refused {len(refused)} of {len(chunk)} worker tasks ({messages[0]})",
                jobs=list(jobs),
                batch_code=next(iter(refused.values())),
                refused=refused,
            )

    def list(self, pool: Pool) -> list[BackendJob]:
        options = pool_options(pool)
        url: str | None = self.client.url(
            f"/jobs/{options.job_id}/tasks", {"$filter": LIST_FILTER, "$select": LIST_SELECT}
        )
        seen: set[str] = set()
        jobs: list[BackendJob] = []
        while url and url not in seen:
            seen.add(url)
            body = self.client.call("list tasks", "GET", url).body or {}
            for task in body.get("value", []):
                task_id = str(task.get("id"))
                state = LIVE_STATES.get(str(task.get("state")))
                if state is None or task.get("displayName") != display_name(pool.name, task_id):
                    continue
                jobs.append(
                    BackendJob(
                        task_id,
                        pool.name,
                        state,
                        task_id,
                        parse_time(task.get("creationTime")),
                        {"batch_state": task["state"]},
                    )
                )
            url = body.get("odata.nextLink")
        return jobs

    def describe(self, pool: Pool, job_id: str) -> BackendJob | None:
        """The task as Batch sees it; a completed task is ``failed`` when its result is a
        failure (``detail['reason']`` from its failureInfo), else ``finished``."""
        options = pool_options(pool)
        if not _TASK_ID.fullmatch(job_id):
            return None
        url = self.client.url(f"/jobs/{options.job_id}/tasks/{job_id}", {"$select": DESCRIBE_SELECT})
        try:
            task = self.client.call("get task", "GET", url).body or {}
        except BatchServiceError as e:
            if e.status == 404:  # TaskNotFound, or the whole job is gone
                return None
            raise
        if task.get("id") != job_id or task.get("displayName") != display_name(pool.name, job_id):
            return None  # another pool's task
        batch_state = str(task.get("state"))
        detail: dict[str, Any] = {"batch_state": batch_state}
        state = LIVE_STATES.get(batch_state, "pending")
        if batch_state == "completed":
            info = task.get("executionInfo") or {}
            if info.get("exitCode") is not None:
                detail["exit_code"] = info["exitCode"]
            state = "finished"
            if info.get("result") == "failure":
                state = "failed"
                failure = info.get("failureInfo") or {}
                detail["reason"] = f"{failure.get('code') or 'failure'}: {failure.get('message') or 'no message'}"
                detail["failure_category"] = failure.get("category")
        return BackendJob(job_id, pool.name, state, job_id, parse_time(task.get("creationTime")), detail)

    def cancel(self, pool: Pool, job_id: str) -> None:
        """Terminate the task. Quiet when it is unknown or has already completed."""
        options = pool_options(pool)
        if not _TASK_ID.fullmatch(job_id):
            return
        url = self.client.url(f"/jobs/{options.job_id}/tasks/{job_id}/terminate")
        try:
            self.client.call("terminate task", "POST", url)
        except BatchServiceError as e:
            if e.status == 404 or e.batch_code in ("TaskCompleted", "JobCompleted"):
                return
            raise


def build(settings: StackSettings) -> AzureBatchCompute:
    """The backend of ``azure-batch`` pools, for the account of ``settings`` (``from_settings``)."""
    return AzureBatchCompute.from_settings(settings)
