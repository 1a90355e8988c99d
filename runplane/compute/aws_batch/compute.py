"""Workers as AWS Batch jobs: one container per worker, running the agent image.

Pool ``options``: ``options.py``.

One job definition per pool shape (image, resources, role, environment) is registered once and
reused: its name carries a hash of the shape, so a changed shape gets a new definition, never a
new revision per launch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import AwsConfig, make_client
from runplane.backend import BackendJob, ComputeBackend
from runplane.compute.aws_batch.options import options as pool_options
from runplane.compute.options import (
    job_name,
    new_worker_id,
    stack_environment,
    stop_budget_args,
    worker_of,
)
from runplane.domain.errors import BackendError
from runplane.domain.pools import Pool
from runplane.settings import StackSettings

CONTAINER_SOCKET = "/var/run/docker.sock"
LIVE_STATES = {
    "SUBMITTED": "pending",
    "PENDING": "pending",
    "RUNNABLE": "pending",
    "STARTING": "pending",
    "RUNNING": "running",
}


def job_definition_request(pool: Pool, stack_env: Mapping[str, str]) -> dict[str, Any]:
    """The ``register_job_definition`` request for the workers of ``pool``.

    ``stack_env`` is what the agent needs to find the stack (see ``stack_environment``); the
    pool's ``environment`` option is laid over it, and the agent's work dir is the mounted one.
    The name ends in a hash of everything else, so equal shapes share one definition.
    """
    o = pool_options(pool)
    env = {**stack_env, **o.environment, "RUNPLANE_AGENT_WORK_DIR": o.work_dir}
    resources = [
        {"type": "VCPU", "value": str(max(1, math.ceil(pool.cpus)))},
        {"type": "MEMORY", "value": str(max(1, pool.memory // 2**20))},
    ]
    if pool.gpus:
        resources.append({"type": "GPU", "value": str(pool.gpus)})
    container: dict[str, Any] = {
        "image": o.image,
        "resourceRequirements": resources,
        "volumes": [
            {"name": "docker-socket", "host": {"sourcePath": o.docker_socket}},
            {"name": "work-dir", "host": {"sourcePath": o.work_dir}},
        ],
        "mountPoints": [
            {"sourceVolume": "docker-socket", "containerPath": CONTAINER_SOCKET, "readOnly": False},
            {"sourceVolume": "work-dir", "containerPath": o.work_dir, "readOnly": False},
        ],
        "environment": [{"name": k, "value": v} for k, v in sorted(env.items())],
    }
    if o.job_role_arn:
        container["jobRoleArn"] = str(o.job_role_arn)
    shape = json.dumps(container, sort_keys=True)
    digest = hashlib.sha256(shape.encode()).hexdigest()[:12]
    return {
        "jobDefinitionName": f"runplane-{pool.name}-{digest}",
        "type": "container",
        "containerProperties": container,
        "retryStrategy": {"attempts": 1},  # the control plane re-queues runs itself
        "tags": {"runplane:pool": pool.name, **o.tags},
    }


def submit_job_request(pool: Pool, worker_id: str, job_definition: str, agent_args: Sequence[str]) -> dict[str, Any]:
    """The ``submit_job`` request that starts one worker agent for ``pool``."""
    o = pool_options(pool)
    return {
        "jobName": job_name(pool.name, worker_id),
        "jobQueue": o.job_queue,
        "jobDefinition": job_definition,
        "containerOverrides": {
            "command": [
                *stop_budget_args(o.stop_timeout_seconds),
                *agent_args,
                *("--id", worker_id, "--pass-down-termination"),
            ]
        },
        "tags": {**o.tags, "runplane:pool": pool.name, "runplane:worker": worker_id},
    }


class AwsBatchCompute(ComputeBackend):
    def __init__(
        self,
        client: Any,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``client`` is a boto3 ``batch`` client; ``environ`` where the stack settings passed
        to the workers come from (default: this process's environment, read at each launch)."""
        self.client = client
        self.environ = environ
        self.clock = clock
        self._definitions: dict[str, str] = {}

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise BackendError(f"AWS Batch {what} failed: {e}") from e

    def job_definition(self, pool: Pool) -> str:
        """The ARN of the pool's job definition, registered on first use and reused."""
        request = job_definition_request(
            pool, stack_environment(os.environ if self.environ is None else self.environ, hide_credentials=True)
        )
        name = request["jobDefinitionName"]
        if name in self._definitions:
            return self._definitions[name]
        found = self._call(
            "describe_job_definitions",
            self.client.describe_job_definitions,
            jobDefinitionName=name,
            status="ACTIVE",
        )
        active = sorted(found.get("jobDefinitions", []), key=lambda d: d.get("revision", 0))
        if active:
            arn = str(active[-1]["jobDefinitionArn"])
        else:
            arn = str(
                self._call("register_job_definition", self.client.register_job_definition, **request)[
                    "jobDefinitionArn"
                ]
            )
        self._definitions[name] = arn
        return arn

    def launch(self, pool: Pool, count: int, agent_args: Sequence[str]) -> list[BackendJob]:
        definition = self.job_definition(pool)
        jobs: list[BackendJob] = []
        for _ in range(count):
            worker_id = new_worker_id(pool.name)
            request = submit_job_request(pool, worker_id, definition, agent_args)
            try:
                done = self.client.submit_job(**request)
            except (ClientError, BotoCoreError) as e:
                raise BackendError(f"AWS Batch refused the worker job: {e}", jobs=jobs) from e
            jobs.append(
                BackendJob(
                    str(done["jobId"]), pool.name, "pending", worker_id, self.clock(), {"job_definition": definition}
                )
            )
        return jobs

    def list(self, pool: Pool) -> list[BackendJob]:
        queue = pool_options(pool).job_queue
        jobs: dict[str, BackendJob] = {}
        for status, state in LIVE_STATES.items():
            token: str | None = None
            while True:
                kwargs: dict[str, Any] = {"jobQueue": queue, "jobStatus": status}
                if token:
                    kwargs["nextToken"] = token
                page = self._call("list_jobs", self.client.list_jobs, **kwargs)
                for summary in page.get("jobSummaryList", []):
                    worker_id = worker_of(str(summary.get("jobName", "")), pool.name)
                    if worker_id is None:
                        continue
                    job_id = str(summary["jobId"])
                    jobs[job_id] = BackendJob(
                        job_id,
                        pool.name,
                        state,
                        worker_id,
                        float(summary.get("createdAt", 0)) / 1000,
                        {"batch_status": status},
                    )
                token = page.get("nextToken")
                if not token:
                    break
        return list(jobs.values())

    def _find(self, job_id: str) -> dict[str, Any] | None:
        found = self._call("describe_jobs", self.client.describe_jobs, jobs=[job_id]).get("jobs", [])
        return dict(found[0]) if found else None

    def describe(self, pool: Pool, job_id: str) -> BackendJob | None:
        """The job in any state; a FAILED job carries Batch's status reason (and the container's,
        e.g. CannotPullContainerError) in ``detail['reason']``."""
        job = self._find(job_id)
        worker_id = worker_of(str(job.get("jobName", "")), pool.name) if job is not None else None
        if job is None or worker_id is None:  # unknown, or another pool's job
            return None
        status = str(job.get("status", ""))
        state = LIVE_STATES.get(status) or ("finished" if status == "SUCCEEDED" else "failed")
        detail: dict[str, Any] = {"batch_status": status}
        if state == "failed":
            container_reason = (job.get("container") or {}).get("reason")
            reasons = [r for r in (job.get("statusReason"), container_reason) if r]
            detail["reason"] = "; ".join(str(r) for r in reasons) or "the Batch job failed"
        return BackendJob(
            job_id,
            pool.name,
            state,
            worker_id,
            float(job.get("createdAt", 0)) / 1000,
            detail,
        )

    def cancel(self, pool: Pool, job_id: str) -> None:
        """Terminate the job (the container gets SIGTERM, then SIGKILL: the agent hands its runs
        back). Quiet when the job is unknown or already finished."""
        job = self._find(job_id)
        if job is None or job.get("status") in ("SUCCEEDED", "FAILED"):
            return
        self._call("terminate_job", self.client.terminate_job, jobId=job_id, reason="runplane: cancelled")


def build(settings: StackSettings) -> AwsBatchCompute:
    """The backend of ``aws-batch`` pools, on the region and endpoint of ``settings``; its workers
    find the stack by ``settings``."""
    config = AwsConfig(region=settings.aws_region, endpoint_url=settings.aws_endpoint_url)
    return AwsBatchCompute(make_client("batch", config), environ=settings.exported(os.environ))
