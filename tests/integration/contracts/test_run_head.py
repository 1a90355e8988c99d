"""RunStore.head: a pool's queued runs in the order they start (higher priority, then smaller fair
tag, then older, then id), kept exact as runs are claimed, ended, re-queued and re-prioritized."""

from runplane.domain.expect import Expect
from runplane.domain.runs import Event, Run, RunSpec, run_rank
from runplane.domain.states import RunState

QUEUED = frozenset({RunState.QUEUED})


def queued(name, priority=50, tag=0.0, created=1000.0, queue="default", owner="alice"):
    return Run(
        id=f"r-{name}",
        owner=owner,
        queue=queue,
        spec=RunSpec(command="echo", priority=priority),
        fair_tag=tag,
        created_at=created,
        events=[Event(at=created, state=RunState.QUEUED, message="submitted")],
    )


def ids(runs):
    return [r.id.removeprefix("r-") for r in runs]


def test_head_orders_by_priority_then_fair_tag_then_age(stack):
    store = stack.store
    for run in (
        queued("low-old", priority=10, created=1.0),
        queued("mid-late-tag", priority=50, tag=7.0, created=2.0),
        queued("mid-new", priority=50, tag=2.0, created=300.0),
        queued("mid-old", priority=50, tag=2.0, created=200.0),
        queued("high-new", priority=90, tag=100.0, created=9000.0),
        queued("mid-tag-0", priority=50, tag=0.0, created=5000.0),
        queued("elsewhere", priority=100, queue="gpu"),
    ):
        store.create(run)
    expected = ["high-new", "mid-tag-0", "mid-old", "mid-new", "mid-late-tag", "low-old"]
    assert ids(store.head("default", 10)) == expected
    assert ids(store.head("default", 2)) == expected[:2]
    assert ids(store.head("default", 10, priority=50)) == ["mid-tag-0", "mid-old", "mid-new", "mid-late-tag"]
    assert ids(store.head("default", 1, priority=50)) == ["mid-tag-0"]
    assert store.head("default", 10, priority=51) == []
    assert ids(store.head("gpu", 10)) == ["elsewhere"]
    assert store.head("empty", 10) == []
    # what head returns is the stored run, whole
    (first,) = store.head("default", 1)
    assert first == store.get("r-high-new")
    assert run_rank(first) < run_rank(store.get("r-mid-tag-0"))


def test_runs_leave_the_head_when_claimed_or_ended_and_come_back_when_requeued(stack):
    store = stack.store
    a, b, c = (store.create(queued(n, created=t)) for n, t in (("a", 1.0), ("b", 2.0), ("c", 3.0)))
    claimed = store.update(
        a, Expect(states=QUEUED, attempt=0), {"state": RunState.PREPARING, "attempt": 1, "worker_id": "w1"}
    )
    store.update(b, Expect(states=QUEUED, attempt=0), {"state": RunState.KILLED})
    assert ids(store.head("default", 10)) == ["c"]
    # a change that keeps a run queued keeps it in place, once
    store.update(c, Expect(states=QUEUED), {"waiting_reason": "quota: alice runs 1 of 1"})
    assert ids(store.head("default", 10)) == ["c"]
    assert store.head("default", 10)[0].waiting_reason == "quota: alice runs 1 of 1"
    # handed back (a worker lost): queued again, in its old place before c
    store.update(claimed, Expect(states=frozenset({RunState.PREPARING}), attempt=1), {"state": RunState.QUEUED})
    assert ids(store.head("default", 10)) == ["a", "c"]
    assert store.head("default", 1)[0].attempt == 1
    store.update(c, Expect(states=QUEUED), {"state": RunState.FAILED})
    store.update(a, Expect(states=QUEUED), {"state": RunState.KILLED})
    assert store.head("default", 10) == []


def test_a_priority_or_fair_tag_change_moves_a_run(stack):
    store = stack.store
    first = store.create(queued("first", created=1.0))
    store.create(queued("second", created=2.0))
    last = store.create(queued("last", created=3.0))
    assert ids(store.head("default", 10)) == ["first", "second", "last"]
    raised = store.update(
        last,
        Expect(states=QUEUED, attempt=0),
        {"spec": last.spec.model_copy(update={"priority": 80})},
        Event(at=4.0, message="priority 80"),
    )
    assert raised.spec.priority == 80
    assert ids(store.head("default", 10)) == ["last", "first", "second"]
    assert ids(store.head("default", 10, priority=80)) == ["last"]
    assert ids(store.head("default", 10, priority=50)) == ["first", "second"]
    assert store.head("default", 1)[0] == store.get("r-last")
    # a larger fair tag puts a run behind the others of its priority
    store.update(first, Expect(states=QUEUED), {"fair_tag": 5.0})
    assert ids(store.head("default", 10)) == ["last", "second", "first"]
    # lowered below the rest: last
    store.update(last, Expect(states=QUEUED), {"spec": last.spec.model_copy(update={"priority": 0})})
    assert ids(store.head("default", 10)) == ["second", "first", "last"]


def test_head_pages_past_big_runs(stack):
    """Runs of a few hundred KB: DynamoDB stops a page at 1 MB; head still returns ``limit``."""
    store = stack.store
    bulky = {f"V{i}": "x" * 30_000 for i in range(6)}  # ~180 KB of environment each
    for i in range(8):
        run = queued(f"big-{i}", created=float(i))
        store.create(run.model_copy(update={"spec": run.spec.model_copy(update={"env": bulky})}))
    assert ids(store.head("default", 7)) == [f"big-{i}" for i in range(7)]


def forget_rank(request, stack, run):
    """Store ``run`` as a stack of before the line would have: no rank (DynamoDB, SQLite), no copy
    in the line (Table storage)."""
    store = stack.store
    if request.node.callspec.params["stack"] == "local-sqlite":
        with store.db.write() as c:
            c.execute("UPDATE runs SET rank = NULL WHERE id = ?", (run.id,))
    elif request.node.callspec.params["stack"] == "aws-moto":
        key = {"id": {"S": run.id}}
        store.client.update_item(
            TableName=store.table, Key=key, UpdateExpression="REMOVE #r", ExpressionAttributeNames={"#r": "rank"}
        )
    else:
        from runplane.adapters.azure.tables import key

        store.table.delete_entity(f"q:{key(run.queue)}", f"r:{key(run_rank(run))}")


def test_runs_stored_without_a_rank_take_their_place_when_next_written(stack, request):
    store = stack.store
    old = store.create(queued("old", created=1.0))
    other = store.create(queued("other", created=5.0))
    forget_rank(request, stack, old)
    forget_rank(request, stack, other)
    assert store.head("default", 10) == []
    store.update(old, Expect(states=QUEUED), {"hinted_at": 7.0})
    assert ids(store.head("default", 10)) == ["old"]
    store.update(other, Expect(states=QUEUED), {"spec": other.spec.model_copy(update={"priority": 70})})
    assert ids(store.head("default", 10)) == ["other", "old"]
    store.update(old, Expect(states=QUEUED), {"state": RunState.KILLED})
    assert ids(store.head("default", 10)) == ["other"]
