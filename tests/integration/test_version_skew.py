"""The version skew window, enforced on the real stores of both clouds: an agent newer than its
control plane is refused when it registers (the agent's own code, its reported version one from the
future), takes no run and touches nothing, and its worker item says why, which the pools view and a
waiting run's explanation show; an agent too old that does not check itself (as the previous
release's agents do not) is flagged by the control plane from the version it reports."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from runplane import __version__
from runplane.api.views import pool_view
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.domain.versions import StackRecord, oldest_agent, series
from runplane.domain.workers import Worker
from runplane.services import skew
from runplane.services.dispatch import dispatch_pool
from runplane.services.overview import pool_figures, why_waiting
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE, wait_for
from tests.integration.contracts.test_future_records import add_to_run
from worker_agent.agent import Agent
from worker_agent.main import pool_or_status
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig
from worker_agent.settings import parse

POOL = "manual"  # max_workers 0: no dispatcher launches workers of its own there


@pytest.fixture(params=["aws_stack", "azure_stack"])
def stack(request):
    return request.getfixturevalue(request.param)


def _agent(stack, work_dir: Path, worker_id: str, version: str) -> Agent:
    config = AgentConfig(pool=POOL, worker_id=worker_id, work_dir=work_dir, version=version)
    ports = AgentPorts(stack.store, stack.queue, stack.objects)
    return Agent(config, ports, stack.workers, docker_client=None, clock=time.time)  # type: ignore[arg-type]


def _pool_view(stack):
    (figures,) = [f for f in pool_figures(stack.ports) if f.pool.name == POOL]
    return pool_view(figures.pool, figures.backlog, figures.workers, figures.record, figures.stack_retention)


def test_the_record_is_never_stepped_back_by_the_functions_of_an_earlier_series(stack):
    """During a deploy the previous series' functions serve beside the next one's for a moment: the
    earlier ones' schedule must not write their version over the later one's record, or the later
    release's agents would be refused (or drain) until the next pass rewrote it."""
    major, minor = series(__version__) or (0, 0)
    later = f"{major}.{minor + 1}.0"
    assert skew.publish(stack.ports, later)
    assert not skew.publish(stack.ports)  # this release's functions leave the later record alone
    assert skew.stack_record(stack.objects).version == later
    # within one series the record follows whichever functions wrote last
    skew.put_stack_record(stack.objects, StackRecord(version=__version__, oldest_agent="", written_at=0.0))
    assert skew.publish(stack.ports, f"{major}.{minor}.9") and skew.publish(stack.ports)
    assert skew.stack_record(stack.objects).version == __version__


def test_an_agent_newer_than_its_stack_is_refused_when_it_registers(stack, tmp_path):
    major, minor = series(__version__) or (0, 0)
    newer = f"{major}.{minor + 1}.0"
    run = submit_run(stack.ports, Principal(user="alice"), RunSpec(command="echo hi", queue=POOL), None).run
    # a control plane from before the check keeps no record: the agent goes on unchecked
    assert _agent(stack, tmp_path / "early", "w-early", newer).reporter.register() is None

    assert skew.publish(stack.ports)
    assert not skew.publish(stack.ports)  # written once, while it says the same
    agent = _agent(stack, tmp_path / "w-newer", "w-newer", newer)
    said = agent.run()

    why = f"agent {newer} is newer than this stack ({__version__}): upgrade the functions first"
    assert said == why and agent.failed
    worker = stack.workers.get("w-newer")
    assert (worker.status, worker.refused, worker.agent_version) == ("offline", why, newer)
    assert agent.slots.claimed == 0 and not (tmp_path / "w-newer").exists()  # no run taken, nothing touched
    assert stack.store.get(run.id).state == RunState.QUEUED
    assert _pool_view(stack).refused_workers == {"w-newer": why}
    assert why_waiting(stack.ports, stack.store.get(run.id)) == (
        f"no worker of pool {POOL} that this stack allows would take it: {why}"
    )
    # the dispatcher's count says the same (the view reads it while it is recent)
    dispatch_pool(stack.ports, stack.ports.pools.get(POOL))
    counted = stack.ports.pool_states.get(POOL)
    assert counted.counted_at is not None and counted.refused == {"w-newer": why}
    assert _pool_view(stack).refused_workers == {"w-newer": why}
    # an agent of this release registers as before
    assert _agent(stack, tmp_path / "w-now", "w-now", __version__).reporter.register() is None


