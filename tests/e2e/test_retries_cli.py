"""``runplane run --attempts/--retry-on/--memory-factor``, ``status`` and ``logs --attempt`` as a
user runs them against the local stack; errors are one line (2: usage or a 422 answer)."""

import json

import pytest

from tests.e2e.test_cli import cli, new_user, one_error_line

pytestmark = pytest.mark.docker


def test_a_retried_run_from_the_command_line(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "retry")
    script = 'echo "try $RUNPLANE_ATTEMPT"; [ "$RUNPLANE_ATTEMPT" -ge 2 ] || exit 3'
    args = ["run", "--wait", "--json", "--attempts", "2", "--retry-on", "nonzero_exit,time_limit", "--", script]
    done = cli(devstack, *args, token=token, home=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert (run["state"], run["attempt"], run["max_attempts"]) == ("succeeded", 2, 2)
    assert run["spec"]["retry"] == {"attempts": 2, "on": ["nonzero_exit", "time_limit"], "memory_factor": None}
    status = cli(devstack, "status", run["id"], token=token, home=tmp_path)
    lines = [[part.strip() for part in line.split(None, 1)] for line in status.stdout.splitlines()]
    assert ["attempt", "2 of 2"] in lines, status.stdout
    assert ["retry", "up to 2 attempts on nonzero_exit, time_limit"] in lines, status.stdout
    assert "retried as attempt 2 of 2 (its retry rule names nonzero_exit)" in status.stdout
    first = cli(devstack, "logs", "--attempt", "1", run["id"], token=token, home=tmp_path)
    assert (first.returncode, first.stdout) == (0, "try 1\n")
    latest = cli(devstack, "logs", run["id"], token=token, home=tmp_path)
    assert latest.stdout == "try 2\n"
    beyond = cli(devstack, "logs", "--attempt", "3", run["id"], token=token, home=tmp_path)
    assert one_error_line(beyond, 2) == "error: query parameter attempt must be between 1 and 2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--retry-on", "nonzero_exit"], "error: --retry-on and --memory-factor go with --attempts N"),
        (["--memory-factor", "2"], "error: --retry-on and --memory-factor go with --attempts N"),
        (["--attempts", "11"], "error: Invalid value for '--attempts'"),
        (["--attempts", "2", "--retry-on", "killed"], "error: retry.on.0: Input should be"),
        (["--attempts", "2", "--memory-factor", "0.5"], "error: retry.memory_factor: Input should be greater"),
    ],
)
def test_bad_rules_are_one_line(devstack, tmp_path, args, message):
    token = new_user(devstack, tmp_path, "retry")
    line = one_error_line(cli(devstack, "run", "--queue", "parked", *args, "--", "x", token=token, home=tmp_path), 2)
    assert line.startswith(message), line


def test_logs_follow_goes_on_to_the_next_attempt(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "retry")
    script = 'echo "try $RUNPLANE_ATTEMPT"; sleep 2; [ "$RUNPLANE_ATTEMPT" -ge 2 ] || exit 3'
    made = cli(
        devstack, "run", "--attempts", "2", "--retry-on", "nonzero_exit", "--", script, token=token, home=tmp_path
    )
    assert made.returncode == 0, made.stderr
    followed = cli(devstack, "logs", "-f", made.stdout.strip(), token=token, home=tmp_path, timeout=180)
    assert (followed.returncode, followed.stdout) == (0, "try 1\ntry 2\n"), followed.stderr
