"""What a run's figures mean (``worker_agent/limits.py``): each limit and the outcome it gives,
which one wins when several hold, and how an exited container's state reads."""

from dataclasses import replace
from pathlib import Path

import pytest

from runplane.domain.asks import Resources
from runplane.domain.runs import Run, RunSpec, Usage
from runplane.domain.states import FailureReason, RunState
from worker_agent.disk import check_disk
from worker_agent.limits import Limits, Seen, disk_over, ended, killed, log_over, stop
from worker_agent.outcome import Outcome
from worker_agent.run_config import ExecutorConfig
from worker_agent.usage import Tree

MiB = 1024**2
LIMITS = Limits(time=60.0, disk=10 * MiB, memory=64 * MiB, max_output_files=100, max_log_size=MiB)
DISK = Outcome(RunState.FAILED, FailureReason.DISK_LIMIT, "wrote too much", upload=False)


def test_a_run_under_every_limit_goes_on():
    seen = Seen(elapsed=59.9, log_bytes=MiB, disk=None)
    assert stop(seen, LIMITS) is None
    assert stop(Seen(elapsed=10**6), Limits()) is None  # no time limit


def test_a_lost_lease_fails_the_attempt_as_worker_lost():
    assert stop(Seen(elapsed=1, lease_lost=True), LIMITS) == Outcome(
        RunState.FAILED, FailureReason.WORKER_LOST, "lease lost"
    )


def test_a_hand_back_queues_the_run_again():
    assert stop(Seen(elapsed=1, requeue=True), LIMITS) == Outcome(RunState.QUEUED, None, "worker terminated")


def test_a_kill_says_why_when_its_asker_did():
    assert stop(Seen(elapsed=1, kill=True), LIMITS) == Outcome(
        RunState.KILLED, FailureReason.KILLED, "killed on request"
    )
    assert stop(Seen(elapsed=1, kill=True, kill_reason="sweep stopped"), LIMITS) == Outcome(
        RunState.KILLED, FailureReason.KILLED, "killed on request: sweep stopped"
    )
    assert killed("killed on request before the container started", None).message == (
        "killed on request before the container started"
    )


def test_the_time_limit_is_passed_only_once_it_is_exceeded():
    assert stop(Seen(elapsed=60.0), LIMITS) is None
    outcome = stop(Seen(elapsed=60.5), LIMITS)
    assert outcome == Outcome(RunState.TIMED_OUT, FailureReason.TIME_LIMIT, "exceeded its time limit of 1m")
    assert outcome is not None and outcome.upload  # what it wrote meanwhile is uploaded


def test_an_interactive_run_without_input_past_its_pools_most_is_killed_saying_why():
    idle = replace(LIMITS, idle=1800.0)
    assert stop(Seen(elapsed=10, idle=1800.0), idle) is None
    assert stop(Seen(elapsed=10, idle=None), idle) is None  # its input ended: nothing is waited for
    assert stop(Seen(elapsed=1, idle=10**5), LIMITS) is None  # not interactive: no such limit
    assert stop(Seen(elapsed=10, idle=1800.5), replace(idle, time=None)) == Outcome(
        RunState.KILLED, FailureReason.KILLED, "no input for 30m (max_idle_interactive)"
    )


def test_the_disk_checks_word_stops_the_run():
    assert stop(Seen(elapsed=1, disk=DISK), LIMITS) is DISK


def test_the_log_limit_is_passed_only_once_it_is_exceeded():
    assert stop(Seen(elapsed=1, log_bytes=MiB), LIMITS) is None
    assert log_over(MiB, LIMITS) is None
    outcome = stop(Seen(elapsed=1, log_bytes=MiB + 1), LIMITS)
    assert outcome == Outcome(
        RunState.FAILED,
        FailureReason.LOG_LIMIT,
        "wrote more than 1m to stdout and stderr, the pool's max_log_size: stopped (the log keeps what came "
        "before the limit)",
    )
    assert outcome is not None and outcome.upload


@pytest.mark.parametrize(
    ("holds", "wins"),
    [
        ({"lease_lost", "requeue", "kill", "time", "disk", "log"}, FailureReason.WORKER_LOST),
        ({"requeue", "kill", "time", "disk", "log"}, None),  # queued again: no failure
        ({"kill", "time", "disk", "log"}, FailureReason.KILLED),
        ({"time", "disk", "log"}, FailureReason.TIME_LIMIT),
        ({"disk", "log"}, FailureReason.DISK_LIMIT),
        ({"log"}, FailureReason.LOG_LIMIT),
    ],
)
def test_the_first_that_holds_wins(holds, wins):
    seen = Seen(
        elapsed=61.0 if "time" in holds else 1.0,
        log_bytes=2 * MiB if "log" in holds else 0,
        disk=DISK if "disk" in holds else None,
        lease_lost="lease_lost" in holds,
        requeue="requeue" in holds,
        kill="kill" in holds,
    )
    outcome = stop(seen, LIMITS)
    assert outcome is not None
    assert outcome.reason == wins
    if wins is None:
        assert outcome.state == RunState.QUEUED