def test_an_agent_too_old_that_does_not_check_itself_is_flagged(stack):
    run = submit_run(stack.ports, Principal(user="alice"), RunSpec(command="echo hi", queue=POOL), None).run
    now = time.time()
    old = Worker(id="w-old", pool=POOL, agent_version="0.0.1", started_at=now, heartbeat_at=now)
    stack.workers.put(old)  # as an agent from before the check registers: idle, one free slot, no word of refusal

    why = f"agent 0.0.1 is older than this stack allows (>= {oldest_agent(__version__)})"
    view = _pool_view(stack)
    assert (view.agent_versions, view.refused_workers) == ({"0.0.1": 1}, {"w-old": why})
    assert why_waiting(stack.ports, run) == f"no worker of pool {POOL} that this stack allows would take it: {why}"

    stack.workers.put(Worker(id="w-new", pool=POOL, agent_version=__version__, started_at=now, heartbeat_at=now))
    view = _pool_view(stack)
    assert (view.agent_versions, view.refused_workers) == ({"0.0.1": 1, __version__: 1}, {"w-old": why})
    assert why_waiting(stack.ports, run) == (
        f"1 free slot(s) on 1 worker(s) of pool {POOL}: it should start within seconds"
    )


def test_runplane_agent_refused_exits_before_it_checks_the_machine(stack, capsys):
    """``runplane-agent`` asks as soon as it knows its pool: a refused agent says why in one line
    and exits 1 (its worker item saying why too) before it reaches Docker, probes the network or
    pulls an image; one the stack allows goes on to them."""
    settings = parse(["--pool", POOL], environ={})
    assert pool_or_status(stack, settings, "w-unchecked") == stack.pools.get(POOL)  # no record: goes on
    skew.put_stack_record(stack.objects, StackRecord(version="9.1.0", oldest_agent="9.0", written_at=time.time()))

    assert pool_or_status(stack, settings, "w-behind") == 1

    why = f"agent {__version__} is older than this stack allows (>= 9.0)"
    assert capsys.readouterr().err == f"runplane-agent: error: {why}\n"
    worker = stack.workers.get("w-behind")
    assert (worker.status, worker.refused, worker.agent_version) == ("offline", why, __version__)
    assert _pool_view(stack).refused_workers == {"w-behind": why}
    # this release's own record (publish leaves a later series' record alone: written here as a
    # rollback of the functions would leave it): the agent may serve
    skew.put_stack_record(
        stack.objects, StackRecord(version=__version__, oldest_agent=oldest_agent(__version__), written_at=time.time())
    )
    assert pool_or_status(stack, settings, "w-now") == stack.pools.get(POOL)
    assert pool_or_status(stack, parse(["--pool", "nowhere"], environ={}), "w-lost") == 2


@pytest.mark.docker
def test_an_agent_leaves_a_run_whose_spec_it_does_not_know_and_takes_the_next(aws_stack, docker_client, tmp_path):
    """A run a later release wrote with a field in its spec (``spec.volumes``) is ahead in line:
    the agent neither takes it ahead of the hinted run nor on its own hint, and runs the next one."""
    alice = Principal(user="alice")
    spec = RunSpec.model_validate({"command": "true", "queue": POOL, "image": TEST_IMAGE, "resources": {"cpus": 1}})
    later = submit_run(aws_stack.ports, alice, spec, None).run
    add_to_run(aws_stack, later.id, lambda data: data["spec"].update(volumes=["db-password"]), queue=POOL)
    plain = submit_run(aws_stack.ports, alice, spec, None).run
    work_dir = tmp_path / "w-skip"
    executor = ExecutorConfig(worker_id="w-skip", work_dir=work_dir, stack_id=aws_stack.settings.stack_id())
    config = AgentConfig(pool=POOL, worker_id="w-skip", work_dir=work_dir, cpuset=(0, 1), executor=executor)
    ports = AgentPorts(aws_stack.store, aws_stack.queue, aws_stack.objects)
    agent = Agent(config, ports, aws_stack.workers, docker_client, time.time)

    deliveries = aws_stack.queue.receive(POOL, 2, 5, visibility_seconds=30)
    assert [d.message.run_id for d in deliveries] == [later.id, plain.id]
    for delivery in reversed(deliveries):  # the plain run's hint first: the later one is ahead of it in line
        agent.intake.take(delivery)

    assert list(agent.slots.active) == [plain.id]
    thread = agent.slots.active[plain.id].thread
    assert thread is not None
    thread.join(60)
    assert aws_stack.store.get(plain.id).state == RunState.SUCCEEDED
    left = aws_stack.store.get(later.id)
    assert (left.state, left.worker_id, agent.slots.claimed) == (RunState.QUEUED, None, 1)
    (again,) = aws_stack.queue.receive(POOL, 1, 10, visibility_seconds=30)  # its hint was handed back
    assert again.message.run_id == later.id


