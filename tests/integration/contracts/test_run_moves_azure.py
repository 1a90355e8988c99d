"""The Table store's move protocol (runplane.adapters.azure.run_moves) stopped after each of its steps,
as a mover that dies there leaves it: every reader finds the run in one pool, the next writer finishes
the move; and a store whose remembered pool of a run is stale finds the run where it moved."""

import pytest
from azure.core.exceptions import ServiceResponseError
from azure.data.tables import TableTransactionError, UpdateMode

from runplane.adapters.azure import run_moves as moves
from runplane.adapters.azure.run_rows import partition
from runplane.adapters.azure.runs import TableRunStore
from runplane.adapters.azure.tables import key, newest_first, unpack
from runplane.domain.errors import BackendError, NotFound
from runplane.domain.runs import Event
from runplane.domain.states import RunState
from tests.integration.contracts.test_run_moves import ONDEMAND, QUEUED, SPOT
from tests.integration.contracts.test_run_moves import make_run as moved_run

STEPS = ["arrive", "depart", "repoint", "settle"]


def make_run(i=0):
    return moved_run(i, prefix="r-step")


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
    etag = moves.reserve(store.table, current, etag, "t-1")
    moves.arrive(store.table, new, SPOT, "t-1")
    if "depart" in done:
        moves.depart(store.table, current, etag, new, "t-1")
    if "repoint" in done:
        moves.repoint(store.table, new, SPOT)
    if "settle" in done:
        moves.settle(store.table, new, SPOT, "t-1")
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


def test_a_departed_row_left_behind_never_brings_the_run_back(azure_stack, monkeypatch):
    """A mover that dies before ``leave`` leaves its departed row in the pool left. A reader that
    still remembers that pool finishes the move after the run moved on (or ended and was purged):
    it never writes the run into the pool it moved through again."""
    store = azure_stack.store
    run, ended = store.create(make_run(0)), store.create(make_run(1))
    for each in (run, ended):
        stop_after(store, each, "settle")
    assert pointers(store, run) == (ONDEMAND, ONDEMAND, None)  # settled: repointed first
    other = TableRunStore(store.table)
    listed = other.list(queue=ONDEMAND, state=RunState.QUEUED).runs
    assert sorted(r.id for r in listed) == [run.id, ended.id]
    copy = next(r for r in listed if r.id == run.id)  # as listed: no reader met the departed row
    other.move(copy, QUEUED, "third", {}, Event(at=1600.0, message="to third"))
    remembers = TableRunStore(store.table)
    remembers._remember(run.id, SPOT)
    assert remembers.get(run.id).queue == "third"
    assert (rows(store, SPOT, run.id), rows(store, ONDEMAND, run.id)) == ({}, {})
    assert [r.id for r in store.head(ONDEMAND, 10)] == [ended.id]
    assert [r.id for r in store.head("third", 10)] == [run.id]
    assert pointers(store, run) == ("third", "third", None)
    # the other run ends and is purged while a reader that remembers its first pool reads it
    done = other.update(other.get(ended.id), QUEUED, {"state": RunState.SUCCEEDED, "finished_at": 1.0})
    assert done.queue == ONDEMAND
    real, read = store.table.delete_entity, []

    def delete_entity(*args, **kwargs):
        if not read:  # the purge's first: between the run's rows going and its pointers going
            read.append(None)
            with pytest.raises(NotFound):
                TableRunStore(store.table)._locate(ended.id, SPOT)
            read.append(rows(store, ONDEMAND, ended.id))
        return real(*args, **kwargs)

    monkeypatch.setattr(store.table, "delete_entity", delete_entity)
    other.delete(ended.id, 10**10)
    assert read == [None, {}]  # the reader found it nowhere, and wrote it nowhere
    assert (rows(store, SPOT, ended.id), rows(store, ONDEMAND, ended.id)) == ({}, {})
    assert store.head(ONDEMAND, 10) == [] and store.count(ONDEMAND, RunState.SUCCEEDED) == 0
    with pytest.raises(NotFound):
        TableRunStore(store.table).get(ended.id)


def test_a_rival_mover_never_clears_the_rows_of_a_move_that_may_depart(azure_stack):
    """Arriving rows are cleared only when the pool left no longer holds their move's token (the
    move can never depart): a rival that read them before they came to count leaves them, and the
    mover whose reservation a rival took over removes its own rows, not the rival's."""
    store = azure_stack.store
    run = store.create(make_run(0))
    current, etag, _ = store._locate(run.id)
    new = current.model_copy(update={"queue": ONDEMAND})
    reserved = moves.reserve(store.table, current, etag, "t-1")
    moves.arrive(store.table, new, SPOT, "t-1")
    assert moves.reserve(store.table, current, etag, "t-2") is None  # a rival's read is stale now
    moves._clear(store.table, new)  # a rival that met the rows: their token is held, they stay
    moves.depart(store.table, current, reserved, new, "t-1")
    assert seen_in(store, run.id) == {ONDEMAND}  # counted before they are settled
    assert TableRunStore(store.table).get(run.id).queue == ONDEMAND
    # a mover reserves and arrives; a rival moves the run meanwhile, clearing the first one's rows
    raced = store.create(make_run(1))
    current, etag, _ = store._locate(raced.id)
    first = current.model_copy(update={"queue": ONDEMAND, "preemptions": 1})
    reserved = moves.reserve(store.table, current, etag, "t-1")
    moves.arrive(store.table, first, SPOT, "t-1")
    TableRunStore(store.table).move(raced, QUEUED, ONDEMAND, {"preemptions": 2})
    with pytest.raises(TableTransactionError):
        moves.depart(store.table, current, reserved, first, "t-1")
    moves.abandon(store.table, first, "t-1")
    assert (store.head(SPOT, 10), store.count(SPOT, RunState.QUEUED), store.count(ONDEMAND, RunState.QUEUED)) == (
        [],
        0,
        2,
    )
    assert sorted(r.id for r in store.head(ONDEMAND, 10)) == [run.id, raced.id]
    assert all(marks == {} for marks in rows(store, ONDEMAND, raced.id).values())
    assert len(rows(store, ONDEMAND, raced.id)) == 3
    assert TableRunStore(store.table).get(raced.id).preemptions == 2


