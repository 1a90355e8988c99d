"""RunStore contract: conditional writes, idempotent create, listing with pagination."""

import pytest

from runplane.domain.errors import AlreadyExists, ConditionFailed, NotFound
from runplane.domain.expect import Expect
from runplane.domain.runs import Event, Failure, Run, RunSpec, Usage
from runplane.domain.states import ACTIVE_STATES, FailureReason, RunState


def make_run(i=0, owner="alice", queue="default", created=1000.0):
    return Run(
        id=f"r-{owner}-{queue}-{i}",
        owner=owner,
        queue=queue,
        spec=RunSpec(command="echo"),
        created_at=created + i,
        events=[Event(at=created, state=RunState.QUEUED, message="submitted")],
    )


def test_create_get_round_trip(stack):
    run = make_run()
    stack.store.create(run)
    got = stack.store.get(run.id)
    assert got == run


def test_create_twice_raises_with_existing(stack):
    run = make_run()
    stack.store.create(run)
    with pytest.raises(AlreadyExists) as info:
        stack.store.create(run.model_copy(update={"owner": "mallory"}))
    assert info.value.details["run"].owner == "alice"


def test_get_missing(stack):
    with pytest.raises(NotFound):
        stack.store.get("r-missing")


def test_conditional_update_checks_state_attempt_worker(stack):
    run = stack.store.create(make_run())
    claimed = stack.store.update(
        run,
        Expect(states=frozenset({RunState.QUEUED}), attempt=0),
        {"state": RunState.PREPARING, "attempt": 1, "worker_id": "w1"},
        Event(at=1001, state=RunState.PREPARING, message="claimed"),
    )
    assert (claimed.state, claimed.attempt, claimed.worker_id) == (RunState.PREPARING, 1, "w1")
    assert [e.message for e in claimed.events] == ["submitted", "claimed"]
    # the same claim again (a duplicate message) loses
    with pytest.raises(ConditionFailed) as info:
        stack.store.update(run, Expect(states=frozenset({RunState.QUEUED}), attempt=0), {"attempt": 1})
    assert info.value.details["run"].worker_id == "w1"
    # another worker cannot write over it
    with pytest.raises(ConditionFailed):
        stack.store.update(
            claimed, Expect(states=ACTIVE_STATES, attempt=1, worker_id="w2"), {"state": RunState.RUNNING}
        )
    # a stale attempt cannot either
    with pytest.raises(ConditionFailed):
        stack.store.update(
            claimed, Expect(states=ACTIVE_STATES, attempt=0, worker_id="w1"), {"state": RunState.RUNNING}
        )
    stored = stack.store.get(run.id)
    assert stored.state == RunState.PREPARING


def test_update_nested_values(stack):
    run = stack.store.create(make_run())
    updated = stack.store.update(
        run,
        Expect(),
        {
            "usage": Usage(cpu_seconds=1.25, memory_peak=2**30, timings={"run": 0.5}),
            "failure": Failure(reason=FailureReason.OUT_OF_MEMORY, message="oom"),
            "exit_code": 137,
            "lease_expires_at": 1234.5,
        },
    )
    assert updated.usage.cpu_seconds == 1.25
    assert updated.usage.timings == {"run": 0.5}
    assert updated.failure.reason == FailureReason.OUT_OF_MEMORY
    assert stack.store.get(run.id) == updated


def test_update_missing_run(stack):
    with pytest.raises(NotFound):
        stack.store.update(make_run(99), Expect(states=frozenset({RunState.QUEUED})), {"state": RunState.KILLED})


def test_update_refuses_identity_fields(stack):
    run = stack.store.create(make_run())
    with pytest.raises(ValueError):
        stack.store.update(run, Expect(), {"owner": "mallory"})


def test_list_by_owner_newest_first_with_pagination(stack):
    for i in range(7):
        stack.store.create(make_run(i))
    stack.store.create(make_run(0, owner="bob"))
    seen, cursor = [], None
    while True:
        page = stack.store.list(owner="alice", limit=3, cursor=cursor)
        assert len(page.runs) <= 3
        seen += [r.id for r in page.runs]
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == [f"r-alice-default-{i}" for i in reversed(range(7))]


def test_list_filters_and_queue_state_index(stack):
    runs = [stack.store.create(make_run(i)) for i in range(4)]
    stack.store.update(runs[1], Expect(), {"state": RunState.KILLED})
    killed = stack.store.list(owner="alice", state=RunState.KILLED, limit=10)
    assert [r.id for r in killed.runs] == [runs[1].id]
    queued = stack.store.list(queue="default", state=RunState.QUEUED, limit=10)
    assert {r.id for r in queued.runs} == {runs[0].id, runs[2].id, runs[3].id}
    assert stack.store.count("default", RunState.QUEUED) == 3
    assert stack.store.count("default", RunState.KILLED) == 1
    assert stack.store.count("parked", RunState.QUEUED) == 0


def test_bad_cursor(stack):
    from runplane.domain.errors import BadRequest

    with pytest.raises(BadRequest):
        stack.store.list(owner="alice", cursor="not-a-cursor")


def _with_budget(stack, budget):
    """The same store (same table and client, or database) reading at most ``budget`` runs per listing."""
    store = stack.store
    if hasattr(store, "client"):
        return type(store)(store.table, store.client, list_budget=budget)
    if hasattr(store, "db"):
        return type(store)(store.db, list_budget=budget)
    return type(store)(store.table, list_budget=budget)


def test_filtered_listings_read_a_bounded_number_of_runs_per_call(stack):
    """A filter that matches only the oldest of many runs: each call reads at most its budget and
    hands back a short (here empty) page with a cursor, and following the cursors finds the run."""
    runs = [stack.store.create(make_run(i)) for i in range(12)]
    stack.store.update(runs[0], Expect(), {"state": RunState.KILLED})
    store = _with_budget(stack, 5)
    pages, seen, cursor = 0, [], None
    while True:
        page = store.list(owner="alice", state=RunState.KILLED, limit=50, cursor=cursor)
        pages += 1
        seen += [r.id for r in page.runs]
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == [runs[0].id]
    assert pages >= 3  # 12 runs, 5 at most a call


def test_a_cursor_after_any_run_continues_the_listing(stack):
    runs = [stack.store.create(make_run(i)) for i in range(5)]
    cursor = stack.store.cursor_after(runs[3], owner="alice")  # newest first: 4, 3 | 2, 1, 0
    rest = stack.store.list(owner="alice", limit=10, cursor=cursor)
    assert [r.id for r in rest.runs] == [runs[2].id, runs[1].id, runs[0].id]


def test_a_cursor_belongs_to_its_owners_listing(stack):
    """Bob's cursor used in alice's listing is refused on both clouds, not quietly reinterpreted."""
    from runplane.domain.errors import BadRequest

    for i in range(3):
        stack.store.create(make_run(i, owner="bob"))
    cursor = stack.store.list(owner="bob", limit=1).next_cursor
    with pytest.raises(BadRequest):
        stack.store.list(owner="alice", cursor=cursor)
