"""A run's stop signal reaches every process of its container on the real engine: a command that
starts its work as a child of its shell (no ``exec``) is heard by that child."""

from __future__ import annotations

import time
import uuid

import pytest

from runplane.domain.runs import Run, RunSpec
from tests.conftest import TEST_IMAGE, wait_for
from worker_agent.containers import RunContainer

pytestmark = pytest.mark.docker

# the outer shell runs the child and then one more command, so neither shell execs the other
COMMAND = (
    "sh -c 'trap \"echo child heard USR1; exit 0\" USR1; echo ready; while :; do sleep 0.1; done'; "
    "echo outer done after $?"
)


def test_a_child_of_the_commands_shell_hears_the_stop_signal(docker_client):
    run = Run(
        id=f"r-sig-{uuid.uuid4().hex[:8]}", owner="a", queue="q", created_at=0, attempt=1, spec=RunSpec(command=COMMAND)
    )
    box = RunContainer(docker_client, run, "w-1", time.time, stop_seconds=5)
    spec = {  # as container_spec starts a run's command
        "image": TEST_IMAGE,
        "entrypoint": ["/bin/sh", "-c"],
        "command": [run.spec.command],
        "name": run.id,
        "network_mode": "none",
    }
    try:
        assert box.create(spec, lambda: True, None) is None
        assert box.start(None) is None
        exited, result = box.waiter()
        wait_for(lambda: b"ready" in box.container.logs(), 30, what="the child to start")
        box.kill("SIGUSR1")
        assert exited.wait(20), "the child never heard its signal"
        assert result.get("StatusCode") == 0
        lines = box.container.logs().decode().splitlines()
        assert "child heard USR1" in lines and lines[-1] == "outer done after 0"  # the shell went on after it
    finally:
        box.remove("the test is done with it")