def test_the_owner_row_is_pointed_only_where_the_id_row_points(azure_stack):
    """A move finished late (its departed row found after the run moved on) points an owner row
    that still names the pool left at the pool the ``id:`` row names now, never at one the run has
    left: the owner's listing by pool finds the run where it is."""
    store = azure_stack.store
    run = store.create(make_run(0))
    stop_after(store, run, "depart")
    for at in (f"id:{key(run.id)}", ""), (f"o:{key(run.owner)}", f"{newest_first(run.created_at)}:{key(run.id)}"):
        store.table.update_entity({"PartitionKey": at[0], "RowKey": at[1], "queue": "third"}, mode=UpdateMode.REPLACE)
    store.table.update_entity(
        {"PartitionKey": f"o:{key(run.owner)}", "RowKey": at[1], "queue": SPOT}, mode=UpdateMode.REPLACE
    )  # the id: row names a pool it moved on to; the owner row still names the pool it left
    moves.repoint(store.table, store._locate(run.id, ONDEMAND)[0], SPOT)
    assert pointers(store, run) == ("third", "third", None)


def test_a_move_whose_finish_fails_after_its_departure_is_made(azure_stack, monkeypatch):
    store = azure_stack.store
    run = store.create(make_run(0))

    def fails(*args):
        raise BackendError("move run failed: ServerBusy")

    monkeypatch.setattr(moves, "settle", fails)
    moved = store.move(run, QUEUED, ONDEMAND, {"preemptions": 1}, Event(at=1500.0, message="moved"))
    assert (moved.queue, moved.preemptions) == (ONDEMAND, 1)
    assert any(marks for marks in rows(store, ONDEMAND, run.id).values())  # not settled
    monkeypatch.undo()
    assert seen_in(store, run.id) == {ONDEMAND}
    assert TableRunStore(store.table).get(run.id).preemptions == 1  # the next reader finishes it
    assert all(marks == {} for marks in rows(store, ONDEMAND, run.id).values())
    assert rows(store, SPOT, run.id) == {}


def test_a_run_moves_back_to_a_pool_whose_departed_row_its_mover_left(azure_stack):
    store = azure_stack.store
    run = store.create(make_run(0))
    stop_after(store, run, "settle")  # its departed row stays in spot
    listed = store.list(queue=ONDEMAND, state=RunState.QUEUED).runs
    back = TableRunStore(store.table).move(listed[0], QUEUED, SPOT, {}, Event(at=1600.0, message="back"))
    assert back.queue == SPOT
    assert seen_in(store, run.id) == {SPOT}
    assert all(marks == {} for marks in rows(store, SPOT, run.id).values())
    assert rows(store, ONDEMAND, run.id) == {}
    assert pointers(store, run) == (SPOT, SPOT, None)


def test_a_departure_whose_answer_is_lost_is_a_move_made(azure_stack, monkeypatch):
    store = azure_stack.store
    run, kept = store.create(make_run(0)), store.create(make_run(1))
    real = store.table.submit_transaction

    def answer_lost(operations, **kwargs):  # a departure's answer never comes; only the first one is made
        if not any(op[0] == "update" and op[1].get(moves.TO) for op in operations):
            return real(operations, **kwargs)
        if operations[0][1]["RowKey"].endswith(run.id):
            real(operations, **kwargs)
        raise ServiceResponseError("connection reset")

    monkeypatch.setattr(store.table, "submit_transaction", answer_lost)
    moved = store.move(run, QUEUED, ONDEMAND, {"preemptions": 1}, Event(at=1500.0, message="moved"))
    assert (moved.queue, moved.preemptions) == (ONDEMAND, 1)
    with pytest.raises(BackendError):  # not made: a failed move
        store.move(kept, QUEUED, ONDEMAND, {}, Event(at=1500.0, message="moved"))
    monkeypatch.undo()
    fresh = TableRunStore(store.table)
    assert (fresh.get(run.id).queue, fresh.get(kept.id).queue) == (ONDEMAND, SPOT)
    assert [r.id for r in store.head(ONDEMAND, 10)] == [run.id]
    assert [r.id for r in store.head(SPOT, 10)] == [kept.id]
