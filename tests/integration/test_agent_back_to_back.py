"""Runs in a row on a one-slot worker start back to back: a run over gives its cores back at once
and its disk once its files are removed, and the next run, hinted while they go, waits for that
room rather than handing its hint back for RELEASE_DELAY_SECONDS. On the local stack (whose queue
wakes the agent at once) and the real Docker engine."""

import threading
import time

import pytest

from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE, wait_for
from worker_agent.agent import Agent
from worker_agent.intake import RELEASE_DELAY_SECONDS
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig

pytestmark = pytest.mark.docker

G = 1 << 30


def test_the_next_run_starts_as_soon_as_the_one_before_has_gone(local_stack, docker_client, tmp_path):
    spec = RunSpec.model_validate(
        {"command": "true", "queue": "manual", "image": TEST_IMAGE,
         "resources": {"cpus": 1, "memory": "64m", "disk": "1g"}}
    )  # fmt: skip
    first, second = (submit_run(local_stack.ports, Principal(user="a"), spec, None).run for _ in range(2))
    work_dir = tmp_path / "w-row"
    config = AgentConfig(
        pool="manual",
        worker_id="w-row",
        work_dir=work_dir,
        cpuset=(0,),
        disk=1 * G,  # room for one run's files: the second fits only once the first's are gone
        poll_seconds=1,
        executor=ExecutorConfig(worker_id="w-row", work_dir=work_dir, stack_id=local_stack.settings.stack_id()),
    )
    ports = AgentPorts(local_stack.store, local_stack.queue, local_stack.objects)
    agent = Agent(config, ports, local_stack.workers, docker_client, time.time)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: local_stack.store.get(second.id).state.terminal, 60, 0.1, "the second run to end")
    finally:
        agent.stop()
        thread.join(60)
    first, second = local_stack.store.get(first.id), local_stack.store.get(second.id)
    assert first.state == second.state == RunState.SUCCEEDED
    assert first.finished_at is not None and second.started_at is not None
    gap = second.started_at - first.finished_at
    assert gap < 3 < RELEASE_DELAY_SECONDS, f"the second run started {gap:.2f}s after the first ended"
