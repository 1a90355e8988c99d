"""An unexpected error while the agent takes a run (README, "Stopping"): with
``--exit-on-exception`` the agent stops and says why (``runplane-agent`` then exits 1); without,
it goes on after a bounded backoff. The error is a real one: the agent's runs table is gone from
the store (moto server) while its queue still holds a hint. Docker is only asked for leftovers."""

import stat
import threading
import time
import uuid

import pytest

from runplane.adapters.aws.runs import DynamoRunStore
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.services.runs import submit_run
from tests.conftest import wait_for
from worker_agent.agent import Agent
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig

pytestmark = pytest.mark.docker


def started(aws_stack, docker_client, tmp_path, exit_on_exception):
    """An agent of pool "default" whose runs table does not exist, running in a thread, with one
    hint waiting in its queue."""
    spec = RunSpec.model_validate({"command": "true", "queue": "default"})
    submit_run(aws_stack.ports, Principal(user="a"), spec, None)
    worker, work_dir = f"w-{uuid.uuid4().hex[:6]}", tmp_path / "w"
    config = AgentConfig(
        pool="default",
        worker_id=worker,
        work_dir=work_dir,
        cpuset=(0,),
        poll_seconds=1,
        exit_on_exception=exit_on_exception,
        executor=ExecutorConfig(worker_id=worker, work_dir=work_dir, stack_id=f"errors-{worker}"),
    )
    gone = DynamoRunStore(f"{aws_stack.settings.prefix}-no-such-table", aws_stack.store.client)
    agent = Agent(
        config, AgentPorts(gone, aws_stack.queue, aws_stack.objects), aws_stack.workers, docker_client, time.time
    )
    said: list[str] = []
    thread = threading.Thread(target=lambda: said.append(agent.run()), daemon=True)
    thread.start()
    return agent, thread, said


def test_exit_on_exception_stops_the_agent_at_the_first_error(aws_stack, docker_client, tmp_path):
    agent, thread, said = started(aws_stack, docker_client, tmp_path, exit_on_exception=True)
    thread.join(60)
    assert not thread.is_alive(), "the agent went on after an error with --exit-on-exception"
    assert agent.failed  # runplane-agent exits 1
    assert said[0].startswith("error while taking a run: read run failed"), said
    assert agent.errors_in_a_row == 1
    assert stat.S_IMODE(agent.config.work_dir.stat().st_mode) == 0o700  # the runs' files: the agent's user's alone


def test_without_exit_on_exception_the_agent_goes_on(aws_stack, docker_client, tmp_path):
    agent, thread, said = started(aws_stack, docker_client, tmp_path, exit_on_exception=False)
    try:
        wait_for(lambda: agent.errors_in_a_row >= 1, 60, 0.05, "the agent to meet the error")
        assert thread.is_alive() and not agent.failed  # backing off (2 s), then taking runs again
    finally:
        agent.stop()
        thread.join(60)
    assert said == ["asked to stop"] and not agent.failed
