"""The retry decision (``domain/retries.py``) and the rule's validation."""

import pytest
from pydantic import ValidationError

from runplane.domain.asks import Resources, RetryRule
from runplane.domain.pools import load_pools
from runplane.domain.retries import decide
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import FailureReason

MiB = 1024**2


def a_run(retry=None, attempt=1, max_attempts=3, memory=64 * MiB, kill_requested=False):
    spec = RunSpec(command="true", retry=retry, resources=Resources(memory=memory))
    return Run(
        id="r-1",
        owner="ada",
        spec=spec,
        queue="cpu",
        created_at=0.0,
        attempt=attempt,
        max_attempts=max_attempts,
        kill_requested=kill_requested,
    )


def test_a_run_without_a_rule_has_nothing_decided():
    assert decide(a_run(), FailureReason.NONZERO_EXIT) is None


def test_a_named_reason_is_retried_while_attempts_are_left():
    rule = RetryRule(attempts=3, on=["nonzero_exit"])
    first = decide(a_run(rule, attempt=1), FailureReason.NONZERO_EXIT)
    assert first.retry and first.memory is None
    assert first.note == "retried as attempt 2 of 3 (its retry rule names nonzero_exit)"
    last = decide(a_run(rule, attempt=3), FailureReason.NONZERO_EXIT)
    assert not last.retry
    assert last.note == "not retried: attempt 3 was the last of 3"


def test_a_reason_the_rule_does_not_name_is_not_retried():
    decision = decide(a_run(RetryRule(attempts=3, on=["nonzero_exit"])), FailureReason.OUT_OF_MEMORY)
    assert not decision.retry
    assert "out_of_memory is not a reason its retry rule names (nonzero_exit)" in decision.note


def test_a_killed_run_is_never_retried():
    rule = RetryRule(attempts=3, on=["nonzero_exit"])
    assert not decide(a_run(rule, kill_requested=True), FailureReason.NONZERO_EXIT).retry
    assert not decide(a_run(rule), FailureReason.KILLED).retry


def test_out_of_memory_with_a_factor_grows_the_limit_up_to_the_pool():
    rule = RetryRule(attempts=4, on=[], memory_factor=2)
    doubled = decide(a_run(rule, memory=64 * MiB), FailureReason.OUT_OF_MEMORY, memory_cap=1024 * MiB)
    assert doubled.retry and doubled.memory == 128 * MiB
    assert "with 128m memory (was 64m)" in doubled.note
    capped = decide(a_run(rule, memory=600 * MiB), FailureReason.OUT_OF_MEMORY, memory_cap=1024 * MiB)
    assert capped.memory == 1024 * MiB
    full = decide(a_run(rule, memory=1024 * MiB), FailureReason.OUT_OF_MEMORY, memory_cap=1024 * MiB)
    assert not full.retry
    assert "already all a worker of its pool has" in full.note


def test_out_of_memory_named_is_retried_at_the_same_limit_once_at_the_cap():
    rule = RetryRule(attempts=2, on=["out_of_memory"], memory_factor=2)
    decision = decide(a_run(rule, memory=1024 * MiB), FailureReason.OUT_OF_MEMORY, memory_cap=1024 * MiB)
    assert decision.retry and decision.memory is None


@pytest.mark.parametrize(
    "bad",
    [
        {"attempts": 0},
        {"attempts": 11},
        {"attempts": "3"},
        {"attempts": 2.5},
        {"attempts": True},
        {"attempts": 3, "on": ["killed"]},
        {"attempts": 3, "on": ["bogus"]},
        {"attempts": 3, "on": "nonzero_exit"},
        {"attempts": 3, "memory_factor": 0.5},
        {"attempts": 3, "memory_factor": float("nan")},
        {"attempts": 3, "memory_factor": 65},
        {"attempts": 3, "extra": 1},
        {"on": ["nonzero_exit"]},
    ],
)
def test_a_bad_rule_is_refused(bad):
    with pytest.raises(ValidationError):
        RetryRule.model_validate(bad)


def test_reasons_are_kept_once_and_in_order():
    assert RetryRule(attempts=2, on=["time_limit", "nonzero_exit", "time_limit"]).on == ["nonzero_exit", "time_limit"]


def test_a_pools_file_in_yaml_may_write_on_as_it_reads(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(
        "pools:\n  - {name: p, cpus: 1, memory: 1g, default_image: i, retry: {attempts: 2, on: [nonzero_exit]}}\n"
    )
    (pool,) = load_pools(str(path)).pools
    assert pool.retry == RetryRule(attempts=2, on=["nonzero_exit"])


def test_a_submit_without_a_rule_has_the_request_hash_it_had_before_rules_existed():
    import hashlib
    import json

    from runplane.services.runs import _request_hash

    spec = RunSpec(command="python train.py", resources=Resources(cpus=2))
    first = {"command", "image", "name", "queue", "resources", "env", "inputs", "network", "tag", "group", "priority"}
    before = spec.model_dump(mode="json", include=first)  # what the hash held before any field was added
    assert _request_hash(spec) == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert _request_hash(spec) != _request_hash(spec.model_copy(update={"retry": RetryRule(attempts=2)}))


def test_a_retry_rule_may_not_name_dependency_failed():
    with pytest.raises(ValidationError):
        RetryRule(attempts=3, on=["dependency_failed"])
