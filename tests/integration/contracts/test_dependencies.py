"""Runs that wait for runs, on every store: a run naming an unfinished run (a ``run:`` input,
``after``) or a sweep (``after_sweep``) is queued out of its pool's line, unhinted, and listed as
waiting; it goes when all it waits for succeeded and ends ``dependency_failed`` when one did not;
the ends that release or fail it reach the dispatcher; a sweep can wait too."""

import base64
import json
from types import SimpleNamespace

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.errors import ConditionFailed, Conflict, NotFound, Unschedulable
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent
from runplane.domain.runs import MAX_DEPENDENTS, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.sweeps import PENDING, SweepSpec
from runplane.handlers import PoolDispatcher
from runplane.services import dependencies, lifecycle, runs, sweep_advance, sweeps
from tests.integration.contracts.test_sweeps import ALICE, BOB, Clock


@pytest.fixture
def ports(stack):
    return make_ports(stack, Clock())


@pytest.fixture
def events(request, stack):
    """The dispatcher events sent so far that tell of an end (read off the events queue)."""
    if request.node.callspec.params["stack"] == "local-sqlite":

        def read():
            got = stack.queue.receive_events(32, 0, 30)
            return _told([DispatchEvent.model_validate_json(d.body) for d in got])

    elif request.node.callspec.params["stack"] == "aws-moto":
        from runplane.adapters.aws.sqs import events_queue_name

        url = stack.queue._url(events_queue_name(stack.settings.prefix))

        def read():
            got = stack.queue.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            return _told([DispatchEvent.model_validate_json(m["Body"]) for m in got.get("Messages", [])])

    elif request.node.callspec.params["stack"] == "local-sqlite":

        def read():
            return _told([DispatchEvent.model_validate_json(e.body) for e in stack.queue.receive_events(32, 1, 30)])

    else:
        from runplane.adapters.azure.queues import events_queue_name

        def read():
            queue = stack.queue.client.get_queue_client(events_queue_name(stack.settings.prefix))
            bodies = [m.content for m in queue.receive_messages(max_messages=32)]
            return _told([DispatchEvent.model_validate_json(_text(b)) for b in bodies])

    read()  # what came before this test
    return read


def _told(events):
    """Those that tell of an end something waits for."""
    return [e for e in events if e.upstream is not None]


def _text(body: str) -> str:
    try:
        return base64.b64decode(body, validate=True).decode()
    except ValueError:
        return body


def submit(stack, ports, who=ALICE, **spec):
    spec.setdefault("command", "true")
    spec.setdefault("queue", "parked")
    return runs.submit_run(ports, who, RunSpec(**spec), None).run


def hinted(stack):
    return {d.message.run_id for d in stack.queue.receive("parked", 10, 1, 30)}


def end(stack, run, state=RunState.SUCCEEDED, reason=None):
    """What a worker does: claim the run and end it; the end tells what waits for it."""
    held = lifecycle.claim(stack.store, run, run.attempt, "w1", 60.0, 1000.0)
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, 1001.0, "started")
    if state == RunState.SUCCEEDED:
        held = lifecycle.advance(stack.store, held, RunState.UPLOADING, 1002.0, "uploading", exit_code=0)
        done = lifecycle.advance(stack.store, held, RunState.SUCCEEDED, 1003.0, "done")
    else:
        done = lifecycle.fail(stack.store, held, reason, "exit 1", 1003.0)
    lifecycle.ended(stack.queue, done)
    return done


def test_a_run_naming_an_unfinished_run_waits_out_of_the_line_and_goes_when_it_succeeds(stack, ports, events):
    first = submit(stack, ports)
    assert hinted(stack) == {first.id}
    second = submit(stack, ports, inputs={"data": f"run:{first.id}/out"})
    assert (second.state, second.waiting_on) == (RunState.QUEUED, [first.id])
    assert second.waiting_reason == f"waiting for run {first.id} (queued)"
    assert hinted(stack) == set()  # no hint: no worker may take it
    assert [r.id for r in stack.store.head("parked", 10)] == [first.id]
    assert stack.store.count("parked", RunState.QUEUED) == 1  # nobody's backlog
    assert [r.id for r in stack.store.waiting("parked").runs] == [second.id]
    assert stack.store.get(first.id).dependents == [second.id]
    assert [r.id for r in stack.store.list(owner="alice", state=RunState.QUEUED).runs] == [second.id, first.id]

    done = end(stack, stack.store.get(first.id))
    assert [(e.upstream, e.pool) for e in events()] == [(first.id, "parked")]
    PoolDispatcher(stack.ports).upstream(done.id)  # what the dispatcher does with that event
    released = stack.store.get(second.id)
    assert (released.state, released.waiting_on) == (RunState.QUEUED, [])
    assert released.waiting_reason == "waiting for a worker of pool parked"
    assert released.events[-1].message == "everything it waited for succeeded: released to pool parked"
    assert hinted(stack) == {second.id}
    assert [r.id for r in stack.store.head("parked", 10)] == [second.id]
    assert stack.store.waiting("parked").runs == []
    # a resolve racing that one, with the run as it read it before, leaves it alone: one release
    assert dependencies.resolve(ports, second).events == released.events
    assert hinted(stack) == set()