def test_files_under_both_disk_limits_pass():
    assert (
        disk_over(Tree(size=4 * MiB, entries=40), Tree(size=MiB, entries=10), Tree(size=5 * MiB, entries=50), LIMITS)
        is None
    )
    assert disk_over(Tree(size=10**12, entries=1), Tree(), Tree(), replace(LIMITS, disk=None)) is None


def test_more_bytes_than_the_disk_limit_name_each_tree_and_upload_nothing():
    outcome = disk_over(Tree(size=8 * MiB, entries=3), Tree(), Tree(size=4 * MiB, entries=2), LIMITS)
    assert outcome == Outcome(
        RunState.FAILED,
        FailureReason.DISK_LIMIT,
        "wrote 12m (output directory 8m, container file system 4m), over the 10m disk limit",
        upload=False,
    )
    stopped = disk_over(Tree(size=11 * MiB, entries=3, stopped=True), Tree(), Tree(), LIMITS)
    assert stopped is not None and stopped.message.startswith("wrote more than 11m (output directory 11m)")


def test_what_the_images_volumes_hold_counts_with_the_rest():
    under = disk_over(Tree(size=4 * MiB), Tree(), Tree(size=MiB), LIMITS, Tree(size=5 * MiB))
    assert under is None
    outcome = disk_over(Tree(size=4 * MiB), Tree(), Tree(size=MiB), LIMITS, Tree(size=6 * MiB, stopped=True))
    assert outcome is not None
    assert outcome.message == (
        "wrote more than 11m (output directory 4m, container file system 1m, volumes 6m), over the 10m disk limit"
    )


def test_a_runs_inputs_count_against_its_disk_with_what_it_wrote(tmp_path):
    """A run given 6m of inputs on a 10m disk has 4m left to write: its inputs are on the worker's
    disk all the while it runs, set aside out of what it asked."""
    assert disk_over(Tree(size=4 * MiB), Tree(), Tree(), LIMITS, inputs=Tree(size=6 * MiB)) is None
    outcome = disk_over(Tree(size=4 * MiB), Tree(), Tree(size=1), LIMITS, inputs=Tree(size=6 * MiB))
    assert outcome is not None and outcome.reason == FailureReason.DISK_LIMIT
    assert outcome.message == (
        "holds, with its inputs, 10.0m (output directory 4m, container file system 1, inputs 6m), "
        "over the 10m disk limit"
    )
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "f").write_bytes(b"x" * (5 * MiB))
    usage = Usage()
    walked = check_disk(tmp_path / "out", None, lambda *_: Tree(), LIMITS, usage, inputs=6 * MiB)
    assert walked is not None and "inputs 6m" in walked.message and usage.disk == 5 * MiB  # what it wrote
    assert check_disk(tmp_path / "out", None, lambda *_: Tree(), LIMITS, Usage(), inputs=5 * MiB) is None


def test_more_entries_than_max_output_files_count_the_trees_together():
    assert disk_over(Tree(entries=50), Tree(entries=25), Tree(entries=15), LIMITS, Tree(entries=10)) is None
    outcome = disk_over(Tree(entries=50), Tree(entries=25), Tree(entries=15), LIMITS, Tree(entries=11))
    assert outcome == Outcome(
        RunState.FAILED,
        FailureReason.DISK_LIMIT,
        "wrote more than 100 files and directories (output directory, home, volumes and container file system "
        "together), the pool's max_output_files",
        upload=False,
    )


def test_max_output_files_names_the_checkpoint_directory_when_it_counts_toward_it():
    trees = (Tree(entries=20), Tree(), Tree(entries=1), LIMITS, Tree())
    outcome = disk_over(*trees, checkpoint=Tree(entries=80))
    assert outcome is not None and outcome.message == (
        "wrote more than 100 files and directories (output directory, home, volumes, container file system and "
        "checkpoint directory together), the pool's max_output_files; its checkpoint directory holds 80 of them"
    )


