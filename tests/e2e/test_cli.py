"""The ``runplane`` CLI as a user runs it: a separate process talking HTTP to the local stack."""

import os
import subprocess
import sys
import uuid

import pytest

from runplane.cli.client import Client
from tests.conftest import wait_for, wait_state

pytestmark = pytest.mark.docker


def cli(devstack, *args, cwd=None, token="alice-token", home=None, timeout=120):
    env = {**os.environ, "RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": token}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "runplane.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def test_run_wait_then_download(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "--wait", "--", "echo hello; echo 42 > answer", cwd=tmp_path, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello\n"
    assert "succeeded" in proc.stderr
    dest = tmp_path / "out"
    dest.mkdir()
    down = cli(devstack, "download", cwd=dest, home=tmp_path)  # defaults to the last run, into .
    assert down.returncode == 0, down.stderr
    assert (dest / "answer").read_text() == "42\n"
    status = cli(devstack, "status", "--json", home=tmp_path)
    assert '"state": "succeeded"' in status.stdout


def test_run_keeps_the_quoting_of_the_words_after_the_double_dash(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "--wait", "--", "sh", "-c", "echo a   b; echo $0", "zero", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "a b\nzero\n"  # sh -c got one script and $0, as typed
    spaced = cli(devstack, "run", "--wait", "--", "echo", "a   b", home=tmp_path)
    assert (spaced.returncode, spaced.stdout) == (0, "a   b\n"), spaced.stderr


def test_run_wait_exit_code_and_state_line(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "-w", "--name", "fails", "--", "echo bad >&2; exit 7", home=tmp_path)
    assert proc.returncode == 7
    assert "bad\n" in proc.stderr
    assert "failed: nonzero_exit" in proc.stderr


def test_logs_ls_kill(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "--", "echo one; sleep 60", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert run_id.startswith("r-")
    ls = cli(devstack, "ls", "--limit", "5", home=tmp_path)
    assert run_id in ls.stdout
    wait_for(lambda: cli(devstack, "logs", run_id, home=tmp_path).stdout == "one\n", 60, 0.2, "its first line")
    kill = cli(devstack, "kill", home=tmp_path)
    assert kill.returncode == 0
    assert run_id in kill.stderr
    logs = cli(devstack, "logs", "-f", run_id, home=tmp_path)  # follows to the end: the run is killed
    assert (logs.returncode, logs.stdout) == (0, "one\n")
    assert '"state": "killed"' in cli(devstack, "status", "--json", run_id, home=tmp_path).stdout


@pytest.mark.parametrize(
    ("args", "token", "message", "code"),
    [
        (["run", "--memory", "1t", "--", "x"], "alice-token", "error: no pool can run this request", 1),
        (["status", "r-nope"], "alice-token", "error: run r-nope not found", 1),
        (["ls"], "wrong", "error: token is not valid", 1),
        (["run", "--env", "NOEQUALS", "--", "x"], "alice-token", "error: --env must look like NAME=VALUE", 2),
    ],
)
def test_errors_are_one_line(devstack, tmp_path, args, token, message, code):
    proc = cli(devstack, *args, token=token, home=tmp_path)
    assert proc.returncode == code
    assert proc.stderr.startswith(message)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_unreachable_api_is_one_line(tmp_path):
    env = {**os.environ, "RUNPLANE_API_URL": "http://127.0.0.1:9", "RUNPLANE_TOKEN": "x", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "runplane.cli", "ls"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: cannot reach http://127.0.0.1:9")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_tagged_run_and_the_pools_table(devstack, tmp_path):
    import json

    proc = cli(devstack, "run", "--json", "--queue", "parked", "--tag", "a100-box", "--", "x", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    assert run["spec"]["tag"] == "a100-box"
    assert cli(devstack, "kill", run["id"], home=tmp_path).returncode == 0
    bad = cli(devstack, "run", "--tag", "Not A Tag", "--", "x", home=tmp_path)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "tag" in bad.stderr
    pools = cli(devstack, "pools", home=tmp_path)
    assert pools.returncode == 0, pools.stderr
    assert "launches" in pools.stdout and "parked" in pools.stdout
    data = json.loads(cli(devstack, "pools", "--json", home=tmp_path).stdout)
    parked = next(p for p in data["pools"] if p["name"] == "parked")
    assert parked["launches"]["launched"] == 0 and parked["disabled"] is None
    assert parked["last_decision"] in (None, "no backlog", "pool parked at max_workers=0")


def test_tokens_and_whoami(devstack, tmp_path):
    import json

    made = cli(
        devstack, "token", "create", "dana", "--group", "vision", "--scope", "runs:read", "--expires", "30d",
        token="admin-token", home=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("rp_") and len(made.stdout.splitlines()) == 1  # only the secret on stdout
    assert "shown only now" in made.stderr
    me = cli(devstack, "whoami", token=secret, home=tmp_path)
    assert (me.returncode, me.stdout.strip()) == (0, "dana (groups: vision); scopes: runs:read")
    listed = json.loads(
        cli(devstack, "token", "ls", "--user", "dana", "--json", token="admin-token", home=tmp_path).stdout
    )
    (token,) = listed["tokens"]
    assert secret not in json.dumps(listed)
    table = cli(devstack, "token", "ls", token="admin-token", home=tmp_path)
    assert token["id"] in table.stdout and secret not in table.stdout
    denied = cli(devstack, "token", "ls", home=tmp_path)  # alice is no admin
    assert denied.returncode == 1 and denied.stderr.startswith("error: token of alice lacks the 'admin' permission")
    revoked = cli(devstack, "token", "revoke", token["id"], token="admin-token", home=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    after = cli(devstack, "whoami", token=secret, home=tmp_path)
    assert after.returncode == 1 and after.stderr.strip() == "error: token is not valid"
    gone = cli(devstack, "token", "revoke", token["id"], token="admin-token", home=tmp_path)
    assert gone.returncode == 1 and gone.stderr.startswith(f"error: token {token['id']} not found")


def test_download_follows_every_page_of_outputs(devstack, docker_client, tmp_path):
    """The API lists outputs 500 a page; download gets them all."""
    proc = cli(devstack, "run", "--wait", "--", "for i in $(seq 1 501); do echo $i > f$i; done", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    dest = tmp_path / "out"
    dest.mkdir()
    down = cli(devstack, "download", cwd=dest, home=tmp_path, timeout=300)
    assert down.returncode == 0, down.stderr
    assert len(list(dest.iterdir())) == 501
    assert (dest / "f501").read_text() == "501\n"


def test_run_wait_exits_137_when_the_run_is_killed(devstack, docker_client, tmp_path):
    """``run --wait`` follows a run another client kills, and exits as a killed process does."""
    env = {**os.environ, "RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": "alice-token", "HOME": str(tmp_path)}
    with (tmp_path / "out").open("w") as stdout, (tmp_path / "err").open("w") as stderr:
        waiting = subprocess.Popen(
            [sys.executable, "-m", "runplane.cli", "run", "--wait", "--", "echo started; sleep 60"],
            stdout=stdout, stderr=stderr, env=env,
        )  # fmt: skip
        try:
            last = tmp_path / ".runplane" / "last_run"
            run_id = wait_for(lambda: last.exists() and last.read_text().strip(), 60, 0.1, "the submitted run's id")
            alice = Client(devstack.api_url, "alice-token")
            wait_state(alice, run_id, {"running"})
            kill = cli(devstack, "kill", run_id, home=tmp_path / "other")  # another client, another shell
            assert kill.returncode == 0, kill.stderr
            code = waiting.wait(120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
    errors = (tmp_path / "err").read_text()
    assert code == 137, errors
    assert (tmp_path / "out").read_text() == "started\n"
    assert "killed: killed" in errors
    assert alice.request("GET", f"/v1/runs/{run_id}")["state"] == "killed"


def test_run_wait_exits_124_when_the_run_times_out(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "--wait", "--time", "2s", "--", "echo started; sleep 60", home=tmp_path)
    assert proc.returncode == 124, proc.stderr
    assert proc.stdout == "started\n"
    assert "timed_out: time_limit" in proc.stderr


def test_run_with_a_used_idempotency_key_says_already_submitted(devstack, docker_client, tmp_path):
    key = f"cli-{uuid.uuid4()}"
    first = cli(devstack, "run", "--idempotency-key", key, "--queue", "parked", "--", "echo x", home=tmp_path)
    assert first.returncode == 0, first.stderr
    run_id = first.stdout.strip()
    assert run_id.startswith("r-") and "already" not in first.stderr
    again = cli(devstack, "run", "--idempotency-key", key, "--queue", "parked", "--", "echo x", home=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == run_id  # scripts still read the id from stdout
    assert again.stderr.startswith(f"already submitted as {run_id} (same --idempotency-key): queued")
    assert cli(devstack, "kill", run_id, home=tmp_path).returncode == 0


def test_run_wait_with_a_used_idempotency_key_follows_the_first_run(devstack, docker_client, tmp_path):
    """A retried ``run --wait`` runs nothing again: it follows the run the key made, to its end."""
    key = f"cli-{uuid.uuid4()}"
    first = cli(devstack, "run", "--wait", "--idempotency-key", key, "--", "echo once", home=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "once\n"
    assert "submitted to pool default" in first.stderr and "already" not in first.stderr
    run_id = first.stderr.split()[0]
    again = cli(devstack, "run", "--wait", "--idempotency-key", key, "--", "echo once", home=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "once\n"  # the first run's output
    assert again.stderr.startswith(f"already submitted as {run_id} (same --idempotency-key): succeeded")
    assert "submitted to pool" not in again.stderr
    run = Client(devstack.api_url, "alice-token").request("GET", f"/v1/runs/{run_id}")
    assert len([e for e in run["events"] if e["state"] == "preparing"]) == 1
