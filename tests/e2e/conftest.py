"""Fixtures of the end-to-end suite."""

import contextlib
import http.server
import os
import threading
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest

from tests.conftest import AgentProcess, aws_devstack_settings
from worker_agent.workdir import sweep_dead


@pytest.fixture
def agents(tmp_path, devstack, docker_client):
    """``agents(*flags, worker_id=None, env=None)``: agent processes of the local stack with FAST
    settings, in its environment (``env`` over it), stopped afterwards, with what those a test
    killed with SIGKILL left behind: their runs' containers and their work-dir mounts."""
    with started_agents(tmp_path, devstack.environment, docker_client) as start:
        yield start


@pytest.fixture
def aws_agents(tmp_path, aws_devstack, docker_client):
    """``agents`` of the AWS local stack (``aws_devstack``, moto)."""
    with started_agents(tmp_path, aws_devstack_settings(aws_devstack).environment(), docker_client) as start:
        yield start


@contextlib.contextmanager
def started_agents(tmp_path, stack_environment, docker_client):
    started = []

    def start(*args, worker_id=None, env=None):
        environment = {**os.environ, **stack_environment, **(env or {})}
        agent = AgentProcess(tmp_path, *args, worker_id=worker_id, env=environment)
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        # Every agent is stopped before any container is removed: agents may share an id (a restarted
        # one), and a removal that meets a container its live agent is removing must not leave that
        # agent running to take later tests' runs.
        for agent in started:
            agent.stop()
        for worker_id in dict.fromkeys(agent.id for agent in started):
            for container in docker_client.containers.list(
                all=True, sparse=True, filters={"label": f"io.runplane.worker_id={worker_id}"}
            ):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True)
        sweep_dead(tmp_path / "work")


class Notice(http.server.BaseHTTPRequestHandler):
    """A preemption notice URL on loopback (an agent's --preemption-watch): 404 until the machine is to be
    taken away (``Notice.given.set()``), then 200."""

    given = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200 if self.given.is_set() else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def notice_url() -> Iterator[str]:
    Notice.given.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Notice)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/notice"
    server.shutdown()
    server.server_close()
