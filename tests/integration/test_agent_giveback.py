"""An agent gives back what it set aside for a run (cores, memory, disk) whenever it does not
take it, even when handing the run's hint back to the queue fails: a worker that kept the room of
every run it met this way would end with no free cores. On the real stores (moto server); the
queue is the real SQS adapter but for the one call that fails, as the queue service can."""

import time
from pathlib import Path
from typing import Any

import pytest

from runplane.adapters.aws.dynamodb import DynamoQuotaStore
from runplane.domain.errors import BackendError
from runplane.domain.models import Principal, Quota, RunSpec, RunState
from runplane.ports import Delivery
from runplane.services.runs import submit_run
from worker_agent.agent import Agent, AgentConfig
from worker_agent.run_config import Ports

G = 1 << 30


class FailingQueue:
    """The real queue, whose ``delete`` and ``release`` fail as the queue service can."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.failed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)

    def delete(self, pool: str, delivery: Delivery) -> None:
        self.failed.append("delete")
        raise BackendError("delete message failed: the queue service is unavailable")

    def release(self, pool: str, delivery: Delivery, delay_seconds: int) -> None:
        self.failed.append("release")
        raise BackendError("release message failed: the queue service is unavailable")


@pytest.mark.parametrize(
    ("quotas", "handed_back"),
    [("full", "delete"), ("failing", "release")],
    ids=["no-room-under-the-quota", "quota-store-failing"],
)
def test_the_room_goes_back_when_the_hint_cannot_be_handed_back(aws_stack, tmp_path: Path, quotas, handed_back):
    spec = RunSpec.model_validate(
        {"command": "echo hi", "queue": "default", "resources": {"cpus": 1, "memory": "1g", "disk": "1g"}}
    )
    run = submit_run(
        aws_stack.store, aws_stack.queue, aws_stack.pools, Principal(user="alice"), spec, None, time.time
    ).run
    if quotas == "full":
        aws_stack.quotas.put(Quota(kind="user", name="alice", max_running=0, updated_at=time.time()))
        quota_store = aws_stack.quotas
    else:
        quota_store = DynamoQuotaStore(f"{aws_stack.settings.prefix}-no-such-table", aws_stack.quotas.client)
    queue = FailingQueue(aws_stack.queue)
    config = AgentConfig(
        pool="default", worker_id="w-1", work_dir=tmp_path / "w-1", cpuset=(0, 1), memory=2 * G, disk=4 * G
    )
    agent = Agent(config, Ports(aws_stack.store, queue, aws_stack.objects, quota_store), registry=None,
                  docker_client=None, clock=time.time)  # type: ignore[arg-type]  # fmt: skip
    (delivery,) = aws_stack.queue.receive("default", 1, 5, visibility_seconds=30)
    assert delivery.message.run_id == run.id

    with pytest.raises(BackendError):
        agent._take(delivery)

    assert queue.failed == [handed_back]
    assert agent.allocator.free() == (2, 0) and agent.allocator.free_bytes() == (2 * G, 4 * G)
    assert agent.claimed == 0 and agent.active == {}
    assert aws_stack.store.get(run.id).state == RunState.QUEUED
