"""Fallback between pools on the real stores (runplane/services/fallback.py): what a submit refuses
of a run's pools, the timer a queued run's time on its pool is carried by, the dispatcher's move to
the next pool (and nothing for a timer that is early, stale or repeated), preemptions counted up to
``fallback_after_preemptions``, the timer started afresh by a re-queue and by a release from
waiting, the waiting reason's words, the reaper's move of a run whose timer was lost, and usage
charged to the pool the run ran on, and an agent of the pool a run left dropping its old hint. On
the local store; the moves by timer and by preemptions on
the AWS (moto) and Azure (Azurite) stores too."""

import dataclasses
import time
from types import SimpleNamespace

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.errors import NotAllowed, RunplaneError
from runplane.domain.messages import DispatchEvent
from runplane.domain.pools import PoolConfig
from runplane.domain.runs import RunSpec, Usage
from runplane.domain.states import RunState
from runplane.domain.sweeps import SweepSpec
from runplane.domain.tenancy import Principal
from runplane.handlers import PoolDispatcher
from runplane.services import dependencies, fallback, lifecycle, overview, reap, runs, sweep_advance, sweeps, usage
from worker_agent.agent import Agent
from worker_agent.run_config import AgentConfig, AgentPorts

ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"])
ADMIN = Principal(user="root", scopes=["admin"])
START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Timers:
    """The stack's real queue, keeping the delayed events it was asked to send (the dispatcher's
    queue holds them out of sight until they are due)."""

    def __init__(self, queue) -> None:
        self.inner = queue
        self.sent: list[tuple[DispatchEvent, int]] = []

    def notify(self, event, delay_seconds=0):
        if event.fallback is not None:
            self.sent.append((event, delay_seconds))
        self.inner.notify(event, delay_seconds=delay_seconds)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def take(self) -> list[tuple[DispatchEvent, int]]:
        sent, self.sent = self.sent, []
        return sent


@pytest.fixture
def stack(request):
    """The local stack; a test parametrized with ``EVERY_STACK`` runs on the AWS (moto) and Azure
    (Azurite) stores too."""
    return request.getfixturevalue(getattr(request, "param", "local_stack"))


EVERY_STACK = pytest.mark.parametrize("stack", ["local_stack", "aws_stack", "azure_stack"], indirect=True)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def timers(stack):
    return Timers(stack.queue)


@pytest.fixture
def ports(stack, clock, timers):
    return dataclasses.replace(make_ports(stack, clock), queue=timers)


def submit(ports, principal=ALICE, **spec):
    spec.setdefault("command", "true")
    return runs.submit_run(ports, principal, RunSpec(**spec), None).run


def finish(store, claimed, now, **changes):
    running = lifecycle.advance(store, claimed, RunState.RUNNING, now, "running")
    uploading = lifecycle.advance(store, running, RunState.UPLOADING, now, "uploading")
    return lifecycle.advance(store, uploading, RunState.SUCCEEDED, now, "done", **changes)


def hints(stack, pool):
    got = stack.queue.receive(pool, 10, 0, 30)  # taken: gone from the queue for this test
    return [d.message.run_id for d in got]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"queue": ["parked", "nowhere"], "fallback_after": 60}, "fallback pool 'nowhere' does not exist"),
        ({"queue": ["parked", "manual", "parked"], "fallback_after": 60}, "pool parked is named twice"),
        ({"queue": ["parked", "manual"]}, "needs fallback_after or fallback_after_preemptions"),
        ({"queue": "parked", "fallback_after": 60}, "need pools to fall back to"),
        ({"queue": "parked", "fallback_after_preemptions": 2}, "need pools to fall back to"),
        ({"queue": ["parked", "manual"], "fallback_after": 60, "resources": {"memory": "3g"}}, "fallback pool manual"),
        (
            {"queue": ["big", "parked"], "fallback_after": 60, "priority": 60, "resources": {"disk": "1g"}},
            "fallback pool parked: priority 60",
        ),
    ],
)
def test_a_submit_refuses_pools_the_run_could_not_fall_back_to(ports, stack, spec, words):
    with pytest.raises(NotAllowed) as refused:
        submit(ports, **spec)
    assert words in refused.value.message
    assert stack.store.list(owner="alice").runs == []