def test_a_run_waiting_for_a_failed_run_ends_dependency_failed_and_so_does_what_waits_for_it(stack, ports, events):
    first = submit(stack, ports)
    second = submit(stack, ports, after=[first.id])
    third = submit(stack, ports, after=[second.id])
    assert third.waiting_reason == f"waiting for run {second.id} (waiting)"
    end(stack, stack.store.get(first.id), RunState.FAILED, FailureReason.NONZERO_EXIT)
    dispatcher = PoolDispatcher(stack.ports)
    for event in events():
        dispatcher.upstream(event.upstream)
    failed = stack.store.get(second.id)
    assert (failed.state, failed.failure.reason) == (RunState.FAILED, FailureReason.DEPENDENCY_FAILED)
    assert failed.failure.message.startswith(f"run {first.id} ended failed (nonzero_exit: exit 1)")
    assert [e.upstream for e in events()] == [second.id]  # its own end reaches the dispatcher in turn
    dispatcher.upstream(second.id)
    chained = stack.store.get(third.id)
    assert chained.failure.reason == FailureReason.DEPENDENCY_FAILED and second.id in chained.failure.message
    assert stack.store.waiting("parked").runs == [] and hinted(stack) == {first.id}


def test_after_waits_for_every_run_it_names_and_the_reason_follows_them(stack, ports):
    one, two = submit(stack, ports), submit(stack, ports)
    late = submit(stack, ports, after=[one.id, two.id])
    assert late.waiting_reason == f"waiting for run {one.id} (queued) and 1 more"
    end(stack, stack.store.get(one.id))
    running = lifecycle.claim(stack.store, stack.store.get(two.id), 0, "w2", 60.0, 1000.0)
    assert dependencies.describe(ports, stack.store.get(late.id)) == f"waiting for run {two.id} (preparing)"
    still = dependencies.resolve(ports, late.id)
    assert (still.waiting_on, still.waiting_reason) == ([two.id], f"waiting for run {two.id} (preparing)")
    held = lifecycle.advance(stack.store, running, RunState.RUNNING, 1001.0, "started")
    held = lifecycle.advance(stack.store, held, RunState.UPLOADING, 1002.0, "uploading", exit_code=0)
    lifecycle.advance(stack.store, held, RunState.SUCCEEDED, 1003.0, "done")
    assert dependencies.resolve(ports, late.id).waiting_on == []


def test_what_a_run_may_wait_for_is_checked_at_submit(stack, ports):
    theirs = submit(stack, ports, BOB)
    with pytest.raises(NotFound, match="after: run"):
        submit(stack, ports, after=[theirs.id])  # another user's run is none
    with pytest.raises(NotFound, match="input data: run"):
        submit(stack, ports, inputs={"data": f"run:{theirs.id}"})
    with pytest.raises(NotFound):
        submit(stack, ports, after=["r-nosuchrun"])
    with pytest.raises(NotFound, match="after_sweep"):
        submit(stack, ports, after_sweep="s-nosuchsweep")
    failed = end(stack, submit(stack, ports), RunState.FAILED, FailureReason.NONZERO_EXIT)
    with pytest.raises(Unschedulable, match="could never start"):
        submit(stack, ports, after=[failed.id])
    with pytest.raises(Unschedulable, match="no outputs to use"):
        submit(stack, ports, inputs={"data": f"run:{failed.id}"})
    hinted(stack)
    done = end(stack, submit(stack, ports))
    hinted(stack)
    ready = submit(stack, ports, after=[done.id])  # it succeeded: nothing to wait for
    assert ready.waiting_on == [] and hinted(stack) == {ready.id}
    assert stack.store.get(done.id).dependents == []


def test_no_worker_can_claim_a_waiting_run_even_with_a_hint(stack, ports):
    up = submit(stack, ports)
    waiting = submit(stack, ports, after=[up.id])
    with pytest.raises(ConditionFailed):
        lifecycle.claim(stack.store, waiting, 0, "w1", 60.0, 1000.0)
    assert stack.store.get(waiting.id).state == RunState.QUEUED


