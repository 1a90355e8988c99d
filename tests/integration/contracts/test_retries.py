"""A retry on every store: the run goes back in its pool's line at the same id, its next claim
makes the next attempt, a grown memory limit is kept, and a worker that lost the run cannot
retry it. Submit resolves the rule: the run's own, else its pool's."""

import pytest

from runplane.domain.errors import LeaseLost
from runplane.domain.models import FailureReason, Principal, Resources, RetryRule, RunSpec, RunState
from runplane.services import lifecycle
from runplane.services.runs import submit_run

ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"])
MiB = 1024**2
NOW = 1000.0


def submitted(stack, **spec):
    return submit_run(
        stack.store,
        stack.queue,
        stack.pools,
        ALICE,
        RunSpec(command="false", **spec),
        None,
        lambda: NOW,
        secret=b"s",
    ).run


def test_a_retry_queues_the_same_run_for_its_next_attempt_with_more_memory(stack):
    run = submitted(
        stack, retry=RetryRule(attempts=3, on=["nonzero_exit"], memory_factor=2), resources=Resources(memory=64 * MiB)
    )
    assert run.max_attempts == 3
    stack.queue.receive("default", 10, 0, 30)  # the submit's hint
    held = lifecycle.claim(stack.store, run, 0, "w1", 60.0, NOW)
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, NOW + 1, "started")
    again = lifecycle.retry(
        stack.store,
        stack.queue,
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
    lifecycle.requeue(stack.store, stack.queue, held, NOW + 1, "lease expired")  # the reaper took it back
    with pytest.raises(LeaseLost):
        lifecycle.retry(stack.store, stack.queue, held, FailureReason.NONZERO_EXIT, "exit 1", "retried", NOW + 2)
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