@EVERY_STACK
def test_a_run_not_started_in_time_moves_to_its_next_pool_once(ports, stack, clock, timers):
    run = submit(ports, queue=["parked", "manual", "chaos"], fallback_after="20m")
    assert (run.queue, run.fallback_at) == ("parked", START + 1200)
    [(timer, delay)] = timers.take()
    assert (timer.pool, timer.fallback, timer.due, delay) == ("parked", run.id, START + 1200, 900)  # SQS's most
    assert hints(stack, "parked") == [run.id]

    clock.now += 900  # the timer comes early: sent again with what is left
    assert fallback.on_timer(ports, timer) is None
    [(again, delay)] = timers.take()
    assert (again.due, delay) == (START + 1200, 300)
    assert stack.store.get(run.id).queue == "parked"

    clock.now += 300
    moved = fallback.on_timer(ports, again)
    assert moved is not None and moved.queue == "manual"
    stored = stack.store.get(run.id)
    assert (stored.queue, stored.state, stored.fallback_at) == ("manual", RunState.QUEUED, clock.now + 1200)
    assert stored.events[-1].message == "not started on pool parked within 20m: moved to pool manual"
    assert [r.id for r in stack.store.head("manual", 10)] == [run.id]
    assert stack.store.head("parked", 10) == []
    assert hints(stack, "manual") == [run.id]
    [(next_timer, _)] = timers.take()  # its time on manual, before chaos
    assert (next_timer.pool, next_timer.due) == ("manual", clock.now + 1200)

    # the same timer again (at-least-once) moves nothing: the run is no longer on parked
    assert fallback.on_timer(ports, again) is None
    assert stack.store.get(run.id).events == stored.events


def test_a_timer_of_a_run_that_started_or_was_queued_again_moves_nothing(ports, stack, clock, timers):
    run = submit(ports, queue=["parked", "manual"], fallback_after=60)
    [(timer, _)] = timers.take()
    claimed = lifecycle.claim(stack.store, run, 0, "w1", 60, clock())
    clock.now += 61
    assert fallback.on_timer(ports, timer) is None  # it started
    assert stack.store.get(run.id).queue == "parked"
    # handed back: its time on parked starts again, and the old timer is stale
    lifecycle.requeue(ports, claimed, clock(), "its worker stopped", charge=False)
    requeued = stack.store.get(run.id)
    assert requeued.fallback_at == clock.now + 60
    [(fresh, _)] = timers.take()
    assert fresh.due == clock.now + 60
    clock.now += 60
    assert fallback.on_timer(ports, timer) is None
    assert fallback.on_timer(ports, fresh).queue == "manual"


def test_the_dispatcher_moves_a_run_whose_timer_is_due(ports, stack, clock, timers):
    run = submit(ports, queue=["parked", "manual"], fallback_after=5)
    [(timer, _)] = timers.take()
    clock.now += 5
    handle = PoolDispatcher(ports).record_handler()
    assert handle(SimpleNamespace(body=timer.model_dump_json())) is None
    stored = stack.store.get(run.id)
    assert stored.queue == "manual" and stored.fallback_at is None  # the last pool: no timer
    assert "moved to pool manual" in stored.events[-1].message


@EVERY_STACK
def test_preemptions_on_a_pool_move_the_run_on_at_the_nth(ports, stack, clock, timers):
    run = submit(ports, queue=["parked", "manual"], fallback_after_preemptions=2)
    assert run.fallback_at is None and timers.take() == []

    def preempt(run, preempted=True):
        claimed = lifecycle.claim(stack.store, run, run.attempt, "w1", 60, clock(), preemptible=True)
        return lifecycle.requeue(ports, claimed, clock(), "worker preempted", charge=False, preempted=preempted)

    run = preempt(run, preempted=False)  # handed back, not preempted: not counted
    assert (run.queue, run.preemptions) == ("parked", 0)
    run = preempt(run)
    assert (run.queue, run.preemptions) == ("parked", 1)
    hints(stack, "parked")
    run = preempt(run)
    assert (run.queue, run.preemptions, run.state) == ("manual", 0, RunState.QUEUED)
    moved = "re-queued: worker preempted; preempted 2 times on pool parked: moved to pool manual"
    assert run.events[-1].message == moved
    assert [r.id for r in stack.store.head("manual", 10)] == [run.id]
    assert hints(stack, "manual") == [run.id] and hints(stack, "parked") == []
    run = preempt(run)  # the last pool: it stays, however often
    assert run.queue == "manual"


