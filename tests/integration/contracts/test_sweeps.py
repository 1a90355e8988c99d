"""Sweeps on every store: the record (conditional saves, listings), and the service over it:
members released in step with the window, ended members recorded, kill, retry of the failed,
the members listing, idempotent creates."""

import itertools

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.errors import AlreadyExists, BadRequest, ConditionFailed, Conflict, NotFound
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.sweeps import OPEN, PENDING, Sweep, SweepSpec
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle, sweep_advance, sweeps
from runplane.services.runs import submit_run

ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"])
BOB = Principal(user="bob", scopes=["runs:read", "runs:write"])
ADMIN = Principal(user="root", scopes=["admin"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


@pytest.fixture
def ports(stack):
    return make_ports(stack, Clock())


def record(sweep_id="s-1", owner="alice", created_at=1000.0, size=3):
    spec = SweepSpec(run=RunSpec(command="true", queue="parked"), count=size)
    return Sweep(id=sweep_id, owner=owner, spec=spec, queue="parked", created_at=created_at, status=PENDING * size)


def test_a_sweep_record_is_saved_only_over_the_version_it_was_read_at(stack):
    made = stack.sweeps.create(record())
    assert made.version == 1
    assert stack.sweeps.get("s-1") == made
    with pytest.raises(AlreadyExists):
        stack.sweeps.create(record())
    saved = stack.sweeps.save(made.model_copy(update={"status": "o.."}))
    assert (saved.version, stack.sweeps.get("s-1").status) == (2, "o..")
    with pytest.raises(ConditionFailed) as lost:
        stack.sweeps.save(made.model_copy(update={"status": "oo."}))  # read at version 1
    assert lost.value.details["sweep"].status == "o.."
    with pytest.raises(NotFound):
        stack.sweeps.get("s-2")


def test_sweeps_and_runs_never_read_as_each_other(stack, ports):
    stack.sweeps.create(record("s-abc"))
    with pytest.raises(NotFound):
        stack.store.get("s-abc")
    run = submit_run(ports, ALICE, RunSpec(command="true", queue="parked"), None).run
    with pytest.raises(NotFound):
        stack.sweeps.get(run.id)
    assert [r.id for r in stack.store.list(owner="alice").runs] == [run.id]  # no sweep among the runs
    assert stack.store.count("parked", RunState.QUEUED) == 1


def test_an_owners_sweeps_list_newest_first_by_pages_and_unfinished_ones_any_owners(stack):
    for i in range(5):
        stack.sweeps.create(record(f"s-{i}", created_at=1000.0 + i))
    stack.sweeps.create(record("s-bob", owner="bob", created_at=2000.0))
    first, cursor = stack.sweeps.list("alice", limit=3)
    assert [s.id for s in first] == ["s-4", "s-3", "s-2"]
    rest, end = stack.sweeps.list("alice", limit=3, cursor=cursor)
    assert [s.id for s in rest] == ["s-1", "s-0"] and end is None
    assert [s.id for s in stack.sweeps.list("bob")[0]] == ["s-bob"]
    with pytest.raises(BadRequest):
        stack.sweeps.list("bob", cursor=cursor)  # alice's cursor is not bob's listing
    with pytest.raises(BadRequest):
        stack.sweeps.list("alice", cursor="not-a-cursor")
    done = stack.sweeps.get("s-2")
    stack.sweeps.save(done.model_copy(update={"finished_at": 3000.0, "status": "sss"}))
    assert sorted(s.id for s in stack.sweeps.unfinished()) == ["s-0", "s-1", "s-3", "s-4", "s-bob"]


def test_unfinished_sweeps_go_on_after_a_given_one_oldest_first_even_one_that_finished_since(stack):
    for i in range(4):
        stack.sweeps.create(record(f"s-{i}", created_at=1000.0 + i))
    assert [s.id for s in stack.sweeps.unfinished(2)] == ["s-0", "s-1"]
    assert [s.id for s in stack.sweeps.unfinished(2, after=(1001.0, "s-1"))] == ["s-2", "s-3"]
    done = stack.sweeps.get("s-2")
    stack.sweeps.save(done.model_copy(update={"finished_at": 3000.0, "status": "sss"}))
    assert [s.id for s in stack.sweeps.unfinished(5, after=(1002.0, "s-2"))] == ["s-3"]
    assert stack.sweeps.unfinished(5, after=(1003.0, "s-3")) == []


def grid(**extra):
    return SweepSpec(
        name="grid",
        run=RunSpec(command="echo $LR $SEED", queue="parked", env={"BASE": "1"}),
        parameters={"LR": [0.1, 0.01, 0.001], "SEED": [1, 2]},
        **extra,
    )


def finish(stack, run, state=RunState.SUCCEEDED, reason=None):
    """What a worker does with a member: claim it and end it."""
    held = lifecycle.claim(stack.store, run, run.attempt, "w1", 60.0, 1000.0)
    if state == RunState.SUCCEEDED:
        return lifecycle.advance(stack.store, held, RunState.RUNNING, 1001.0, "started")
    return lifecycle.fail(stack.store, held, reason, "it failed", 1001.0)


def end(stack, run, state=RunState.SUCCEEDED, reason=None):
    held = finish(stack, run, state, reason)
    if state == RunState.SUCCEEDED:
        held = lifecycle.advance(stack.store, held, RunState.UPLOADING, 1002.0, "uploading", exit_code=0)
        held = lifecycle.advance(stack.store, held, RunState.SUCCEEDED, 1003.0, "done")
    return held


def test_a_grid_sweep_releases_members_up_to_max_parallel_each_with_its_point(stack, ports):
    made = sweeps.create_sweep(ports, ALICE, grid(max_parallel=2), None).sweep
    assert made.size == 6 and made.status == OPEN * 2 + PENDING * 4
    runs = [stack.store.get(made.member_id(i)) for i in range(2)]
    assert [r.spec.env for r in runs] == [
        {"BASE": "1", "LR": "0.1", "SEED": "1"},
        {"BASE": "1", "LR": "0.1", "SEED": "2"},
    ]
    assert [(r.sweep_id, r.sweep_index, r.spec.name, r.state) for r in runs] == [
        (made.id, 0, "grid[0]", RunState.QUEUED),
        (made.id, 1, "grid[1]", RunState.QUEUED),
    ]
    hints = {d.message.run_id for d in stack.queue.receive("parked", 10, 1, 30)}
    assert hints == {r.id for r in runs}  # only the released members are on the queue
    with pytest.raises(NotFound):
        stack.store.get(made.member_id(2))
    # nothing ended: moving it on releases nothing
    assert sweep_advance.advance(ports, made.id).status == made.status
    end(stack, runs[0])
    moved = sweep_advance.advance(ports, made.id)
    assert moved.status == "so" + OPEN + PENDING * 3
    assert stack.store.get(made.member_id(2)).spec.env == {"BASE": "1", "LR": "0.01", "SEED": "1"}
    progress = sweeps.progress(ports, moved)
    assert (progress.counts, progress.failures, progress.waiting) == ({"succeeded": 1, "queued": 5}, {}, 3)


def test_every_point_of_the_grid_is_one_member(ports):
    made = sweeps.create_sweep(ports, ALICE, grid(count=2), None).sweep
    points = [(s.spec.point(i)["LR"], s.spec.point(i)["SEED"]) for s in [made] for i in range(made.size)]
    assert points[:6] == list(itertools.product(["0.1", "0.01", "0.001"], ["1", "2"]))
    assert points[6:] == points[:6]  # count: the grid again


def test_a_sweep_ends_when_every_member_has_and_counts_failures_by_reason(stack, ports):
    made = sweeps.create_sweep(ports, ALICE, grid(max_parallel=3), None).sweep
    for _ in range(2):
        for index in sweep_advance.advance(ports, made.id).indices(OPEN):
            run = stack.store.get(made.member_id(index))
            if index % 3 == 2:
                end(stack, run, RunState.FAILED, FailureReason.NONZERO_EXIT)
            else:
                end(stack, run)
    done = sweep_advance.advance(ports, made.id)
    assert done.finished_at is not None
    assert done.tally() == ({"succeeded": 4, "failed": 2}, {"nonzero_exit": 2})
    assert done.events[-1].message == "finished: 4 of 6 members succeeded"
    assert made.id not in [s.id for s in stack.sweeps.unfinished()]


def test_kill_ends_the_members_not_released_at_once_and_stops_the_ones_out(stack, ports):
    made = sweeps.create_sweep(ports, ALICE, grid(max_parallel=2), None).sweep
    running = finish(stack, stack.store.get(made.member_id(0)))
    with pytest.raises(NotFound):
        sweeps.kill_sweep(ports, BOB, made.id)  # another user's sweep is none
    killed = sweeps.kill_sweep(ports, ALICE, made.id)
    assert killed.killed and killed.status == OPEN + "g" * 5  # the queued member too, once it ended
    assert stack.store.get(made.member_id(1)).state == RunState.KILLED
    assert stack.store.get(running.id).kill_requested  # its worker stops it
    lifecycle.fail(stack.store, stack.store.get(running.id), FailureReason.KILLED, "killed", 1003.0)
    over = sweep_advance.advance(ports, made.id)
    assert over.finished_at is not None and over.tally() == ({"killed": 6}, {"killed": 6})
    with pytest.raises(Conflict):
        sweeps.kill_sweep(ports, ALICE, made.id)


def test_retry_runs_again_only_the_members_whose_latest_try_did_not_succeed(stack, ports):
    made = sweeps.create_sweep(ports, ALICE, grid(max_parallel=6), None).sweep
    for index in range(6):
        run = stack.store.get(made.member_id(index))
        if index in (1, 4):
            end(stack, run, RunState.FAILED, FailureReason.OUT_OF_MEMORY)
        else:
            end(stack, run)
    assert sweep_advance.advance(ports, made.id).finished_at is not None
    with pytest.raises(NotFound):
        sweeps.retry_sweep(ports, BOB, made.id)
    again, count = sweeps.retry_sweep(ports, ALICE, made.id)
    assert count == 2 and again.finished_at is None
    assert again.status == "soss" + "o" + "s"
    assert [again.member_id(1), again.member_id(4)] == [f"{made.id}-1-2", f"{made.id}-4-2"]
    second = stack.store.get(f"{made.id}-1-2")
    assert (second.state, second.sweep_index, second.spec.env["LR"]) == (RunState.QUEUED, 1, "0.1")
    assert stack.store.get(f"{made.id}-1").state == RunState.FAILED  # the first try is kept
    assert sweeps.retry_sweep(ports, ALICE, made.id)[1] == 0  # nothing failed since
    listed, cursor = sweeps.members(ports, again, None, 10, None)
    assert [r.id for r in listed] == [again.member_id(i) for i in range(6)] and cursor is None
    failed_first = sweeps.members(ports, again, RunState.QUEUED, 1, None)
    assert [r.id for r in failed_first[0]] == [again.member_id(1)] and failed_first[1] == "2"
    with pytest.raises(BadRequest):
        sweeps.members(ports, again, None, 10, "99999999")


def test_max_parallel_can_change_while_the_sweep_goes(stack, ports):
    made = sweeps.create_sweep(ports, ALICE, grid(max_parallel=1), None).sweep
    assert made.status.count(OPEN) == 1
    wider = sweeps.set_max_parallel(ports, ALICE, made.id, 4)
    assert (wider.max_parallel, wider.status.count(OPEN)) == (4, 4)
    narrower = sweeps.set_max_parallel(ports, ALICE, made.id, 1)
    assert narrower.status.count(OPEN) == 4  # out beyond a lowered cap: they go on
    end(stack, stack.store.get(made.member_id(0)))
    assert sweep_advance.advance(ports, made.id).status.count(OPEN) == 3  # none released until under it
    with pytest.raises(NotFound):
        sweeps.set_max_parallel(ports, BOB, made.id, 2)


def test_a_create_with_a_key_is_made_once_and_the_key_is_the_callers(stack, ports):
    first = sweeps.create_sweep(ports, ALICE, grid(), "k1")
    again = sweeps.create_sweep(ports, ALICE, grid(), "k1")
    assert first.created and not again.created and again.sweep.id == first.sweep.id
    with pytest.raises(Conflict):
        sweeps.create_sweep(ports, ALICE, grid(count=2), "k1")
    other = sweeps.create_sweep(ports, BOB, grid(), "k1")
    assert other.created and other.sweep.id != first.sweep.id
    assert [s.id for s in stack.sweeps.list("alice")[0]] == [first.sweep.id]


def test_a_member_run_lost_between_the_release_and_its_create_is_made_by_the_next_pass(stack, ports):
    made = sweeps.create_sweep(ports, ALICE, grid(max_parallel=1), None).sweep
    stored = stack.sweeps.get(made.id)
    # as if a pass had written the release of member 1 and stopped before making its run
    stack.sweeps.save(stored.model_copy(update={"status": "oo" + PENDING * 4, "max_parallel": 2}))
    moved = sweep_advance.advance(ports, made.id)
    assert moved.status == "oo" + PENDING * 4
    assert stack.store.get(made.member_id(1)).sweep_index == 1


def test_a_listing_goes_on_after_any_sweep_it_returned(stack):
    for i in range(4):
        stack.sweeps.create(record(f"s-{i}", created_at=1000.0 + i))
    page, _ = stack.sweeps.list("alice", limit=4)
    rest, _ = stack.sweeps.list("alice", limit=4, cursor=stack.sweeps.cursor_after(page[1]))
    assert [s.id for s in rest] == ["s-1", "s-0"]


def test_a_kill_racing_a_release_ends_the_member_whose_run_was_not_made_yet(stack, ports):
    made = sweeps.create_sweep(ports, ALICE, grid(max_parallel=1), None).sweep
    stored = stack.sweeps.get(made.id)
    # a pass wrote member 1 out and has not made its run when the kill lands
    stack.sweeps.save(stored.model_copy(update={"status": "oo" + PENDING * 4, "max_parallel": 2}))
    killed = sweeps.kill_sweep(ports, ALICE, made.id)
    assert killed.finished_at is not None and killed.tally()[0] == {"killed": 6}
    buried = stack.store.get(made.member_id(1))
    assert buried.state == RunState.KILLED and "before it started" in buried.failure.message
    # the pass that was making it finds the id taken: nothing runs
    assert sweep_advance._release(ports, killed, 1, 2000.0) is False
    assert stack.store.get(made.member_id(1)).state == RunState.KILLED
