"""Run containers on one Docker engine shared by several workers, on the real engine and a store
on the moto server: no worker removes the container of a run that another worker holds, even
when the store let two workers claim the same attempt (moto's DynamoDB, unlike DynamoDB, lets
two racing conditional claims both through), and every removal of a run container says in the
agent's log whose container it was and why."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.bootstrap import Stack
from runplane.domain.expect import Expect
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE, wait_for
from tests.gate import GATE, open_gate
from worker_agent.agent import Agent
from worker_agent.container_spec import LABEL, container_name
from worker_agent.executor import RunExecutor
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker

REMOVAL = re.compile(r"removing container \w+ \(run (\S+) attempt (\d+), made by worker (\S+)\): (.+)")


def queued_run(stack: Stack, command: str) -> Run:
    spec = RunSpec.model_validate({"command": command, "queue": "manual", "resources": {"memory": "64m"}})
    return submit_run(stack.ports, Principal(user="a"), spec, None).run


def claimed_twice(stack: Stack, queued: Run, first: str, second: str) -> tuple[Run, Run]:
    """What two workers get when both their claims of the run's next attempt pass, as racing
    conditional writes can on moto's DynamoDB: ``first`` is told it holds the attempt, and the
    store keeps ``second``'s claim, written over the first."""
    told = lifecycle.claim(stack.store, queued, queued.attempt, first, 60, time.time())
    message = f"attempt {told.attempt} claimed by worker {second}"
    kept = stack.store.update(
        told, Expect(), {"worker_id": second}, Event(at=time.time(), state=RunState.PREPARING, message=message)
    )
    return told, kept


def executor(stack: Stack, docker_client: Any, run: Run, worker_id: str, root: Path, **config: Any) -> RunExecutor:
    settings = ExecutorConfig(
        worker_id=worker_id, work_dir=root / worker_id, stack_id=stack.settings.stack_id(), **config
    )
    ports = AgentPorts(stack.store, stack.queue, stack.objects)
    return RunExecutor(run, ports, docker_client, settings, time.time, users=ImageUsers(docker_client))


def left_container(docker_client: Any, stack: Stack, run: Run, worker_id: str, attempt: int) -> Any:
    """A running container of ``run``'s ``attempt`` as ``worker_id`` made it (its name and labels)."""
    container = docker_client.containers.run(
        TEST_IMAGE,
        ["sh", "-c", "sleep 600"],
        name=container_name(stack.settings.stack_id(), run.id, attempt),
        labels={
            f"{LABEL}.run_id": run.id,
            f"{LABEL}.attempt": str(attempt),
            f"{LABEL}.worker_id": worker_id,
            f"{LABEL}.stack": stack.settings.stack_id(),
        },
        network_mode="none",
        detach=True,
    )
    return container


def exists(docker_client: Any, container_id: str) -> bool:
    try:
        docker_client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


def removals(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str, str]]:
    """Each removal the agent logged: (run id, attempt, worker, why)."""
    found = []
    for record in caplog.records:
        if record.levelno == logging.INFO and (match := REMOVAL.fullmatch(record.getMessage())):
            found.append((match[1], match[2], match[3], match[4]))
    return found


@pytest.fixture
def containers(docker_client):
    """Containers a test made itself, removed afterwards whatever happened."""
    made: list[Any] = []
    yield made
    for container in made:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def test_a_worker_never_removes_the_container_of_the_worker_that_holds_its_attempt(
    docker_client, aws_stack, tmp_path, caplog, containers
):
    """Two workers were both let claim attempt 1 and the store kept the holder's claim. The holder's
    container runs; the other worker, making its container, finds the attempt's name taken. It
    must give the run up and leave the holder's container alone (it used to remove it, and the
    holder's run failed: "the container was removed from the Docker engine while it ran")."""
    caplog.set_level(logging.INFO, logger="worker_agent")
    s = aws_stack
    queued = queued_run(s, f"{GATE}; echo done > out")
    told, kept = claimed_twice(s, queued, "w-loser", "w-holder")
    holder = executor(s, docker_client, kept, "w-holder", tmp_path)
    holder.start()
    wait_for(lambda: s.store.get(queued.id).state == RunState.RUNNING, 60, 0.1, "the holder's container to run")
    assert holder.container is not None
    containers.append(holder.container)  # a run held at its gate, should the test fail before opening it
    held = holder.container.id
    # its preparing is too quick for a look at the store (as when both claims land together)
    loser = executor(s, docker_client, told, "w-loser", tmp_path, kill_poll_seconds=3600)
    loser.run_safely()
    assert [c.id for c in docker_client.containers.list(filters={"id": held})] == [held], "the holder's container"
    assert loser.container is None
    losers = {"label": [f"{LABEL}.run_id={queued.id}", f"{LABEL}.worker_id=w-loser"]}
    assert docker_client.containers.list(all=True, sparse=True, filters=losers) == []
    assert [r for r in removals(caplog) if r[2] == "w-holder"] == []
    open_gate(holder.output_dir)
    assert holder.thread is not None
    wait_for(lambda: not holder.thread.is_alive(), 120, 0.1, "the holder's run to end")
    done = s.store.get(queued.id)
    assert (done.state, done.worker_id, done.attempt) == (RunState.SUCCEEDED, "w-holder", 1), done.failure
    assert not [e for e in done.events if "w-loser" in e.message and "claimed" not in e.message]


