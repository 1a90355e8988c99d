"""The aws-batch backend's requests, exactly; and how it pages, reuses and cancels (against a
fake client that only records calls: the real behaviour is tested against moto's Batch)."""

from __future__ import annotations

from typing import Any

import pytest

from runplane.compute.aws_batch.compute import AwsBatchCompute, job_definition_request, submit_job_request
from runplane.compute.options import stack_environment
from runplane.compute.registry import build_backend
from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Pool
from runplane.settings import StackSettings

STACK_ENV = {"RUNPLANE_PREFIX": "p1", "RUNPLANE_AWS_REGION": "eu-west-1"}


def pool(**options: Any) -> Pool:
    return Pool(
        name="batch",
        backend="aws-batch",
        cpus=1.5,
        gpus=2,
        memory="3g",
        default_image="x",
        options={"job_queue": "q1", **options},
    )


def test_job_definition_request_is_exact():
    p = pool(
        job_role_arn="arn:aws:iam::123456789012:role/worker",
        environment={"RUNPLANE_AGENT_POLL_SECONDS": "2"},
        tags={"team": "ml"},
    )
    request = job_definition_request(p, STACK_ENV)
    name = request.pop("jobDefinitionName")
    assert name.startswith("runplane-batch-") and len(name) == len("runplane-batch-") + 12
    assert request == {
        "type": "container",
        "containerProperties": {
            "image": "runplane/agent:local",
            "resourceRequirements": [
                {"type": "VCPU", "value": "2"},
                {"type": "MEMORY", "value": "3072"},
                {"type": "GPU", "value": "2"},
            ],
            "volumes": [
                {"name": "docker-socket", "host": {"sourcePath": "/var/run/docker.sock"}},
                {"name": "work-dir", "host": {"sourcePath": "/var/lib/runplane"}},
            ],
            "mountPoints": [
                {"sourceVolume": "docker-socket", "containerPath": "/var/run/docker.sock", "readOnly": False},
                {"sourceVolume": "work-dir", "containerPath": "/var/lib/runplane", "readOnly": False},
            ],
            "environment": [
                {"name": "RUNPLANE_AGENT_POLL_SECONDS", "value": "2"},
                {"name": "RUNPLANE_AGENT_WORK_DIR", "value": "/var/lib/runplane"},
                {"name": "RUNPLANE_AWS_REGION", "value": "eu-west-1"},
                {"name": "RUNPLANE_PREFIX", "value": "p1"},
            ],
            "jobRoleArn": "arn:aws:iam::123456789012:role/worker",
        },
        "retryStrategy": {"attempts": 1},
        "tags": {"runplane:pool": "batch", "team": "ml"},
    }


def test_job_definition_name_follows_the_shape_only():
    a = job_definition_request(pool(), STACK_ENV)["jobDefinitionName"]
    assert job_definition_request(pool(), STACK_ENV)["jobDefinitionName"] == a
    assert job_definition_request(pool(image="other:1"), STACK_ENV)["jobDefinitionName"] != a
    assert job_definition_request(pool(work_dir="/data"), STACK_ENV)["jobDefinitionName"] != a
    assert job_definition_request(pool(), {**STACK_ENV, "RUNPLANE_PREFIX": "p2"})["jobDefinitionName"] != a
    no_gpu = pool().model_copy(update={"gpus": 0})
    props = job_definition_request(no_gpu, STACK_ENV)["containerProperties"]
    assert [r["type"] for r in props["resourceRequirements"]] == ["VCPU", "MEMORY"]
    assert "jobRoleArn" not in props


def test_submit_job_request_is_exact():
    request = submit_job_request(pool(tags={"team": "ml"}), "batch-1234", "arn:def", ["--pool", "batch"])
    assert request == {
        "jobName": "runplane-batch--batch-1234",
        "jobQueue": "q1",
        "jobDefinition": "arn:def",
        "containerOverrides": {
            # ECS's 30 s from SIGTERM to SIGKILL: the agent's stop budget fits in it, with time to hand back
            "command": [
                "--stop-budget-seconds",
                "15",
                "--pool",
                "batch",
                "--id",
                "batch-1234",
                "--pass-down-termination",
            ]
        },
        "tags": {"team": "ml", "runplane:pool": "batch", "runplane:worker": "batch-1234"},
    }


