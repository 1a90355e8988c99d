"""RunStore.move contract: a move files the run under another pool (its listings by queue and state,
its line, its count, the purge index) in one step as every reader sees it, keeps the changes and the
event written with it, and lands the writes of copies from before it on the moved run."""

import threading

import pytest

from runplane.domain.errors import ConditionFailed, NotFound
from runplane.domain.expect import Expect
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState
from runplane.services import lifecycle

QUEUED = Expect(states=frozenset({RunState.QUEUED}))
SPOT, ONDEMAND = "spot", "ondemand"


def make_run(i=0, prefix="r-move", **fields):
    """A run queued on SPOT, ``<prefix>-<i>``."""
    return Run(
        id=f"{prefix}-{i}",
        owner="alice",
        queue=SPOT,
        spec=RunSpec(command="echo"),
        created_at=1000.0 + i,
        events=[Event(at=1000.0, state=RunState.QUEUED, message="submitted")],
        **fields,
    )


def ids(runs):
    return [r.id for r in runs]


def filed(store, run_id, state, listed=None):
    """Where the pools' listings of ``listed`` (``state`` by default) show the run: the pools whose
    listing, line or count has it."""
    listed = listed or state
    found = {}
    for pool in (SPOT, ONDEMAND):
        places = []
        if run_id in ids(store.list(queue=pool, state=listed).runs):
            places.append("list")
        if listed == RunState.QUEUED and run_id in ids(store.head(pool, 10)):
            places.append("head")
        if listed == "waiting" and run_id in ids(store.waiting(pool).runs):
            places.append("waiting")
        if places:
            found[pool] = places
    return found


def test_a_move_refiles_the_run_and_keeps_its_changes_and_event(stack):
    store = stack.store
    run = store.create(make_run(0, fallback_at=1500.0))
    other = store.create(make_run(1))
    moved = store.move(
        run, QUEUED, ONDEMAND, {"fallback_at": None, "preemptions": 0}, Event(at=1600.0, message="moved to ondemand")
    )
    assert (moved.queue, moved.fallback_at, moved.events[-1].message) == (ONDEMAND, None, "moved to ondemand")
    got = store.get(run.id)
    assert (got.queue, got.state, got.fallback_at) == (ONDEMAND, RunState.QUEUED, None)
    assert [e.message for e in got.events] == ["submitted", "moved to ondemand"]
    assert filed(store, run.id, RunState.QUEUED) == {ONDEMAND: ["list", "head"]}
    assert filed(store, other.id, RunState.QUEUED) == {SPOT: ["list", "head"]}
    assert (store.count(SPOT, RunState.QUEUED), store.count(ONDEMAND, RunState.QUEUED)) == (1, 1)
    mine = store.list(owner="alice").runs
    assert sorted(ids(mine)) == [run.id, other.id]
    assert {r.id: r.queue for r in mine} == {run.id: ONDEMAND, other.id: SPOT}
    assert ids(store.list(owner="alice", queue=ONDEMAND).runs) == [run.id]
    assert ids(store.list(owner="alice", queue=SPOT).runs) == [other.id]
    assert ids(store.list(owner="alice", queue=ONDEMAND, state=RunState.QUEUED).runs) == [run.id]
    # the next write of the moved run, from the copy the move returned, stays in its pool
    claimed = store.update(moved, QUEUED, {"state": RunState.PREPARING, "worker_id": "w-1", "attempt": 1})
    assert claimed.queue == ONDEMAND
    assert filed(store, run.id, RunState.PREPARING) == {ONDEMAND: ["list"]}
    assert filed(store, run.id, RunState.QUEUED) == {}


def test_a_waiting_run_moves_apart_from_the_line(stack):
    store = stack.store
    run = store.create(make_run(0, waiting_on=["r-upstream"]))
    store.move(run, QUEUED, ONDEMAND, {})
    assert filed(store, run.id, RunState.QUEUED, "waiting") == {ONDEMAND: ["list", "waiting"]}
    assert filed(store, run.id, RunState.QUEUED) == {}
    released = store.update(run, Expect(waiting=True), {"waiting_on": []})  # a copy from before the move
    assert released.queue == ONDEMAND
    assert filed(store, run.id, RunState.QUEUED) == {ONDEMAND: ["list", "head"]}
    assert filed(store, run.id, RunState.QUEUED, "waiting") == {}


def test_a_finished_run_moves_in_the_purge_index(stack):
    store = stack.store
    run = store.create(make_run(0, state=RunState.FAILED, finished_at=1200.0))
    assert ids(store.due(SPOT, 2000.0)) == [run.id]
    store.move(run, Expect(states=frozenset({RunState.FAILED})), ONDEMAND, {"kill_reason": "moved"})
    assert (ids(store.due(SPOT, 2000.0)), ids(store.due(ONDEMAND, 2000.0))) == ([], [run.id])
    assert filed(store, run.id, RunState.FAILED) == {ONDEMAND: ["list"]}
    store.delete(run.id, 2000.0)
    with pytest.raises(NotFound):
        store.get(run.id)
    assert ids(store.due(ONDEMAND, 2000.0)) == []
    assert ids(store.list(owner="alice").runs) == []