def test_the_holder_removes_a_namesake_left_by_a_worker_that_does_not_hold_the_attempt(
    docker_client, aws_stack, tmp_path, caplog, containers
):
    """The other way round: the worker the store kept finds its attempt's name taken by the
    container of a worker whose claim was written over. That worker holds nothing, so the holder
    removes its container, says so, and runs the attempt."""
    caplog.set_level(logging.INFO, logger="worker_agent")
    s = aws_stack
    queued = queued_run(s, "echo done > out")
    _, kept = claimed_twice(s, queued, "w-loser", "w-holder")
    namesake = left_container(docker_client, s, queued, "w-loser", 1)
    containers.append(namesake)
    holder = executor(s, docker_client, kept, "w-holder", tmp_path)
    holder.run_safely()
    done = s.store.get(queued.id)
    assert (done.state, done.worker_id, done.attempt) == (RunState.SUCCEEDED, "w-holder", 1), done.failure
    assert not exists(docker_client, namesake.id)
    logged = [r for r in removals(caplog) if r[2] == "w-loser"]
    assert len(logged) == 1, removals(caplog)
    run_id, attempt, _, why = logged[0]
    assert (run_id, attempt) == (queued.id, "1")
    assert "worker w-holder holds attempt 1" in why, why


def test_every_removal_at_start_up_is_logged_with_whose_container_and_why(
    docker_client, aws_stack, tmp_path, caplog, containers
):
    """A worker restarted under its own id hands back what its previous life held and removes the
    containers no one holds any more; each removal is one INFO line naming the container's run,
    attempt and worker and why. The container of a run another worker holds stays."""
    caplog.set_level(logging.INFO, logger="worker_agent")
    s = aws_stack
    own = queued_run(s, "sleep 600")
    own_claimed = lifecycle.claim(s.store, own, 0, "w-restarted", 60, time.time())
    lost = queued_run(s, "sleep 600")
    lost_claimed = lifecycle.claim(s.store, lost, 0, "w-gone", 60, time.time())
    lifecycle.requeue(s, lost_claimed, time.time(), "worker w-gone stopped renewing its lease")
    live = queued_run(s, "sleep 600")
    lifecycle.claim(s.store, live, 0, "w-live", 60, time.time())
    left = {
        "own": left_container(docker_client, s, own, "w-restarted", 1),
        "lost": left_container(docker_client, s, lost, "w-gone", 1),
        "live": left_container(docker_client, s, live, "w-live", 1),
    }
    containers.extend(left.values())
    work_dir = tmp_path / "w-restarted"
    executor_config = ExecutorConfig(worker_id="w-restarted", work_dir=work_dir, stack_id=s.settings.stack_id())
    agent = Agent(
        AgentConfig(pool="manual", worker_id="w-restarted", work_dir=work_dir, executor=executor_config),
        AgentPorts(s.store, s.queue, s.objects),
        s.workers,
        docker_client,
        time.time,
    )
    assert agent.recovery.recover_own_runs() == [own_claimed.id]
    assert agent.recovery.sweep_orphans() == 1
    assert [name for name, c in left.items() if exists(docker_client, c.id)] == ["live"]
    logged = {(run_id, attempt, worker): why for run_id, attempt, worker, why in removals(caplog)}
    assert set(logged) == {(own.id, "1", "w-restarted"), (lost.id, "1", "w-gone")}, logged
    assert "previous life" in logged[(own.id, "1", "w-restarted")]
    assert "queued at attempt 1 on no worker" in logged[(lost.id, "1", "w-gone")]
