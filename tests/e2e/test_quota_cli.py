"""``runplane quota set|ls|show|rm`` and ``runplane run --group`` as a user runs them: a separate
process talking HTTP to the local stack. Errors are one line on stderr with README.md's exit codes
(2 usage, also 422 answers; 3 refused: 403, 404)."""

import json
import time
import uuid

import pytest

from runplane import bootstrap
from runplane.domain.quotas import Hold, UsageRecord
from runplane.services.admission import period_key
from tests.conftest import wait_for
from tests.e2e.test_cli import cli, one_error_line


def new_user(devstack, tmp_path, *groups):
    """(token, name) of a user no other test has, with ``groups``."""
    name = f"quota-{uuid.uuid4().hex[:8]}"
    flags = [word for group in groups for word in ("--group", group)]
    made = cli(devstack, "token", "create", name, *flags, "--json", token="admin-token", home=tmp_path)
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)["token"], name


def admin(devstack, tmp_path, *args):
    return cli(devstack, "quota", *args, token="admin-token", home=tmp_path)


def hold_some(kind, name, *, gpus, cpus, gpu_hours_settled):
    """What a claimed run holds, written to the stack's own usage record of ``kind`` ``name``: one
    attempt holding ``gpus`` and ``cpus`` that may run an hour, over ``gpu_hours_settled`` this
    month. (The CLI's figures are exact while the hold has run for under 18 s.)"""
    quotas = bootstrap.stack().quotas
    now = time.time()
    record = quotas.usage(kind, name)
    hold = Hold(run_id=f"r-{uuid.uuid4().hex[:24]}", attempt=1, gpus=gpus, cpus=cpus, at=now,
                gpu_seconds=gpus * 3600, cpu_seconds=cpus * 3600)  # fmt: skip
    update = {"holds": {hold.key: hold}, "period": period_key("month", now), "gpu_seconds": gpu_hours_settled * 3600}
    quotas.save_usage(UsageRecord.model_validate(record.model_dump() | update))


