"""What the retention sweep needs of every store: runs due for it found through the store's purge
index (finished, not kept, due by a given time, soonest first), a record deleted only while it is
due, objects deleted in batches and touched (their time renewed, nothing else)."""

import time

import pytest

from runplane.domain.errors import ConditionFailed, NotFound
from runplane.domain.expect import Expect
from runplane.domain.retention import RunRetention, purge_due
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState


def _run(i, queue="default", owner="alice"):
    return Run(
        id=f"r-keep-{queue}-{i}",
        owner=owner,
        queue=queue,
        spec=RunSpec(command="echo"),
        created_at=1000.0 + i,
        events=[Event(at=1000.0 + i, state=RunState.QUEUED, message="submitted")],
    )


def _finish(stack, run, at, state=RunState.SUCCEEDED):
    running = stack.store.update(run, Expect(), {"state": RunState.RUNNING, "attempt": 1, "worker_id": "w1"})
    return stack.store.update(running, Expect(), {"state": state, "finished_at": at})


def test_finished_runs_are_due_from_their_end_soonest_first(stack):
    runs = [stack.store.create(_run(i)) for i in range(4)]
    _finish(stack, runs[0], 5000.0)
    _finish(stack, runs[1], 3000.0, RunState.FAILED)
    _finish(stack, runs[2], 9000.0)  # not due by 6000
    # runs[3] never finishes: never due
    due = stack.store.due("default", 6000.0)
    assert [r.id for r in due] == [runs[1].id, runs[0].id]
    assert [r.id for r in stack.store.due("default", 6000.0, limit=1)] == [runs[1].id]
    assert stack.store.due("other", 6000.0) == []
    assert [r.id for r in stack.store.due("default", 1e10)] == [runs[1].id, runs[0].id, runs[2].id]


def test_the_sweeps_dates_move_a_run_in_the_index(stack):
    run = _finish(stack, stack.store.create(_run(0)), 5000.0)
    dated = RunRetention(checked_at=5100.0, outputs_at=7000.0, logs_at=8000.0, record_at=9000.0)
    run = stack.store.update(run, Expect(states=frozenset({RunState.SUCCEEDED})), {"retention": dated})
    assert purge_due(run) == 7000.0
    assert stack.store.due("default", 6999.0) == []
    assert [r.id for r in stack.store.due("default", 7000.0)] == [run.id]
    gone = dated.model_copy(update={"deleted": ["outputs", "logs"]})
    stack.store.update(run, Expect(), {"retention": gone})
    assert stack.store.due("default", 8500.0) == []
    assert [r.retention for r in stack.store.due("default", 9000.0)] == [gone]


def test_a_kept_run_is_never_due_and_is_again_once_let_go(stack):
    run = _finish(stack, stack.store.create(_run(0)), 5000.0)
    kept = stack.store.update(run, Expect(), {"kept": True})
    assert kept.kept and purge_due(kept) is None
    assert stack.store.due("default", 1e10) == []
    with pytest.raises(ConditionFailed):
        stack.store.delete(run.id, 1e10)
    stack.store.update(kept, Expect(), {"kept": False})
    assert [r.id for r in stack.store.due("default", 1e10)] == [run.id]


def test_a_retried_run_leaves_the_index_until_it_ends_again(stack):
    run = _finish(stack, stack.store.create(_run(0)), 5000.0, RunState.FAILED)
    requeued = stack.store.update(run, Expect(), {"state": RunState.QUEUED, "finished_at": None, "retention": None})
    assert stack.store.due("default", 1e10) == []
    with pytest.raises(ConditionFailed):
        stack.store.delete(run.id, 1e10)
    _finish(stack, requeued, 6000.0)
    assert [r.finished_at for r in stack.store.due("default", 1e10)] == [6000.0]


def test_a_record_is_deleted_only_while_due(stack):
    run = _finish(stack, stack.store.create(_run(0)), 5000.0)
    other = stack.store.create(_run(1))
    with pytest.raises(ConditionFailed):
        stack.store.delete(run.id, 4999.0)
    with pytest.raises(ConditionFailed):  # not finished
        stack.store.delete(other.id, 1e10)
    stack.store.delete(run.id, 5000.0)
    with pytest.raises(NotFound):
        stack.store.get(run.id)
    assert stack.store.due("default", 1e10) == []
    assert stack.store.list(owner="alice").runs == [other]
    assert stack.store.list(queue="default", state=RunState.SUCCEEDED).runs == []
    with pytest.raises(NotFound):
        stack.store.delete(run.id, 1e10)


def test_objects_are_deleted_by_key(stack):
    keys = [f"runs/r1/outputs/1/f{i}" for i in range(5)]
    for key in keys:
        stack.objects.put_bytes(key, b"x")
    stack.objects.put_bytes("runs/r10/outputs/1/f0", b"y")
    stack.objects.delete([*keys[:3], "runs/r1/outputs/1/never-there"])
    assert [o.key for o in stack.objects.list("runs/r1/")] == keys[3:]
    stack.objects.delete([])
    stack.objects.delete(keys[3:])
    assert stack.objects.list("runs/r1/") == []
    assert stack.objects.get_bytes("runs/r10/outputs/1/f0") == b"y"


def test_objects_say_when_they_were_written_and_a_touch_renews_it(stack):
    key = "uploads/alice/" + "c" * 64
    before = time.time()
    stack.objects.put_bytes(key, b"archive")
    written = stack.objects.head(key)
    assert written is not None and written.modified is not None
    assert before - 5 <= written.modified <= time.time() + 5
    assert [o.modified for o in stack.objects.list("uploads/alice/")] == [written.modified]
    time.sleep(1.1)  # stores keep whole seconds
    stack.objects.touch(key)
    touched = stack.objects.head(key)
    assert touched is not None and touched.modified is not None and touched.modified > written.modified
    assert stack.objects.get_bytes(key) == b"archive" and touched.size == written.size
    with pytest.raises(NotFound):
        stack.objects.touch("uploads/alice/" + "d" * 64)