@pytest.mark.docker
def test_a_serving_agent_the_stack_moved_past_drains_and_says_why(aws_stack, docker_client, tmp_path):
    """The functions upgraded past an agent's window while it serves: at its next check it finishes
    the run it holds, takes no other, exits with the reason, and its worker item says why."""
    alice = Principal(user="alice")
    skew.publish(aws_stack.ports)
    spec = RunSpec.model_validate({"command": "sleep 2", "queue": POOL, "image": TEST_IMAGE, "resources": {"cpus": 1}})
    held = submit_run(aws_stack.ports, alice, spec, None).run
    work_dir = tmp_path / "w-drain"
    executor = ExecutorConfig(worker_id="w-drain", work_dir=work_dir, stack_id=aws_stack.settings.stack_id())
    config = AgentConfig(
        pool=POOL, worker_id="w-drain", work_dir=work_dir, cpuset=(0, 1), executor=executor, slots=1,
        heartbeat_seconds=0.2, poll_seconds=1, skew_check_seconds=0.5,
    )  # fmt: skip
    ports = AgentPorts(aws_stack.store, aws_stack.queue, aws_stack.objects)
    agent = Agent(config, ports, aws_stack.workers, docker_client, time.time)
    said: list[str] = []
    thread = threading.Thread(target=lambda: said.append(agent.run()), daemon=True)
    thread.start()
    wait_for(lambda: aws_stack.store.get(held.id).state == RunState.RUNNING, 30, what="the first run running")
    later = submit_run(aws_stack.ports, alice, spec, None).run
    skew.put_stack_record(aws_stack.objects, StackRecord(version="9.1.0", oldest_agent="9.0", written_at=time.time()))

    thread.join(60)
    why = f"agent {__version__} is older than this stack allows (>= 9.0)"
    assert said == [why] and agent.failed
    assert aws_stack.store.get(held.id).state == RunState.SUCCEEDED
    assert aws_stack.store.get(later.id).state == RunState.QUEUED and agent.slots.claimed == 1
    worker = aws_stack.workers.get("w-drain")
    assert (worker.status, worker.refused) == ("offline", why)


def test_a_heartbeat_reads_the_version_window_again_at_most_every_check_period(stack, tmp_path):
    """A serving agent reads the stack record again on a heartbeat once ``skew_check_seconds`` have
    passed since it last did, not before: refused then, it stops taking runs and its item says why."""
    now = [1000.0]
    config = AgentConfig(pool=POOL, worker_id="w-check", work_dir=tmp_path / "w-check", skew_check_seconds=300)
    ports = AgentPorts(stack.store, stack.queue, stack.objects)
    agent = Agent(config, ports, stack.workers, docker_client=None, clock=lambda: now[0])  # type: ignore[arg-type]
    assert skew.publish(stack.ports) and agent.reporter.register() is None
    skew.put_stack_record(stack.objects, StackRecord(version="9.1.0", oldest_agent="9.0", written_at=time.time()))

    now[0] += 299
    agent.reporter.heartbeat()
    assert not agent.slots.stopping.is_set() and stack.workers.get("w-check").refused is None
    now[0] += 1
    agent.reporter.heartbeat()
    why = f"agent {__version__} is older than this stack allows (>= 9.0)"
    assert agent.slots.stopping.is_set() and agent.reporter.refused == why
    worker = stack.workers.get("w-check")
    assert (worker.refused, worker.free_slots) == (why, 0)