def test_job_queue_is_required_and_credentials_are_refused():
    bare = pool().model_copy(update={"options": {}})
    with pytest.raises(InvalidRequest, match=r"^pool batch: bad aws-batch options: job_queue: required$"):
        job_definition_request(bare, STACK_ENV)
    with pytest.raises(InvalidRequest, match=r"environment: must not hold credentials \(AWS_SECRET_ACCESS_KEY"):
        job_definition_request(pool(environment={"AWS_SECRET_ACCESS_KEY": "x"}), STACK_ENV)
    typo = pool().model_copy(update={"options": {**pool().options, "enviroment": {"A": "1"}}})
    with pytest.raises(InvalidRequest, match=r"unknown option 'enviroment' \(known: job_queue, image"):
        job_definition_request(typo, STACK_ENV)
    with pytest.raises(InvalidRequest, match="work_dir: 'data' is not an absolute path"):
        job_definition_request(pool(work_dir="data"), STACK_ENV)


def test_stack_environment_takes_runplane_settings_but_not_agent_args_or_keys():
    env = {
        "RUNPLANE_PREFIX": "e2e",
        "RUNPLANE_AGENT_ARGS": "--x",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "HOME": "/root",
        "RUNPLANE_AZURE_STORAGE_CONNECTION_STRING": "AccountKey=secret",
    }
    assert stack_environment(env, hide_credentials=True) == {"RUNPLANE_PREFIX": "e2e"}
    # a cluster's workers have no identity of their own: there the stack's credentials go along
    assert stack_environment(env, hide_credentials=False) == {
        "RUNPLANE_PREFIX": "e2e",
        "RUNPLANE_AZURE_STORAGE_CONNECTION_STRING": "AccountKey=secret",
    }


class PagedListJobs:
    """Answers list_jobs from canned pages. moto's Batch (the integration contract) cannot be made
    to page, since the backend sends no maxResults; everything else runs against moto."""

    def __init__(self, pages: dict[tuple[str, str | None], dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_jobs(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("list_jobs", kwargs))
        return self.pages.get((kwargs["jobStatus"], kwargs.get("nextToken")), {"jobSummaryList": []})


def summary(job_id: str, name: str, created_ms: int = 1_700_000_000_000) -> dict[str, Any]:
    return {"jobId": job_id, "jobName": name, "createdAt": created_ms}


def test_list_follows_next_token_for_every_live_status_and_keeps_this_pools_jobs():
    fake = PagedListJobs(
        {
            ("RUNNABLE", None): {
                "jobSummaryList": [summary("a", "runplane-batch--batch-1"), summary("x", "runplane-other--o-1")],
                "nextToken": "t1",
            },
            ("RUNNABLE", "t1"): {"jobSummaryList": [summary("b", "runplane-batch--batch-2")]},
            ("RUNNING", None): {"jobSummaryList": [summary("c", "runplane-batch--batch-3", 1_700_000_001_500)]},
        }
    )
    jobs = AwsBatchCompute(fake, environ={}).list(pool())
    assert [(j.id, j.state, j.worker_id) for j in jobs] == [
        ("a", "pending", "batch-1"),
        ("b", "pending", "batch-2"),
        ("c", "running", "batch-3"),
    ]
    assert jobs[2].created_at == 1_700_000_001.5
    assert [c[1] for c in fake.calls] == [
        {"jobQueue": "q1", "jobStatus": "SUBMITTED"},
        {"jobQueue": "q1", "jobStatus": "PENDING"},
        {"jobQueue": "q1", "jobStatus": "RUNNABLE"},
        {"jobQueue": "q1", "jobStatus": "RUNNABLE", "nextToken": "t1"},
        {"jobQueue": "q1", "jobStatus": "STARTING"},
        {"jobQueue": "q1", "jobStatus": "RUNNING"},
    ]


def test_the_registry_builds_it_on_the_settings_endpoint():
    compute = build_backend("aws-batch", StackSettings(aws_endpoint_url="http://127.0.0.1:1"))
    assert isinstance(compute, AwsBatchCompute) and compute.client.meta.endpoint_url == "http://127.0.0.1:1"