def test_a_run_waiting_for_another_starts_its_time_when_released(ports, stack, clock, timers):
    upstream = submit(ports, queue="parked")
    run = submit(ports, queue=["parked", "manual"], fallback_after=30, after=[upstream.id])
    assert run.waiting_on and run.fallback_at is None and timers.take() == []
    finish(stack.store, lifecycle.claim(stack.store, upstream, 0, "w1", 60, clock()), clock())
    clock.now += 100
    released = dependencies.resolve(ports, run.id)
    assert not released.waiting_on and released.fallback_at == clock.now + 30
    [(timer, delay)] = timers.take()
    assert (timer.due, delay) == (clock.now + 30, 30)


def test_the_waiting_reason_says_when_it_falls_back(ports, stack, clock):
    run = submit(ports, queue=["parked", "manual"], fallback_after="20m")
    clock.now += 480
    why = overview.why_waiting(ports, stack.store.get(run.id))
    assert why.endswith("; falls back to pool manual at 08:20:00 UTC (in 12m)"), why
    assert why.startswith("pool parked has max_workers=0")


def test_the_reaper_moves_a_run_whose_timer_was_lost(ports, stack, clock):
    run = submit(ports, queue=["parked", "manual"], fallback_after=60)
    clock.now += 60
    assert reap.reap(ports).fell_back == []  # its timer, due now, moves it: the reaper gives it time
    clock.now += reap.TIMER_GRACE
    assert reap.reap(ports).fell_back == [run.id]
    stored = stack.store.get(run.id)
    assert stored.queue == "manual"
    expected = "not started on pool parked within 1m: moved to pool manual (by the reaper: its timer did not come)"
    assert stored.events[-1].message == expected


def test_a_moved_run_is_charged_to_the_pool_it_ran_on(ports, stack, clock):
    run = submit(ports, queue=["parked", "manual"], fallback_after=10)
    clock.now += 10
    assert fallback.fall_back(ports, stack.store.get(run.id), clock()).queue == "manual"
    claimed = lifecycle.claim(stack.store, stack.store.get(run.id), 0, "w-manual", 60, clock())
    finish(stack.store, claimed, clock(), usage=Usage(cpu_seconds=50.0, cost=0.1))
    report = usage.usage_report(ports, ADMIN, user="alice", since=START - 1, by="pool")
    assert [(row.key, row.runs, row.cpu_seconds) for row in report.rows] == [("manual", 1, 50.0)]
    assert usage.usage_report(ports, ADMIN, pool="parked", since=START - 1).total.runs == 0
    assert stack.store.list(queue="manual", state=RunState.SUCCEEDED).runs[0].id == run.id


def test_an_agent_of_the_pool_a_run_left_drops_its_old_hint(ports, stack, clock, tmp_path):
    run = submit(ports, queue=["parked", "manual"], fallback_after=10)
    clock.now += 10
    assert fallback.fall_back(ports, stack.store.get(run.id), clock()).queue == "manual"
    config = AgentConfig(pool="parked", worker_id="w-parked", work_dir=tmp_path / "w-parked")
    agent_ports = AgentPorts(stack.store, stack.queue, stack.objects)
    agent = Agent(config, agent_ports, stack.workers, docker_client=None, clock=time.time)  # never reaches Docker
    (old,) = stack.queue.receive("parked", 10, 0, 30)
    assert old.message.run_id == run.id
    agent.intake.take(old)
    assert agent.slots.active == {} and agent.slots.claimed == 0
    stored = stack.store.get(run.id)
    assert (stored.state, stored.queue, stored.worker_id) == (RunState.QUEUED, "manual", None)
    assert stack.queue.receive("parked", 10, 0, 0) == []  # the stale hint is gone, not handed back


