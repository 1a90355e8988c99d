"""A retry on every store: the run goes back in its pool's line at the same id, its next claim
makes the next attempt, a grown memory limit is kept, and a worker that lost the run cannot
retry it. Submit resolves the rule: the run's own, else its pool's."""

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.asks import Resources, RetryRule
from runplane.domain.errors import BadRequest, LeaseLost
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.logs import log_chunk_key, outputs_prefix, read_logs, read_outputs
from runplane.services.runs import kill_run, submit_run

ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"])
MiB = 1024**2
NOW = 1000.0


def submitted(stack, **spec):
    return submit_run(make_ports(stack, lambda: NOW), ALICE, RunSpec(command="false", **spec), None).run


def test_a_retry_queues_the_same_run_for_its_next_attempt_with_more_memory(stack):
    run = submitted(
        stack, retry=RetryRule(attempts=3, on=["nonzero_exit"], memory_factor=2), resources=Resources(memory=64 * MiB)
    )
    assert run.max_attempts == 3
    stack.queue.receive("default", 10, 0, 30)  # the submit's hint
    held = lifecycle.claim(stack.store, run, 0, "w1", 60.0, NOW)
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, NOW + 1, "started")
    again = lifecycle.retry(
        stack,
        held,
        FailureReason.OUT_OF_MEMORY,
        "ran out of memory",
        "retried as attempt 2 of 3",
        NOW + 2,
        memory=128 * MiB,
    )
    stored = stack.store.get(run.id)
    assert stored == again
    assert (stored.state, stored.attempt, stored.worker_id, stored.lease_expires_at) == (RunState.QUEUED, 1, None, None)
    assert stored.spec.resources.memory == 128 * MiB
    assert stored.spec.retry == run.spec.retry
    assert stored.failure is None and stored.exit_code is None
    assert stored.waiting_reason.startswith("attempt 1 ended out_of_memory; retried as attempt 2 of 3")
    assert stored.events[-1].state == RunState.QUEUED
    assert stored.events[-1].message == "attempt 1 ended out_of_memory: ran out of memory; retried as attempt 2 of 3"
    assert [r.id for r in stack.store.head("default", 10)] == [run.id]  # back in its pool's line
    hints = [d.message for d in stack.queue.receive("default", 10, 1, 30)]
    assert [(m.run_id, m.attempt) for m in hints] == [(run.id, 1)]
    second = lifecycle.claim(stack.store, stored, 1, "w2", 60.0, NOW + 3)
    assert second.attempt == 2 and second.spec.resources.memory == 128 * MiB


def test_a_worker_that_lost_the_run_cannot_retry_it(stack):
    run = submitted(stack, retry=RetryRule(attempts=3, on=["nonzero_exit"]))
    held = lifecycle.claim(stack.store, run, 0, "w1", 60.0, NOW)
    lifecycle.requeue(stack, held, NOW + 1, "lease expired")  # the reaper took it back
    with pytest.raises(LeaseLost):
        lifecycle.retry(stack, held, FailureReason.NONZERO_EXIT, "exit 1", "retried", NOW + 2)
    assert stack.store.get(run.id).attempt == 1


def test_submit_takes_the_runs_rule_else_its_pools(stack):
    pools_rule = stack.pools.get("big").retry
    assert pools_rule is not None
    inherited = submitted(stack, queue="big")
    assert inherited.spec.retry == pools_rule and inherited.max_attempts == pools_rule.attempts
    own = submitted(stack, queue="big", retry=RetryRule(attempts=5, on=["nonzero_exit"]))
    assert own.spec.retry.attempts == 5 and own.max_attempts == 5
    plain = submitted(stack)
    assert plain.spec.retry is None and plain.max_attempts == 3


def test_a_kill_that_came_after_the_worker_last_read_the_run_is_not_undone_by_a_retry(stack):
    run = submitted(stack, retry=RetryRule(attempts=3, on=["nonzero_exit"]))
    held = lifecycle.claim(stack.store, run, 0, "w1", 60.0, NOW)
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, NOW + 1, "started")
    held = lifecycle.advance(stack.store, held, RunState.UPLOADING, NOW + 1, "uploading")
    stack.queue.receive("default", 10, 0, 30)  # the submit's hint
    kill_run(make_ports(stack, lambda: NOW + 2), ALICE, run.id)  # the worker's copy still says no kill
    ended = lifecycle.retry(
        stack,
        held,
        FailureReason.NONZERO_EXIT,
        "exited 1",
        "retried as attempt 2 of 3",
        NOW + 3,
        exit_code=1,
    )
    stored = stack.store.get(run.id)
    assert stored == ended
    assert (stored.state, stored.attempt, stored.failure.reason) == (RunState.FAILED, 1, FailureReason.NONZERO_EXIT)
    assert stored.failure.message == "exited 1; not retried: it was killed"
    assert stored.exit_code == 1
    assert stack.queue.receive("default", 10, 1, 30) == []  # nothing hinted: it never goes again


def test_an_attempts_outputs_are_paged_with_cursors_of_that_attempt(stack):
    run = submitted(stack)
    for attempt in (1, 2):
        for name in ("a", "b"):
            stack.objects.put_bytes(f"{outputs_prefix(run.id, attempt)}{name}", f"{attempt}{name}".encode())
    second = run.model_copy(update={"attempt": 2, "state": RunState.QUEUED})
    first_page = read_outputs(stack.objects, second, None, 1, attempt=1)
    assert [f["path"] for f in first_page.files] == ["a"]
    assert [f["path"] for f in read_outputs(stack.objects, second, first_page.next_cursor, 1, attempt=1).files] == ["b"]
    with pytest.raises(BadRequest, match="cursor is of attempt 1's outputs, not attempt 2's"):
        read_outputs(stack.objects, second, first_page.next_cursor, 1)  # the latest: attempt 2


def test_an_earlier_attempts_logs_are_complete_once_read_and_the_latest_while_it_waits_is_not(stack):
    run = submitted(stack)
    stack.objects.put_bytes(log_chunk_key(run.id, 1, "stdout", 0), b"try 1\n")
    waiting = run.model_copy(update={"attempt": 1, "state": RunState.QUEUED})  # retried, not yet claimed again
    asked = read_logs(stack.objects, waiting, "stdout", 0, attempt=1)
    assert (asked.data, asked.complete) == ("try 1\n", True)
    latest = read_logs(stack.objects, waiting, "stdout", 0)  # a follower of the latest waits for the next
    assert (latest.data, latest.complete) == ("try 1\n", False)