def test_a_move_whose_expectation_fails_changes_nothing(stack):
    store = stack.store
    run = store.create(make_run(0))
    claimed = store.update(run, QUEUED, {"state": RunState.PREPARING, "worker_id": "w-1", "attempt": 1})
    with pytest.raises(ConditionFailed) as info:
        store.move(run, QUEUED, ONDEMAND, {"preemptions": 5}, Event(at=1600.0, message="moved"))
    assert info.value.details["run"].worker_id == "w-1"
    got = store.get(run.id)
    assert got == claimed
    assert filed(store, run.id, RunState.PREPARING) == {SPOT: ["list"]}
    assert ids(store.list(owner="alice", queue=ONDEMAND).runs) == []
    with pytest.raises(NotFound):
        store.move(make_run(9), QUEUED, ONDEMAND, {})


def test_a_move_from_a_pool_the_run_has_left_fails(stack):
    """A move is from the pool its copy of the run names: a second move made with the same copy
    (a timer handled twice) changes nothing."""
    store = stack.store
    run = store.create(make_run(0))
    store.move(run, QUEUED, ONDEMAND, {"preemptions": 1}, Event(at=1600.0, message="moved"))
    with pytest.raises(ConditionFailed) as info:
        store.move(run, QUEUED, "cpu", {"preemptions": 2}, Event(at=1700.0, message="moved again"))
    assert info.value.details["run"].queue == ONDEMAND
    got = store.get(run.id)
    assert (got.queue, got.preemptions, [e.message for e in got.events]) == (ONDEMAND, 1, ["submitted", "moved"])
    assert filed(store, run.id, RunState.QUEUED) == {ONDEMAND: ["list", "head"]}
    assert store.count("cpu", RunState.QUEUED) == 0


def test_a_worker_of_the_pool_a_run_left_cannot_claim_it(stack):
    """A claim holds the run to the worker's pool (``Expect.queue``): a worker that read the run,
    or its hint, before the move claims nothing; one of the pool it is in now claims it."""
    store = stack.store
    run = store.create(make_run(0))
    store.move(run, QUEUED, ONDEMAND, {}, Event(at=1500.0, message="moved"))
    for copy in (run, store.get(run.id)):  # the copy from before the move, and the run as it is now
        with pytest.raises(ConditionFailed) as info:
            lifecycle.claim(store, copy, copy.attempt, "w-of-spot", 60, 2000.0, pool=SPOT)
        assert info.value.details["run"].queue == ONDEMAND
    with pytest.raises(ConditionFailed):
        lifecycle.claim(store, run, run.attempt, "w-of-spot", 60, 2000.0)  # by default, the copy's pool
    assert (store.get(run.id).state, filed(store, run.id, RunState.QUEUED)) == (
        RunState.QUEUED,
        {ONDEMAND: ["list", "head"]},
    )
    claimed = lifecycle.claim(store, run, run.attempt, "w-of-ondemand", 60, 2000.0, pool=ONDEMAND)
    assert (claimed.queue, claimed.worker_id, claimed.state) == (ONDEMAND, "w-of-ondemand", RunState.PREPARING)


def test_a_move_to_the_pool_it_is_in_is_an_update(stack):
    store = stack.store
    run = store.create(make_run(0))
    moved = store.move(run, QUEUED, SPOT, {"preemptions": 2})
    assert (moved.queue, moved.preemptions) == (SPOT, 2)
    assert filed(store, run.id, RunState.QUEUED) == {SPOT: ["list", "head"]}


def test_a_claim_racing_a_move_lands_in_one_pool(racing_stack):
    """A claim and a move of one queued run at once: whichever wins first, the other's write is
    checked against what it did, and the run is filed in exactly the pool its record names."""
    store = racing_stack.store
    for i in range(4):
        run = store.create(make_run(i))
        barrier = threading.Barrier(2)
        outcomes = {}

        def claim(run=run, outcomes=outcomes, barrier=barrier):
            barrier.wait(10)
            try:
                outcomes["claim"] = store.update(run, QUEUED, {"state": RunState.PREPARING, "worker_id": "w-1"})
            except ConditionFailed:
                outcomes["claim"] = None

        def move(run=run, outcomes=outcomes, barrier=barrier):
            barrier.wait(10)
            try:
                outcomes["move"] = store.move(run, QUEUED, ONDEMAND, {}, Event(at=1600.0, message="moved"))
            except ConditionFailed:
                outcomes["move"] = None

        threads = [threading.Thread(target=claim), threading.Thread(target=move)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert outcomes["claim"] is not None or outcomes["move"] is not None
        got = store.get(run.id)
        assert got.queue == (ONDEMAND if outcomes["move"] is not None else SPOT)
        assert got.state == (RunState.PREPARING if outcomes["claim"] is not None else RunState.QUEUED)
        assert filed(store, run.id, got.state) == {got.queue: ["list", "head"] if got.state == "queued" else ["list"]}
        other = RunState.QUEUED if got.state == RunState.PREPARING else RunState.PREPARING
        assert filed(store, run.id, other) == {}
