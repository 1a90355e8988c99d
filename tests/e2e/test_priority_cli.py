"""``runplane run --priority`` and ``runplane priority RUN N`` as a user runs them: a separate
process talking HTTP to the local stack. Errors are one line on stderr with README.md's exit codes
(2 usage, also 422 answers; 3 refused: 403, 404, 409)."""

import json

import pytest

from tests.e2e.test_cli import cli, new_user, one_error_line

REFUSED = "error: priority 51 is above 50, the most pool parked allows users; only admins may set more"


def test_run_with_a_priority_then_change_it(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "prio")
    made = cli(
        devstack, "run", "--json", "--queue", "parked", "--priority", "30", "--", "x", token=token, home=tmp_path
    )
    assert made.returncode == 0, made.stderr
    run = json.loads(made.stdout)
    assert (run["priority"], run["spec"]["priority"]) == (30, 30)
    moved = cli(devstack, "priority", run["id"], "10", token=token, home=tmp_path)
    assert (moved.returncode, moved.stdout, moved.stderr.strip()) == (0, "", f"{run['id']}: priority 10")
    status = cli(devstack, "status", run["id"], token=token, home=tmp_path)
    assert any(line.split() == ["priority", "10"] for line in status.stdout.splitlines()), status.stdout
    shown = cli(devstack, "priority", run["id"], "50", "--json", token=token, home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["priority"] == 50
    assert one_error_line(cli(devstack, "priority", run["id"], "51", token=token, home=tmp_path), 3) == REFUSED
    raised = cli(devstack, "priority", run["id"], "95", "--json", token="admin-token", home=tmp_path)
    assert json.loads(raised.stdout)["priority"] == 95
    assert cli(devstack, "kill", run["id"], token=token, home=tmp_path).returncode == 0
    ended = one_error_line(cli(devstack, "priority", run["id"], "20", token=token, home=tmp_path), 3)
    assert ended == f"error: run {run['id']} is killed: only a queued run's priority can change"


def test_only_an_admin_submits_above_the_pools_max(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "prio")
    args = ["run", "--queue", "parked", "--priority", "51", "--", "x"]
    assert one_error_line(cli(devstack, *args, token=token, home=tmp_path), 3) == REFUSED
    admin = cli(devstack, *args[:-2], "--json", "--", "x", token="admin-token", home=tmp_path)
    assert admin.returncode == 0, admin.stderr
    run = json.loads(admin.stdout)
    assert run["priority"] == 51
    assert cli(devstack, "kill", run["id"], token="admin-token", home=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["run", "--priority", "101", "--", "x"], "error: Invalid value for '--priority'", 2),
        (["run", "--priority", "high", "--", "x"], "error: Invalid value for '--priority'", 2),
        (["priority", "r-0123456789abcdef01234567", "101"], "error: Invalid value for 'N'", 2),
        (["priority", "r-0123456789abcdef01234567", "1.5"], "error: Invalid value for 'N'", 2),
        (["priority", "r-0123456789abcdef01234567"], "error: Missing argument 'N'", 2),
        (["priority", "r-0123456789abcdef01234567", "10"], "error: run r-0123456789abcdef01234567 not found", 3),
        (["priority", "not a run", "10"], "error: run 'not", 3),
    ],
)
def test_errors_are_one_line(devstack, tmp_path, args, message, code):
    line = one_error_line(cli(devstack, *args, home=tmp_path), code)
    assert line.startswith(message), line
