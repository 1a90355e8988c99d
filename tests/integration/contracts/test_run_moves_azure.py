"""The Table store's move protocol (runplane.adapters.azure.run_moves) stopped after each of its steps,
as a mover that dies there leaves it: every reader finds the run in one pool, the next writer finishes
the move; and a store whose remembered pool of a run is stale finds the run where it moved."""

import pytest

from runplane.adapters.azure import run_moves as moves
from runplane.adapters.azure.run_rows import partition
from runplane.adapters.azure.runs import TableRunStore
from runplane.adapters.azure.tables import key, newest_first, unpack
from runplane.domain.expect import Expect
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState

QUEUED = Expect(states=frozenset({RunState.QUEUED}))
SPOT, ONDEMAND = "spot", "ondemand"
STEPS = ["arrive", "depart", "settle", "repoint"]


def make_run(i=0):
    return Run(
        id=f"r-step-{i}",
        owner="alice",
        queue=SPOT,
        spec=RunSpec(command="echo"),
        created_at=1000.0 + i,
        events=[Event(at=1000.0, state=RunState.QUEUED, message="submitted")],
    )


def rows(store, queue, run_id):
    """The rows of the run in the pool's partition: RowKey -> its move's marks."""
    found = store.table.query_entities("PartitionKey eq @pk", parameters={"pk": partition(queue)})
    return {
        e["RowKey"]: {m: e[m] for m in (moves.MOVE, moves.FROM, moves.TO) if e.get(m)}
        for e in found
        if "n" in e and unpack(e)["id"] == run_id
    }


def pointers(store, run):
    id_row = store.table.get_entity(f"id:{key(run.id)}", "")
    owner_row = store.table.get_entity(f"o:{key(run.owner)}", f"{newest_first(run.created_at)}:{key(run.id)}")
    return id_row["queue"], owner_row["queue"], owner_row.get(moves.NEXT)


def seen_in(store, run_id):
    """The pools whose listing, line, count and owner listing by queue show the run (each must agree)."""
    places = set()
    for pool in (SPOT, ONDEMAND):
        views = [
            run_id in [r.id for r in store.list(queue=pool, state=RunState.QUEUED).runs],
            run_id in [r.id for r in store.head(pool, 10)],
            store.count(pool, RunState.QUEUED) == 1,
            run_id in [r.id for r in store.list(owner="alice", queue=pool).runs],
        ]
        assert len(set(views)) == 1, f"{pool}: listing, line, count and owner listing disagree: {views}"
        if views[0]:
            places.add(pool)
    return places


def stop_after(store, run, step):
    """Move ``run`` to ONDEMAND with the protocol's steps up to ``step``, as a mover that dies then."""
    current, etag, _ = store._locate(run.id)
    new = current.model_copy(update={"queue": ONDEMAND, "preemptions": 0})
    new.events = [*new.events, Event(at=1500.0, message="moved to ondemand")]
    done = STEPS[: STEPS.index(step) + 1]
    moves.arrive(store.table, new, SPOT, "t-1")
    if "depart" in done:
        moves.depart(store.table, current, etag, new, "t-1")
    if "settle" in done:
        moves.settle(store.table, new, SPOT, "t-1")
    if "repoint" in done:
        moves.repoint(store.table, new, SPOT)
    return new


@pytest.mark.parametrize("step", STEPS)
def test_a_mover_that_dies_after_a_step_leaves_the_run_in_one_pool(azure_stack, step):
    store = azure_stack.store
    run = store.create(make_run())
    stop_after(store, run, step)
    fresh = TableRunStore(store.table)  # another process: nothing remembered
    moved = step != "arrive"  # the move is made when its source departs
    where = ONDEMAND if moved else SPOT
    assert seen_in(store, run.id) == {where}
    assert fresh.get(run.id).queue == where
    # the next writer, with a copy of the run from before the move, lands on the run where it is
    written = TableRunStore(store.table).update(run, QUEUED, {"preemptions": 3}, Event(at=1600.0, message="next"))
    assert written.queue == where
    assert [e.message for e in written.events][-1] == "next"
    assert ("moved to ondemand" in [e.message for e in written.events]) is moved
    if not moved:  # the next move replaces the leftover and is made
        store.move(written, QUEUED, ONDEMAND, {}, Event(at=1700.0, message="moved again"))
    assert seen_in(store, run.id) == {ONDEMAND}
    assert rows(store, SPOT, run.id) == {}
    assert all(marks == {} for marks in rows(store, ONDEMAND, run.id).values())
    assert len(rows(store, ONDEMAND, run.id)) == 3  # the run, its state copy, its copy in the line
    assert pointers(store, run) == (ONDEMAND, ONDEMAND, None)
    assert store.get(run.id).preemptions == 3


def test_a_reader_finishes_a_move_left_after_its_departure(azure_stack):
    store = azure_stack.store
    run = store.create(make_run())
    stop_after(store, run, "depart")
    assert rows(store, SPOT, run.id) != {}
    assert TableRunStore(store.table).get(run.id).queue == ONDEMAND
    assert rows(store, SPOT, run.id) == {}
    assert pointers(store, run) == (ONDEMAND, ONDEMAND, None)


def test_a_remembered_pool_the_run_left_is_looked_up_again(azure_stack):
    store = azure_stack.store
    other = TableRunStore(store.table)
    run = store.create(make_run())
    assert other.get(run.id).queue == SPOT  # remembered: spot
    store.move(run, QUEUED, ONDEMAND, {}, Event(at=1500.0, message="moved"))
    assert other._queues[run.id] == SPOT
    assert other.get(run.id).queue == ONDEMAND
    assert other._queues[run.id] == ONDEMAND
    claimed = other.update(run, QUEUED, {"state": RunState.PREPARING, "worker_id": "w-1"})
    assert claimed.queue == ONDEMAND
    assert store.get(run.id).worker_id == "w-1"
    assert [r.id for r in store.list(queue=ONDEMAND, state=RunState.PREPARING).runs] == [run.id]
