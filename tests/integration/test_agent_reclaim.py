"""An agent never claims a new attempt of a run whose earlier attempt is still ending on it (its
lease lost, its container being stopped): the cores, the heartbeat and the slot of a run are keyed
by the run, so the old attempt's end would release the new one's cores and stop renewing its lease.
On the real stores (moto server); no container is involved."""

import time
from pathlib import Path
from types import SimpleNamespace

from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services.runs import submit_run
from worker_agent.agent import Agent
from worker_agent.run_config import AgentConfig, AgentPorts


def test_a_run_still_ending_here_is_left_for_another_worker(aws_stack, tmp_path: Path):
    spec = RunSpec.model_validate({"command": "echo hi", "queue": "default", "resources": {"cpus": 1}})
    submitted = submit_run(aws_stack.ports, Principal(user="alice"), spec, None).run
    config = AgentConfig(pool="default", worker_id="w-1", work_dir=tmp_path / "w-1", cpuset=(0, 1))
    ports = AgentPorts(aws_stack.store, aws_stack.queue, aws_stack.objects)
    agent = Agent(config, ports, registry=None, docker_client=None, clock=time.time)  # type: ignore[arg-type]
    old = agent.slots.allocator.allocate(submitted.id, 1, 0)  # the earlier attempt's core, still held
    assert old is not None
    agent.slots.active[submitted.id] = SimpleNamespace(run=submitted)  # type: ignore[assignment]
    (delivery,) = aws_stack.queue.receive("default", 1, 5, visibility_seconds=30)
    assert delivery.message.run_id == submitted.id

    agent.intake.take(delivery)

    after = aws_stack.store.get(submitted.id)
    assert (after.state, after.attempt, after.worker_id) == (RunState.QUEUED, submitted.attempt, None)
    assert agent.slots.allocator.free() == (1, 0)  # the earlier attempt's core only
    assert agent.slots.active[submitted.id].run is submitted and agent.slots.claimed == 0
    # the message went back to the queue for any worker (after the release delay), not deleted
    again = aws_stack.queue.receive("default", 1, 10, visibility_seconds=30)
    assert [d.message.run_id for d in again] == [submitted.id]
