"""Fixtures of the end-to-end suite."""

import pytest

from tests.conftest import AgentProcess
from worker_agent.workdir import sweep_dead


@pytest.fixture
def agents(tmp_path, devstack, docker_client):
    """``agents(*flags, worker_id=None, env=None)``: agent processes of the local stack with FAST
    settings, stopped afterwards, with what those a test killed with SIGKILL left behind: their
    runs' containers and their work-dir mounts."""
    started = []

    def start(*args, worker_id=None, env=None):
        agent = AgentProcess(tmp_path, *args, worker_id=worker_id, env=env)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
        for container in docker_client.containers.list(
            all=True, sparse=True, filters={"label": f"io.runplane.worker_id={agent.id}"}
        ):
            container.remove(force=True)
    sweep_dead(tmp_path / "work")