def test_a_submit_retried_with_its_key_gets_its_waiting_run_whatever_became_of_what_it_waits_for(stack, ports):
    up = submit(stack, ports)
    spec = RunSpec(command="true", queue="parked", after=[up.id])

    def again():
        return runs.submit_run(ports, ALICE, spec, "k1")

    first = again()
    assert first.created and first.run.waiting_on == [up.id]
    end(stack, stack.store.get(up.id), RunState.FAILED, FailureReason.NONZERO_EXIT)
    replayed = again()  # not a 422 for the failed run: the answer is the run, resolved
    assert not replayed.created and replayed.run.id == first.run.id
    assert replayed.run.failure.reason == FailureReason.DEPENDENCY_FAILED


def test_follow_adds_a_dependent_once_while_the_run_goes(stack, ports, monkeypatch):
    up = submit(stack, ports)
    assert stack.store.follow(up.id, "r-a").dependents == ["r-a"]
    assert stack.store.follow(up.id, "r-a").dependents == ["r-a"]  # once
    assert stack.store.follow(up.id, "sweep:s-b").dependents == ["r-a", "sweep:s-b"]
    held = lifecycle.claim(stack.store, up, 0, "w1", 60.0, 1000.0)  # a worker's write keeps them
    assert held.dependents == ["r-a", "sweep:s-b"]
    import runplane.adapters.aws.runs as dynamo
    import runplane.adapters.azure.runs as tables
    import runplane.adapters.local.runs as sqlite

    monkeypatch.setattr(dynamo, "MAX_DEPENDENTS", 2)
    monkeypatch.setattr(tables, "MAX_DEPENDENTS", 2)
    monkeypatch.setattr(sqlite, "MAX_DEPENDENTS", 2)
    with pytest.raises(Conflict):
        stack.store.follow(up.id, "r-c")
    lifecycle.fail(stack.store, held, FailureReason.NONZERO_EXIT, "exit 1", 1001.0)
    with pytest.raises(ConditionFailed):
        stack.store.follow(up.id, "r-d")
    with pytest.raises(NotFound):
        stack.store.follow("r-nosuchrun", "r-d")


def test_the_real_cap_on_what_waits_for_a_run(stack, ports):
    """At the real MAX_DEPENDENTS (docs/workflows.md: 1,000) of the longest kind (sweeps), the
    record still fits the store and takes a worker's writes; one more is a 409 at submit and in
    the store. The first 999 are written at once: the cap is what is tested, not 999 submits."""
    assert MAX_DEPENDENTS == 1000
    up = submit(stack, ports)
    many = [f"sweep:s-{i:024x}" for i in range(MAX_DEPENDENTS - 1)]
    stack.store.update(up, Expect(states=frozenset({RunState.QUEUED})), {"dependents": many})
    last = submit(stack, ports, after=[up.id])
    assert stack.store.get(up.id).dependents == [*many, last.id]
    with pytest.raises(Conflict, match=f"after: 1000 runs and sweeps already wait for run {up.id}"):
        submit(stack, ports, after=[up.id])
    with pytest.raises(Conflict):
        stack.store.follow(up.id, "r-" + "f" * 24)
    held = lifecycle.claim(stack.store, stack.store.get(up.id), 0, "w1", 60.0, 1000.0)
    assert len(held.dependents) == MAX_DEPENDENTS


def test_the_real_cap_on_what_waits_for_a_sweep(stack, ports):
    """The same cap on a sweep: at 1,000 (the largest sweep record) it is still saved; one more
    is a 409 at submit."""
    made = sweeps.create_sweep(ports, ALICE, grid(), None).sweep
    many = [f"sweep:s-{i:024x}" for i in range(MAX_DEPENDENTS - 1)]
    stack.sweeps.save(stack.sweeps.get(made.id).model_copy(update={"dependents": many}))
    last = submit(stack, ports, after_sweep=made.id)
    assert stack.sweeps.get(made.id).dependents == [*many, last.id]
    with pytest.raises(Conflict, match=f"after_sweep: 1000 runs and sweeps already wait for sweep {made.id}"):
        submit(stack, ports, after_sweep=made.id)
    # one that got past the check at submit (a race) is not added either
    dependencies.follow(ports, "r-" + "f" * 24, [f"sweep:{made.id}"])
    assert sweep_advance.advance(ports, made.id).dependents == [*many, last.id]  # and takes its own writes


def test_a_waiting_run_can_be_killed_and_the_kill_of_all_reaches_it(stack, ports):
    up = submit(stack, ports)
    waiting = submit(stack, ports, after=[up.id])
    killed = runs.kill_run(ports, ALICE, waiting.id)
    assert killed.state == RunState.KILLED and stack.store.waiting("parked").runs == []
    again = submit(stack, ports, after=[up.id])
    stopped = runs.stop_all(ports, "the stack stopped")
    assert again.id in {r.id for r in stopped} and stack.store.get(again.id).state == RunState.KILLED


