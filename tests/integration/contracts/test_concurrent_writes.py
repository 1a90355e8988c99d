"""Contracts of conditional writes under concurrency: RunStore.update, PoolStateStore.save and
QuotaStore.save_usage.

Several threads write the same record at once; a barrier lines them up so that their reads and
writes overlap. Whatever the store does inside (a DynamoDB condition expression, a Table storage
ETag), the outcomes are the same: one winner per condition, no change lost. On AWS the racing
tests run on dynalite, not on moto, which cannot race faithfully (see ``racing_stack``).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runplane.domain.errors import ConditionFailed
from runplane.domain.expect import Expect
from runplane.domain.quotas import Hold
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import ACTIVE_STATES, RunState
from runplane.domain.workers import PoolRecord

THREADS = 8


def make_run(i=0):
    return Run(
        id=f"r-race-{i}",
        owner="alice",
        queue="default",
        spec=RunSpec(command="echo"),
        created_at=1000.0 + i,
        events=[Event(at=1000.0, state=RunState.QUEUED, message="submitted")],
    )


def race(n, call):
    """``call(i)`` in ``n`` threads started together; (results, errors) by thread."""
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait(10)
        try:
            return call(i), None
        except ConditionFailed as e:
            return None, e

    with ThreadPoolExecutor(n) as pool:
        outcomes = list(pool.map(one, range(n)))
    return [r for r, _ in outcomes], [e for _, e in outcomes]


def test_claims_from_one_read_exactly_one_wins(racing_stack):
    stack = racing_stack
    read = stack.store.create(make_run())
    expect = Expect(states=frozenset({RunState.QUEUED}), attempt=0)

    def claim(i):
        return stack.store.update(
            read,
            expect,
            {"state": RunState.PREPARING, "attempt": 1, "worker_id": f"w{i}"},
            Event(at=1001, state=RunState.PREPARING, message=f"claimed by w{i}"),
        )

    results, errors = race(THREADS, claim)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    winner = winners[0].worker_id
    losers = [e for e in errors if e is not None]
    assert len(losers) == THREADS - 1
    assert all(e.details["run"].worker_id == winner for e in losers)
    stored = stack.store.get(read.id)
    assert (stored.state, stored.attempt, stored.worker_id) == (RunState.PREPARING, 1, winner)
    assert [e.message for e in stored.events] == ["submitted", f"claimed by {winner}"]
    assert stack.store.count("default", RunState.QUEUED) == 0
    assert [r.id for r in stack.store.list(queue="default", state=RunState.PREPARING).runs] == [read.id]


def test_a_second_update_from_the_same_read_loses(stack):
    read = stack.store.create(make_run())
    kill = Expect(states=frozenset({RunState.QUEUED}))
    stack.store.update(read, kill, {"state": RunState.KILLED})
    with pytest.raises(ConditionFailed) as info:
        stack.store.update(read, Expect(states=frozenset({RunState.QUEUED}), attempt=0), {"state": RunState.PREPARING})
    assert info.value.details["run"].state == RunState.KILLED
    assert stack.store.get(read.id).state == RunState.KILLED


def test_unconditional_updates_at_once_lose_nothing(racing_stack):
    stack = racing_stack
    read = stack.store.create(make_run())

    def note(i):
        return stack.store.update(read, Expect(), {}, Event(at=1001 + i, message=f"note {i}"))

    results, errors = race(THREADS, note)
    assert errors == [None] * THREADS
    assert sorted(len(r.events) for r in results) == list(range(2, THREADS + 2))
    stored = stack.store.get(read.id)
    assert stored.events[0].message == "submitted"
    assert sorted(e.message for e in stored.events[1:]) == sorted(f"note {i}" for i in range(THREADS))


def test_counter_under_contention_is_exact(racing_stack):
    stack = racing_stack
    """Each thread bumps ``attempt`` by one, conditional on the value it read, until it has
    won three times: every value is won exactly once."""
    run = stack.store.create(make_run())
    rounds = 3

    def bump(i):
        won = []
        while len(won) < rounds:
            current = stack.store.get(run.id)
            try:
                new = stack.store.update(run, Expect(attempt=current.attempt), {"attempt": current.attempt + 1})
            except ConditionFailed:
                continue
            won.append(new.attempt)
        return won

    results, errors = race(4, bump)
    assert errors == [None] * 4
    assert sorted(a for won in results for a in won) == list(range(1, 4 * rounds + 1))
    assert stack.store.get(run.id).attempt == 4 * rounds


def test_state_changes_at_once_keep_the_queue_state_listing_exact(racing_stack):
    stack = racing_stack
    runs = [stack.store.create(make_run(i)) for i in range(6)]
    start = Expect(states=frozenset({RunState.QUEUED}), attempt=0)

    def claim_then_run(i):
        run = runs[i % len(runs)]
        claimed = stack.store.update(run, start, {"state": RunState.PREPARING, "attempt": 1, "worker_id": f"w{i}"})
        return stack.store.update(claimed, Expect(states=ACTIVE_STATES, worker_id=f"w{i}"), {"state": RunState.RUNNING})

    results, errors = race(12, claim_then_run)
    assert sum(r is not None for r in results) == sum(e is not None for e in errors) == len(runs)
    assert stack.store.count("default", RunState.QUEUED) == 0
    assert stack.store.count("default", RunState.PREPARING) == 0
    assert stack.store.count("default", RunState.RUNNING) == len(runs)
    listed = stack.store.list(queue="default", state=RunState.RUNNING, limit=50).runs
    assert [r.id for r in listed] == [r.id for r in reversed(runs)]


def test_pool_record_saves_are_conditional(stack):
    states = stack.pool_states
    fresh = states.get("default")
    assert fresh == PoolRecord(pool="default")
    stored = states.save(fresh.model_copy(update={"last_decision": "first"}))
    assert stored.version == 1
    assert states.get("default") == stored
    with pytest.raises(ConditionFailed):
        states.save(fresh.model_copy(update={"last_decision": "stale"}))
    assert states.get("default").last_decision == "first"
    assert states.get("parked") == PoolRecord(pool="parked")


def test_pool_record_saves_from_one_read_exactly_one_wins(racing_stack):
    stack = racing_stack
    read = stack.pool_states.save(PoolRecord(pool="default"))
    results, errors = race(
        THREADS, lambda i: stack.pool_states.save(read.model_copy(update={"last_decision": f"d{i}"}))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert sum(e is not None for e in errors) == THREADS - 1
    assert stack.pool_states.get("default") == winners[0]
    assert winners[0].version == read.version + 1


def test_usage_holds_at_once_never_pass_the_cap(racing_stack):
    """Each thread reads the usage record and adds its hold only while fewer than two are held,
    saving on the version it read and reading again when another write came first (as admission
    does): from a record that does not exist yet, exactly two holds end up stored, each thread's
    answer matches what is stored, and every write that won is in the record."""
    quotas = racing_stack.quotas

    def reserve(i):
        while True:
            record = quotas.usage("group", "vision")
            if record.running >= 2:
                return None
            held = Hold(run_id=f"r-{i}", attempt=1, gpus=1, at=1000.0 + i)
            try:
                return quotas.save_usage(record.model_copy(update={"holds": {**record.holds, held.key: held}}))
            except ConditionFailed:
                continue

    results, errors = race(THREADS, reserve)
    assert errors == [None] * THREADS
    won = sorted(f"r-{i}#1" for i, r in enumerate(results) if r is not None)
    assert len(won) == 2
    stored = quotas.usage("group", "vision")
    assert sorted(stored.holds) == won
    assert (stored.running, stored.gpus, stored.version) == (2, 2, 2)
    assert sorted(r.version for r in results if r is not None) == [1, 2]


def test_usage_writes_at_once_lose_nothing(racing_stack):
    """Each thread adds one entry to a stored record, reading again whenever another write came
    first: every entry is kept, and each write took its own version."""
    quotas = racing_stack.quotas
    start = quotas.save_usage(quotas.usage("user", "alice"))

    def block(i):
        while True:
            record = quotas.usage("user", "alice")
            try:
                return quotas.save_usage(record.model_copy(update={"blocked": {**record.blocked, f"r-{i}": i}}))
            except ConditionFailed:
                continue

    results, errors = race(THREADS, block)
    assert errors == [None] * THREADS
    assert sorted(r.version for r in results) == list(range(start.version + 1, start.version + THREADS + 1))
    stored = quotas.usage("user", "alice")
    assert stored.blocked == {f"r-{i}": i for i in range(THREADS)}
    assert stored.version == start.version + THREADS