def test_what_cannot_be_walked_counts_as_over_before_any_count():
    outcome = disk_over(Tree(entries=10**6, unreadable="too deep"), Tree(unreadable="EACCES"), Tree(), LIMITS)
    assert outcome == Outcome(
        RunState.FAILED,
        FailureReason.DISK_LIMIT,
        "what it wrote cannot be counted (output directory: too deep; home: EACCES), so it counts as over its "
        "disk limit",
        upload=False,
    )


EXITED = {"Status": "exited", "Running": False, "ExitCode": 3, "OOMKilled": False, "Error": ""}


def test_an_exit_of_zero_succeeds():
    assert ended(None, {**EXITED, "ExitCode": 0}, {"StatusCode": 0}, LIMITS) == Outcome(
        RunState.SUCCEEDED, None, "command exited with code 0", 0
    )


def test_a_nonzero_exit_quotes_the_last_line_of_stderr():
    tail = b"x" * 400 + b"\nTraceback...\nValueError: " + b"y" * 300 + b"\n"
    outcome = ended(None, EXITED, {"StatusCode": 3}, LIMITS, tail)
    assert (outcome.state, outcome.reason, outcome.exit_code) == (RunState.FAILED, FailureReason.NONZERO_EXIT, 3)
    assert outcome.message == "command exited with code 3; stderr ends with: " + ("y" * 200)
    assert ended(None, EXITED, {}, LIMITS).message == "command exited with code 3"  # the state's code, no tail


def test_an_oom_kill_names_the_memory_limit():
    outcome = ended(None, {**EXITED, "OOMKilled": True, "ExitCode": 137}, {"StatusCode": 137}, LIMITS, b"boom")
    assert outcome == Outcome(
        RunState.FAILED,
        FailureReason.OUT_OF_MEMORY,
        "ran out of memory: the container used its whole 64m memory limit and the kernel stopped it (OOM)",
        137,
    )


def test_an_engine_error_is_a_container_error():
    from_wait = ended(None, EXITED, {"StatusCode": 3, "Error": "wait failed"}, LIMITS)
    assert (from_wait.reason, from_wait.message) == (FailureReason.CONTAINER_ERROR, "container error: wait failed")
    from_state = ended(None, {**EXITED, "Error": "mount gone"}, {}, LIMITS)
    assert (from_state.reason, from_state.message, from_state.exit_code) == (
        FailureReason.CONTAINER_ERROR,
        "container error: mount gone",
        3,
    )


def test_why_it_was_stopped_stands_with_its_exit_code_over_what_the_engine_says():
    timed_out = Outcome(RunState.TIMED_OUT, FailureReason.TIME_LIMIT, "exceeded its time limit of 1m")
    outcome = ended(timed_out, {**EXITED, "OOMKilled": True, "ExitCode": 137}, {"StatusCode": 137}, LIMITS)
    assert outcome == Outcome(RunState.TIMED_OUT, FailureReason.TIME_LIMIT, "exceeded its time limit of 1m", 137)
    assert timed_out.exit_code is None  # what was passed in is left as it was
    over = ended(DISK, {**EXITED, "ExitCode": 0}, {"StatusCode": 0}, LIMITS)
    assert (over.state, over.reason, over.exit_code, over.upload) == (
        RunState.FAILED,
        FailureReason.DISK_LIMIT,
        0,
        False,
    )


def test_a_container_removed_under_the_run_is_a_container_error_whatever_else_holds():
    for status in ("removing", "dead"):
        outcome = ended(DISK, {**EXITED, "Status": status, "ExitCode": 0}, {"StatusCode": 0}, LIMITS)
        assert outcome == Outcome(
            RunState.FAILED,
            FailureReason.CONTAINER_ERROR,
            "the container was removed from the Docker engine while it ran (not by runplane)",
        )


def test_a_runs_limits_are_its_own_and_its_pools():
    run = Run(
        id="r-1",
        owner="ada",
        queue="cpu",
        created_at=0.0,
        spec=RunSpec(command="true", resources=Resources(time=90, disk=5 * MiB, memory=64 * MiB)),
    )
    config = ExecutorConfig(worker_id="w", work_dir=Path("/nonexistent"), max_output_files=7, max_log_size=MiB)
    assert Limits.of(run, config) == Limits(
        time=90.0, disk=5 * MiB, memory=64 * MiB, max_output_files=7, max_log_size=MiB
    )
    interactive = run.model_copy(update={"spec": run.spec.model_copy(update={"interactive": True})})
    assert Limits.of(interactive, replace(config, max_idle_interactive=60.0)).idle == 60.0