def test_a_pool_of_the_chain_no_longer_configured_is_passed_over(ports, stack, clock):
    run = submit(ports, queue=["parked", "manual", "chaos"], fallback_after=10)
    clock.now += 10
    without = PoolConfig(pools=[p for p in ports.pools.pools if p.name != "manual"])
    moved = fallback.fall_back(dataclasses.replace(ports, pools=without), stack.store.get(run.id), clock())
    assert moved is not None and (moved.queue, moved.fallback_at) == ("chaos", None)
    assert moved.events[-1].message == "not started on pool parked within 10s: moved to pool chaos"


def test_a_preemptible_worker_gone_silent_counts_as_a_preemption(ports, stack, clock):
    run = submit(ports, queue=["parked", "manual"], fallback_after_preemptions=1)
    lifecycle.claim(stack.store, run, 0, "w-spot", 60, clock(), preemptible=True)
    other = submit(ports, queue=["parked", "manual"], fallback_after_preemptions=1)
    lifecycle.claim(stack.store, other, 0, "w-steady", 60, clock())
    clock.now += 61  # both leases lapse
    report = reap.reap(ports)
    assert sorted(report.requeued) == sorted([run.id, other.id])
    spot, steady = stack.store.get(run.id), stack.store.get(other.id)
    assert (spot.queue, spot.preemptions) == ("manual", 0)
    assert spot.events[-1].message.endswith("preempted 1 time on pool parked: moved to pool manual")
    assert (steady.queue, steady.preemptions) == ("parked", 0)  # a worker lost, not preempted


@pytest.mark.parametrize("by", ["control plane", "agent"])
def test_a_run_moved_after_preemptions_goes_in_its_new_pools_line_behind_those_waiting(ports, stack, clock, by):
    bob, carol = ALICE.model_copy(update={"user": "bob"}), ALICE.model_copy(update={"user": "carol"})
    bobs = [submit(ports, principal=bob, queue="manual") for _ in range(6)]
    for queued in bobs[:3]:  # bob's lead in manual's line is spent on these
        lifecycle.claim(stack.store, stack.store.get(queued.id), 0, "w-manual", 600, clock())
    clock.now += 1
    carols = submit(ports, principal=carol, queue="manual")
    clock.now += 1
    run = submit(ports, queue=["parked", "manual"], fallback_after_preemptions=1)
    claimed = lifecycle.claim(stack.store, run, 0, "w-spot", 60, clock(), preemptible=True)
    writer = ports if by == "control plane" else AgentPorts(stack.store, stack.queue, stack.objects)
    moved = lifecycle.requeue(writer, claimed, clock(), "preempted", charge=False, preempted=True)
    assert moved.queue == "manual"
    line = [r.id for r in stack.store.head("manual", 10)]
    assert line.index(carols.id) < line.index(run.id)  # not ahead of those already waiting there
    assert line[0] == bobs[3].id


def test_a_preemption_moves_a_run_past_a_pool_no_longer_configured(ports, stack, clock):
    reap.reap(ports)  # the reaper has seen every pool configured
    without = dataclasses.replace(ports, pools=PoolConfig(pools=[p for p in ports.pools.pools if p.name != "manual"]))
    run = submit(ports, queue=["parked", "manual", "chaos"], fallback_after_preemptions=1)
    claimed = lifecycle.claim(stack.store, run, 0, "w-spot", 60, clock(), preemptible=True)
    moved = lifecycle.requeue(without, claimed, clock(), "preempted", charge=False, preempted=True)
    assert (moved.queue, moved.state) == ("chaos", RunState.QUEUED)
    # an agent does not read the pools file: it moves the run onto manual; the reaper moves it on
    other = submit(ports, queue=["parked", "manual", "chaos"], fallback_after_preemptions=1)
    claimed = lifecycle.claim(stack.store, other, 0, "w-spot", 60, clock(), preemptible=True)
    agent = AgentPorts(stack.store, stack.queue, stack.objects)
    assert lifecycle.requeue(agent, claimed, clock(), "preempted", charge=False, preempted=True).queue == "manual"
    assert reap.reap(without).fell_back == [other.id]
    stored = stack.store.get(other.id)
    assert (stored.queue, stored.state) == ("chaos", RunState.QUEUED)
    assert stored.events[-1].message == "pool manual is no longer configured: moved to pool chaos"