def test_the_schedule_resolves_waiting_runs_whose_event_was_lost(stack, ports):
    up = submit(stack, ports)
    waiting = submit(stack, ports, after=[up.id])
    held = lifecycle.claim(stack.store, stack.store.get(up.id), 0, "w1", 60.0, 1000.0)
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, 1001.0, "started")
    held = lifecycle.advance(stack.store, held, RunState.UPLOADING, 1002.0, "uploading", exit_code=0)
    lifecycle.advance(stack.store, held, RunState.SUCCEEDED, 1003.0, "done")  # no event sent
    assert PoolDispatcher(stack.ports).schedule()["waiting"] == {"parked": 1}
    assert stack.store.get(waiting.id).waiting_on == []


def grid(**run):
    return SweepSpec(run=RunSpec(command="true", queue="parked", **run), parameters={"X": [1, 2, 3]})


def test_a_sweep_waits_for_a_run_before_it_releases_any_member(stack, ports, events):
    up = submit(stack, ports)
    made = sweeps.create_sweep(ports, ALICE, grid(after=[up.id]), None).sweep
    assert made.status == PENDING * 3 and made.waiting_on == [up.id]
    assert stack.store.get(up.id).dependents == [f"sweep:{made.id}"]
    assert sweeps.progress(ports, made).waiting_for == f"waiting for run {up.id} (queued)"
    end(stack, stack.store.get(up.id))
    [event] = events()
    PoolDispatcher(stack.ports).upstream(event.upstream)
    moved = stack.sweeps.get(made.id)
    assert moved.waiting_on == [] and moved.status == "oo."  # in step with the window, as ever
    assert stack.store.get(moved.member_id(0)).waiting_on == []  # members go at once


def test_a_sweep_waiting_for_a_failed_run_ends_every_member_dependency_failed(stack, ports):
    up = submit(stack, ports)
    made = sweeps.create_sweep(ports, ALICE, grid(after=[up.id]), None).sweep
    end(stack, stack.store.get(up.id), RunState.FAILED, FailureReason.NONZERO_EXIT)
    done = sweep_advance.advance(ports, made.id)
    assert done.finished_at is not None
    assert done.tally() == ({"failed": 3}, {"dependency_failed": 3})
    assert up.id in done.events[-2].message
    again, count = sweeps.retry_sweep(ports, ALICE, made.id)  # they would only fail again
    assert count == 0 and again.tally() == ({"failed": 3}, {"dependency_failed": 3})


def run_through(stack, ports, sweep_id, failing=()):
    """Run every member of a sweep as it is released (those in ``failing`` run out of memory)."""
    while True:
        sweep = sweep_advance.advance(ports, sweep_id)
        if sweep.finished_at is not None:
            return sweep
        for index in sweep.indices("o"):
            if index in failing:
                end(stack, stack.store.get(sweep.member_id(index)), RunState.FAILED, FailureReason.OUT_OF_MEMORY)
            else:
                end(stack, stack.store.get(sweep.member_id(index)))


def test_a_run_waits_for_a_whole_sweep(stack, ports, events):
    made = sweeps.create_sweep(ports, ALICE, grid(), None).sweep
    fan_in = submit(stack, ports, after_sweep=made.id)
    assert fan_in.waiting_on == [f"sweep:{made.id}"]
    assert fan_in.waiting_reason == f"waiting for sweep {made.id} (0 of 3 members done)"
    assert stack.sweeps.get(made.id).dependents == [fan_in.id]
    with pytest.raises(NotFound):
        submit(stack, ports, BOB, after_sweep=made.id)
    events()
    finished = run_through(stack, ports, made.id)
    assert finished.finished_at is not None
    told = events()
    assert [e.upstream for e in told] == [f"sweep:{made.id}"]
    PoolDispatcher(stack.ports).upstream(told[0].upstream)
    assert stack.store.get(fan_in.id).waiting_on == []
    # a sweep that finished with a failure: what waits for it fails
    other = sweeps.create_sweep(ports, ALICE, grid(), None).sweep
    late = submit(stack, ports, after_sweep=other.id)
    run_through(stack, ports, other.id, failing={1})
    failed = dependencies.resolve(ports, late.id)
    assert failed.failure.reason == FailureReason.DEPENDENCY_FAILED
    assert failed.failure.message.startswith(f"sweep {other.id} finished with 1 of 3 members not succeeded")


def test_a_dispatcher_event_naming_an_upstream_is_read_and_resolved(stack, ports):
    up = submit(stack, ports)
    waiting = submit(stack, ports, after=[up.id])
    done = end(stack, stack.store.get(up.id))
    body = json.dumps({"pool": "nosuchpool", "reason": "run ended", "upstream": done.id})
    assert PoolDispatcher(stack.ports).record_handler()(SimpleNamespace(body=body)) is None
    assert stack.store.get(waiting.id).waiting_on == []
