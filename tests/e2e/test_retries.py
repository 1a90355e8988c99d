"""Retries by failure category on the local stack (its SQLite stores, the dispatcher, local agents, Docker): a
run goes again only for a reason its rule names, at the same id, with each attempt's logs and
outputs kept apart, and an out_of_memory retry may grow the memory limit."""

import urllib.request

import pytest

from runplane.client import BadRequest, InvalidRequest, NotFound, RetryRule
from tests.conftest import ON_EVERY_CLOUD

pytestmark = pytest.mark.docker

MEMORY_LIMIT = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
BLOW_UP = "x=aaaaaaaa; while true; do x=$x$x; done"


def contents(files):
    return {f.path: urllib.request.urlopen(f.url, timeout=10).read() for f in files}


def timeline(run):
    return [e.message for e in run.view.events]


def test_a_run_that_fails_once_succeeds_at_its_second_attempt(alice, bob):
    run = alice.submit(
        'echo "try $RUNPLANE_ATTEMPT"; echo "$RUNPLANE_ATTEMPT" > attempt; [ "$RUNPLANE_ATTEMPT" -ge 2 ] || exit 3',
        retry={"attempts": 3, "on": ["nonzero_exit"]},
    ).wait(timeout=120)
    assert (run.view.state, run.view.attempt, run.view.max_attempts) == ("succeeded", 2, 3), run.view
    assert run.view.exit_code == 0 and run.view.failure is None
    assert any(
        m.startswith("attempt 1 ended nonzero_exit: ")
        and m.endswith("; retried as attempt 2 of 3 (its retry rule names nonzero_exit)")
        for m in timeline(run)
    ), timeline(run)
    states = [e.state for e in run.view.events if e.state]
    attempt = ["preparing", "running", "uploading"]  # a failed attempt's outputs are uploaded too
    assert states == ["queued", *attempt, "queued", *attempt, "succeeded"]
    # each attempt's logs and outputs are its own, and the first one's are kept
    assert run.logs() == "try 2\n"
    assert run.logs(attempt=1) == "try 1\n"
    assert contents(run.outputs(attempt=1)) == {"attempt": b"1\n"}
    assert contents(run.outputs()) == contents(run.outputs(attempt=2)) == {"attempt": b"2\n"}
    assert run.logs(attempt=2) == "try 2\n"
    # another user sees no attempt of it; an attempt it has not had is no attempt
    with pytest.raises(NotFound):
        bob.logs(run.id, attempt=1)
    with pytest.raises(NotFound):
        list(bob.outputs(run.id, attempt=1))
    with pytest.raises(InvalidRequest, match="attempt must be between 1 and 2"):
        alice.logs(run.id, attempt=3)
    with pytest.raises(BadRequest, match="attempt must be an integer"):
        alice.request("GET", f"/v1/runs/{run.id}/logs", query={"attempt": "first"})


def test_out_of_memory_is_not_retried_when_the_rule_names_only_nonzero_exit(alice):
    run = alice.submit(BLOW_UP, memory="16m", retry=RetryRule(attempts=3, on=["nonzero_exit"])).wait(timeout=120)
    assert (run.view.state, run.view.attempt) == ("failed", 1)
    assert run.view.failure.reason == "out_of_memory"
    assert run.view.failure.message.endswith(
        "; not retried: out_of_memory is not a reason its retry rule names (nonzero_exit)"
    )


@pytest.mark.parametrize("alice", ON_EVERY_CLOUD, indirect=True)
def test_out_of_memory_with_a_memory_factor_goes_again_with_twice_the_memory(alice):
    run = alice.submit(
        f'if [ "$RUNPLANE_ATTEMPT" = 1 ]; then {BLOW_UP}; fi; {MEMORY_LIMIT}',
        memory="16m",
        retry={"attempts": 2, "on": ["nonzero_exit"], "memory_factor": 2},
    ).wait(timeout=120)
    assert (run.view.state, run.view.attempt) == ("succeeded", 2), run.view
    assert run.view.spec.resources.memory == 32 * 1024**2
    assert run.logs() == f"{32 * 1024**2}\n"  # what the second container was given
    assert any("retried as attempt 2 of 2 with 32m memory (was 16m)" in m for m in timeline(run)), timeline(run)


def test_a_run_without_a_rule_is_not_retried(alice):
    run = alice.submit("exit 4").wait(timeout=120)
    assert (run.view.state, run.view.attempt, run.view.exit_code) == ("failed", 1, 4)
    assert "retried" not in run.view.failure.message


def test_a_run_that_never_went_has_no_attempt_to_read(alice):
    run = alice.submit("true", queue="parked")
    try:
        with pytest.raises(InvalidRequest, match="has not had an attempt yet"):
            alice.logs(run.id, attempt=1)
        assert alice.logs(run.id).data == ""  # the latest, none yet
    finally:
        run.kill()


def test_pools_show_their_rules_for_runs(alice):
    pools = {p.name: p for p in alice.pools()}
    assert pools["big"].retry == RetryRule(attempts=2, on=["time_limit"])
    assert pools["big"].max_user_priority == 70
    assert (pools["default"].retry, pools["default"].max_user_priority) == (None, 50)
    assert pools["default"].price_per_hour == 3.6 and pools["big"].price_per_hour is None
    assert pools["default"].fair_share_half_life == 3600


def test_following_a_retried_run_shows_each_attempt_whole_and_once(alice):
    run = alice.submit(
        'echo "try $RUNPLANE_ATTEMPT begins"; sleep 1; echo "try $RUNPLANE_ATTEMPT ends"; '
        '[ "$RUNPLANE_ATTEMPT" -ge 2 ] || exit 3',
        retry={"attempts": 2, "on": ["nonzero_exit"]},
    )
    text = "".join(run.follow(poll=0.2))
    assert text == "try 1 begins\ntry 1 ends\ntry 2 begins\ntry 2 ends\n"
    assert (run.view.state, run.view.attempt) == ("succeeded", 2)