class Refusing:
    """The stack's queue, refusing every hint."""

    def __init__(self, queue) -> None:
        self.inner = queue

    def send(self, pool, message):
        raise RunplaneError("queue unavailable")

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_preemption_move_whose_hint_fails_is_still_a_move(ports, stack, clock):
    run = submit(ports, queue=["parked", "manual"], fallback_after_preemptions=1)
    claimed = lifecycle.claim(stack.store, run, 0, "w-spot", 60, clock(), preemptible=True)
    refusing = dataclasses.replace(ports, queue=Refusing(ports.queue))
    moved = lifecycle.requeue(refusing, claimed, clock(), "preempted", charge=False, preempted=True)
    assert (moved.queue, moved.state) == ("manual", RunState.QUEUED)
    clock.now += ports.settings.rehint_seconds
    assert reap.reap(ports).rehinted == [run.id]  # the reaper hints it on its new pool


@EVERY_STACK
def test_the_reaper_moves_every_run_whose_timer_was_lost_over_passes(ports, stack, clock, monkeypatch):
    monkeypatch.setattr(reap, "REHINT_WINDOW", 2)
    monkeypatch.setattr(reap, "FALLBACK_SCAN", 3)
    queued = [submit(ports, queue=["parked", "manual"], fallback_after=60) for _ in range(10)]
    clock.now += 60 + reap.TIMER_GRACE
    moved: list[str] = []
    for _ in range(4):  # 10 runs: 2 from the head and at least 3 looked at beyond it a pass
        fell_back = reap.reap(ports).fell_back
        assert len(fell_back) <= 2 + 3
        moved += fell_back
    assert sorted(moved) == sorted(r.id for r in queued)
    assert {stack.store.get(r.id).queue for r in queued} == {"manual"}


def _with(ports, **manual):
    """``ports`` whose pool manual is changed as given."""
    pools = [p.model_copy(update=manual) if p.name == "manual" else p for p in ports.pools.pools]
    return dataclasses.replace(ports, pools=PoolConfig(pools=pools))


@pytest.mark.parametrize(
    ("manual", "spec", "words"),
    [
        ({}, {"fallback": ["manual"], "fallback_after": 60}, "must name the first pool in queue"),
        ({"default_image": "runplane/other:1"}, {}, "different default images"),
        ({"max_time": 3600}, {}, "cannot take the time pool parked gives a run that asks none"),
        ({"memory": 512 * 1024**2}, {}, "give resources.memory"),
    ],
)
def test_a_submit_refuses_a_chain_the_first_pools_defaults_would_break(ports, stack, manual, spec, words):
    spec = spec or {"queue": ["parked", "manual"], "fallback_after": 60}
    with pytest.raises(NotAllowed) as refused:
        submit(_with(ports, **manual), **spec)
    assert words in refused.value.message
    assert stack.store.list(owner="alice").runs == []


def test_a_chain_whose_defaults_differ_is_taken_with_what_they_left_out_given(ports, stack):
    other = _with(ports, default_image="runplane/other:1", max_time=3600, memory=512 * 1024**2)
    given = {"image": "runplane/test-busybox:1", "resources": {"time": "30m", "memory": "256m"}}
    run = submit(other, queue=["parked", "manual"], fallback_after=60, **given)
    assert (run.spec.image, run.spec.resources.time, run.spec.fallback) == ("runplane/test-busybox:1", 1800, ["manual"])


def test_a_sweep_with_fallback_is_sized_from_every_pool_of_its_chain(ports, stack, clock):
    def sized(queue, **rule):
        spec = SweepSpec(run=RunSpec(command="true", queue=queue, **rule), parameters={"N": list(range(20))})
        sweep = sweeps.create_sweep(ports, ALICE, spec, None).sweep
        return sweep_advance.window(ports, sweep, clock())

    assert sized("parked") == 2 * 1  # no workers ever: one slot's worth
    # default's two workers (of one slot each) count, as its members may run there
    assert sized(["parked", "default"], fallback_after=60) == 2 * 2