def test_set_ls_show_rm(devstack, tmp_path):
    token, name = new_user(devstack, tmp_path, "qcli")
    group = f"g-{uuid.uuid4().hex[:8]}"
    made = admin(devstack, tmp_path, "set", name, "--max-running", "3", "--max-gpus", "2", "--gpu-hours", "200")
    assert made.returncode == 0, made.stderr
    assert "0/3 runs" in made.stdout and "0/2 GPUs" in made.stdout and "0/200 GPU-h" in made.stdout
    stored = json.loads(admin(devstack, tmp_path, "set", f"@{group}", "--cpu-hours", "10.5", "--json").stdout)
    assert (stored["kind"], stored["name"], stored["cpu_hours"], stored["max_gpus"]) == ("group", group, 10.5, None)
    hold_some("user", name, gpus=1, cpus=4, gpu_hours_settled=12.5)

    listed = admin(devstack, tmp_path, "ls")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if f" {name} " in f" {line} "]
    for shown in ("1/3 runs", "1/2 GPUs", "4 cpus", "12.5/200 GPU-h", "0 cpu-h", "month:"):
        assert shown in row, (shown, row)
    (group_row,) = [line for line in listed.stdout.splitlines() if f"@{group}" in line]
    assert "0/10.5 cpu-h" in group_row and "0 runs" in group_row

    mine = cli(devstack, "quota", "ls", "--json", token=token, home=tmp_path)  # the user's own view
    (quota,) = json.loads(mine.stdout)["quotas"]
    assert (quota["name"], quota["usage"]["running"], quota["usage"]["gpus"]) == (name, 1, 1)
    assert quota["usage"]["gpu_hours"] == pytest.approx(12.5, abs=0.01)
    shown = cli(devstack, "quota", "show", name, token=token, home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "1/2 GPUs" in shown.stdout and "12.5/200 GPU-h" in shown.stdout

    removed = admin(devstack, tmp_path, "rm", f"@{group}", "--json")
    assert json.loads(removed.stdout) == {"quota": f"@{group}", "removed": True}
    gone = admin(devstack, tmp_path, "rm", name)
    assert (gone.returncode, gone.stderr.strip()) == (0, f"{name}: quota removed")
    assert one_error_line(admin(devstack, tmp_path, "show", name), 3) == f"error: no quota for user {name}"
    assert name not in admin(devstack, tmp_path, "ls").stdout


def test_a_user_sees_only_their_own(devstack, tmp_path):
    token, name = new_user(devstack, tmp_path)
    _, other = new_user(devstack, tmp_path)
    for user in (name, other):
        assert admin(devstack, tmp_path, "set", user, "--max-running", "1").returncode == 0
    try:
        listed = cli(devstack, "quota", "ls", token=token, home=tmp_path)
        assert name in listed.stdout and other not in listed.stdout
        hidden = cli(devstack, "quota", "show", other, token=token, home=tmp_path)
        assert one_error_line(hidden, 3) == f"error: no quota for user {other}"
        for args in (["set", other, "--max-running", "9"], ["rm", other], ["set", name, "--max-gpus", "9"]):
            denied = cli(devstack, "quota", *args, token=token, home=tmp_path)
            assert one_error_line(denied, 3) == f"error: token of {name} lacks the 'admin' permission"
    finally:
        for user in (name, other):
            admin(devstack, tmp_path, "rm", user)


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["set", "alice"], "error: give at least one of --max-running", 2),
        (["set", "alice", "--max-gpus", "-1"], "error: Invalid value for '--max-gpus'", 2),
        (["set", "alice", "--max-gpus", "two"], "error: Invalid value for '--max-gpus'", 2),
        (["set", "alice", "--gpu-hours", "inf"], "error: --gpu-hours must be a finite number", 2),
        (["set", "alice", "--max-cpus", "nan"], "error: ", 2),
        (["set", "alice", "--period", "year"], "error: Invalid value for '--period'", 2),
        (["set", "alice", "--max-running", "10000000"], "error: max_running: Input should be less than or equal", 2),
        (["set", "@Not-A-Group", "--max-gpus", "1"], "error: group 'Not-A-Group' is not valid", 2),
        (["set", "@", "--max-gpus", "1"], "error: '@' names no user or group", 2),
        (["show", ""], "error: '' names no user or group", 2),
        (["show", "nobody-at-all"], "error: no quota for user nobody-at-all", 3),
        (["rm", "@nobody"], "error: no quota for group nobody", 3),
        (["show", "bad name"], "error: no quota for user 'bad name'", 3),
    ],
)
def test_errors_are_one_line(devstack, tmp_path, args, message, code):
    line = one_error_line(admin(devstack, tmp_path, *args), code)
    assert line.startswith(message), line


def test_run_with_a_group(devstack, tmp_path):
    token, _ = new_user(devstack, tmp_path, "qa", "qb")
    proc = cli(devstack, "run", "--json", "--queue", "parked", "--group", "qb", "--", "x", token=token, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    assert (run["group"], run["spec"]["group"]) == ("qb", "qb")
    status = cli(devstack, "status", run["id"], token=token, home=tmp_path)
    assert any(line.split() == ["group", "qb"] for line in status.stdout.splitlines()), status.stdout
    assert cli(devstack, "kill", run["id"], token=token, home=tmp_path).returncode == 0
    other = cli(devstack, "run", "--queue", "parked", "--group", "vision", "--", "x", token=token, home=tmp_path)
    assert "vision" in one_error_line(other, 2)


@pytest.mark.docker
def test_a_running_run_shows_in_its_owners_use(devstack, docker_client, tmp_path):
    """A run a worker has claimed is held against its owner's quota until it ends."""
    token, name = new_user(devstack, tmp_path)
    assert admin(devstack, tmp_path, "set", name, "--max-running", "2", "--max-cpus", "4").returncode == 0
    try:
        proc = cli(devstack, "run", "--cpus", "1", "--", "sleep 60", token=token, home=tmp_path)
        assert proc.returncode == 0, proc.stderr
        run_id = proc.stdout.strip()

        def row():
            listed = cli(devstack, "quota", "ls", token=token, home=tmp_path).stdout
            return next((line for line in listed.splitlines() if name in line), "")

        held = wait_for(lambda: "1/2 runs" in row() and row(), 90, 0.5, "the run's hold")
        assert "1/4 cpus" in held
        assert cli(devstack, "kill", run_id, token=token, home=tmp_path).returncode == 0
        wait_for(lambda: "0/2 runs" in row(), 60, 0.5, "the hold's release")
    finally:
        admin(devstack, tmp_path, "rm", name)
