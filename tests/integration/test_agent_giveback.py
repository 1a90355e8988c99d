"""An agent gives back what it set aside for a run (cores, memory, disk) whenever it does not
take it, even when handing the run's hint back to the queue fails: a worker that kept the room of
every run it met this way would end with no free cores. A run it took gives back its disk only
once its files are removed. On the real stores (moto server) and the real Docker engine; the queue
is the real SQS adapter but for the one call that fails, as the queue service can."""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runplane.adapters.aws.quotas import DynamoQuotaStore
from runplane.domain.errors import BackendError
from runplane.domain.quotas import Quota
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.ports import Delivery
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE
from worker_agent.agent import Agent
from worker_agent.resources import Allocator
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig

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
    run = submit_run(aws_stack.ports, Principal(user="alice"), spec, None).run
    if quotas == "full":
        aws_stack.quotas.put(Quota(kind="user", name="alice", max_running=0, updated_at=time.time()))
        quota_store = aws_stack.quotas
    else:
        quota_store = DynamoQuotaStore(f"{aws_stack.settings.prefix}-no-such-table", aws_stack.quotas.client)
    queue = FailingQueue(aws_stack.queue)
    config = AgentConfig(
        pool="default", worker_id="w-1", work_dir=tmp_path / "w-1", cpuset=(0, 1), memory=2 * G, disk=4 * G
    )
    agent = Agent(config, AgentPorts(aws_stack.store, queue, aws_stack.objects, quota_store), registry=None,
                  docker_client=None, clock=time.time)  # type: ignore[arg-type]  # fmt: skip
    (delivery,) = aws_stack.queue.receive("default", 1, 5, visibility_seconds=30)
    assert delivery.message.run_id == run.id

    with pytest.raises(BackendError):
        agent.intake.take(delivery)

    assert queue.failed == [handed_back]
    assert agent.slots.allocator.free() == (2, 0) and agent.slots.allocator.free_bytes() == (2 * G, 4 * G)
    assert agent.slots.claimed == 0 and agent.slots.active == {}
    assert aws_stack.store.get(run.id).state == RunState.QUEUED


@dataclass
class NotingAllocator(Allocator):
    """The agent's allocator, noting after each release the disk free and whether the run's
    directory (``run_dir``) was still there."""

    run_dir: Path = Path("/nonexistent")
    noted: list[tuple[int, bool]] = field(default_factory=list)

    def release(self, run_id: str, **kwargs: Any) -> None:
        super().release(run_id, **kwargs)
        self.noted.append((self.free_bytes()[1], self.run_dir.exists()))


@pytest.mark.docker
def test_a_runs_disk_comes_back_once_its_files_are_removed(aws_stack, docker_client, tmp_path: Path):
    """Its cores come back as soon as its container has ended (the next run starts while its
    files go), its disk only once they are gone: it was all given back before they were removed."""
    spec = RunSpec.model_validate(
        {"command": "head -c 100000 /dev/zero > f", "queue": "manual", "image": TEST_IMAGE,
         "resources": {"cpus": 1, "memory": "64m", "disk": "1g"}}
    )  # fmt: skip
    run = submit_run(aws_stack.ports, Principal(user="a"), spec, None).run
    work_dir = tmp_path / "w-disk"
    executor = ExecutorConfig(worker_id="w-disk", work_dir=work_dir, stack_id=aws_stack.settings.stack_id())
    config = AgentConfig(
        pool="manual", worker_id="w-disk", work_dir=work_dir, cpuset=(0, 1), disk=4 * G, executor=executor
    )
    agent = Agent(
        config, AgentPorts(aws_stack.store, aws_stack.queue, aws_stack.objects), None, docker_client, time.time
    )
    agent.slots.allocator = allocator = NotingAllocator([0, 1], [], 0, 4 * G, run_dir=work_dir / "runs" / f"{run.id}-1")
    (delivery,) = aws_stack.queue.receive("manual", 1, 5, visibility_seconds=30)

    agent.intake.take(delivery)
    thread = agent.slots.active[run.id].thread
    assert thread is not None
    thread.join(60)

    assert aws_stack.store.get(run.id).state == RunState.SUCCEEDED
    assert allocator.noted[0] == (3 * G, True)  # the slot back, its files still there
    assert [noted for noted in allocator.noted if noted[0] == 4 * G] == [(4 * G, False)]
    assert allocator.free() == (2, 0) and allocator.free_bytes() == (0, 4 * G)
