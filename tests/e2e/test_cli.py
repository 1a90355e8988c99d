"""The ``runplane`` CLI as a user runs it: a separate process talking HTTP to the local stack.

Exit codes (README.md): 0 success; under ``--wait`` the run's own code, 5 when it has none, 124
timed out, 137 killed; 2 usage (also 400/422 answers); 3 refused (401/403/404/409/...); 4
unreachable. Errors are one line on stderr.

Each ``cli()`` is a process of its own, forked from an interpreter that has imported the CLI
already (tests/forkserver.py), with its own arguments, environment, directory and pipes: the
import, not the command, is most of a short invocation. The tests that watch a process as it runs
(``logs -f``, a ``run --wait`` killed by another client, a terminal) start ``python -m
runplane.cli`` itself."""

import atexit
import functools
import json
import os
import stat
import subprocess
import sys
import threading
import uuid

import pytest

from runplane.client import Client
from tests.conftest import wait_for, wait_state
from tests.forkserver import ForkServer

pytestmark = pytest.mark.docker


def clean_environ():
    return {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}


_STARTING = threading.Lock()


def cli_processes():
    """The fork server of ``cli()``: started on first use, stopped when the tests end."""
    with _STARTING:
        return _cli_processes()


@functools.cache
def _cli_processes():
    server = ForkServer([sys.executable], ["runplane.cli.app"], clean_environ())
    atexit.register(server.stop)
    return server


def cli(devstack, *args, cwd=None, token="alice-token", home=None, timeout=120, env=None, stdin=None):
    """``python -m runplane.cli ARGS`` as ``subprocess.run(capture_output=True, text=True)`` gives
    it, talking to ``devstack`` with ``token``; ``home``: its HOME (profiles, the last run)."""
    base = {**clean_environ(), "RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": token}
    if home is not None:
        base.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    return cli_processes().run(
        {"module": "runplane.cli"}, list(args), cwd=cwd, env={**base, **(env or {})}, timeout=timeout, input=stdin
    )


def one_error_line(proc, code):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip()


def new_user(devstack, tmp_path, prefix):
    """A token of a user no other test has (their runs are all this test's)."""
    user = f"{prefix}-{uuid.uuid4().hex[:8]}"
    made = cli(devstack, "token", "create", user, "--json", token="admin-token", home=tmp_path)
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)["token"]


def test_run_wait_then_download(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "--wait", "--", "echo hello; echo 42 > answer", cwd=tmp_path, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello\n"
    assert "succeeded" in proc.stderr
    dest = tmp_path / "out"
    dest.mkdir()
    down = cli(devstack, "download", cwd=dest, home=tmp_path)  # defaults to the last run, into .
    assert down.returncode == 0, down.stderr
    assert down.stdout == f"{dest / 'answer'}\n"  # one line per file written: stderr is no terminal
    assert (dest / "answer").read_text() == "42\n"
    status = cli(devstack, "status", "--json", home=tmp_path)
    assert '"state": "succeeded"' in status.stdout


def test_run_keeps_the_quoting_of_the_words_after_the_double_dash(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "--wait", "--", "sh", "-c", "echo a b", home=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "a b\n"), proc.stderr
    script = cli(devstack, "run", "--wait", "--", "sh", "-c", "echo a   b; echo $0", "zero", home=tmp_path)
    assert (script.returncode, script.stdout) == (0, "a b\nzero\n"), script.stderr  # one script and $0
    spaced = cli(devstack, "run", "--wait", "--", "echo", "a   b", home=tmp_path)
    assert (spaced.returncode, spaced.stdout) == (0, "a   b\n"), spaced.stderr
    line = cli(devstack, "run", "--wait", "--", "echo 'x   y' | tr x z; echo $((1+2))", home=tmp_path)
    assert (line.returncode, line.stdout) == (0, "z   y\n3\n"), line.stderr  # one word: a command line as it is


@pytest.mark.parametrize("code", [3, 7])
def test_run_wait_exits_with_the_runs_own_code(devstack, docker_client, tmp_path, code):
    proc = cli(devstack, "run", "-w", "--name", "fails", "--", f"echo bad >&2; exit {code}", home=tmp_path)
    assert proc.returncode == code, proc.stderr
    assert "bad\n" in proc.stderr
    assert "failed: nonzero_exit" in proc.stderr


def test_run_wait_exits_5_when_the_run_failed_without_an_exit_code(devstack, docker_client, tmp_path):
    proc = cli(devstack, "run", "--wait", "--image", "runplane/does-not-exist:1", "--", "echo never", home=tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert "failed: image_not_found" in proc.stderr
    assert proc.stdout == ""


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


@pytest.mark.slow
def test_logs_tail(devstack, docker_client, tmp_path):
    """--tail N prints the last N lines; with -f it then follows the run to its end."""
    proc = cli(devstack, "run", "--", "i=0; while true; do i=$((i+1)); echo $i; sleep 0.2; done", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    lines = lambda: cli(devstack, "logs", run_id, home=tmp_path).stdout.splitlines()  # noqa: E731
    wait_for(lambda: len(lines()) >= 5, 60, 0.2, "five lines")
    env = {**os.environ, "RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": "alice-token", "HOME": str(tmp_path)}
    with (tmp_path / "err").open("w") as stderr:
        following = subprocess.Popen(
            [sys.executable, "-m", "runplane.cli", "logs", "-f", "--tail", "2", run_id],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
        )  # fmt: skip
    try:
        first = [int(following.stdout.readline()) for _ in range(3)]  # the last two, then one more
        assert first[0] >= 4 and first == [first[0], first[0] + 1, first[0] + 2]
        assert cli(devstack, "kill", run_id, home=tmp_path).returncode == 0
        rest = following.stdout.read()  # to its end: the process ends with the run
        following.wait(60)
    finally:
        if following.poll() is None:
            following.kill()
    assert following.returncode == 0, (tmp_path / "err").read_text()  # it ended with the run
    followed = first + [int(line) for line in rest.splitlines()]
    assert followed == list(range(first[0], first[0] + len(followed)))  # nothing lost, nothing twice
    everything = cli(devstack, "logs", run_id, home=tmp_path).stdout
    assert everything.endswith(f"{followed[-1]}\n")
    tail = cli(devstack, "logs", "--tail", "3", run_id, home=tmp_path)
    assert (tail.returncode, tail.stdout) == (0, "".join(everything.splitlines(keepends=True)[-3:])), tail.stderr
    assert cli(devstack, "logs", "--tail", "0", run_id, home=tmp_path).stdout == ""
    assert cli(devstack, "logs", "--tail", "100000", run_id, home=tmp_path).stdout == everything


@pytest.mark.parametrize(
    ("args", "token", "message", "code"),
    [
        (["run", "--memory", "1t", "--", "x"], "alice-token", "error: no pool can run this request", 2),
        (["run", "--memory", "lots", "--", "x"], "alice-token", "error: ", 2),
        (["status", "r-nope"], "alice-token", "error: run r-nope not found", 3),
        (["kill", "r-nope"], "alice-token", "error: run r-nope not found", 3),
        (["ls"], "wrong", "error: token is not valid", 3),
    ],
)
def test_errors_are_one_line(devstack, tmp_path, args, token, message, code):
    line = one_error_line(cli(devstack, *args, token=token, home=tmp_path), code)
    assert line.startswith(message)


def test_another_users_run_is_not_found(devstack, tmp_path):
    """A run of bob's is no run for alice: status, logs and kill exit 3 and say only 'not found'."""
    proc = cli(devstack, "run", "--queue", "parked", "--", "echo bob", token="bob-token", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    for command in ("status", "logs", "kill"):
        line = one_error_line(cli(devstack, command, run_id, home=tmp_path / "alice"), 3)
        assert line == f"error: run {run_id} not found"
    assert cli(devstack, "kill", run_id, token="bob-token", home=tmp_path).returncode == 0


def test_tagged_run_and_the_pools_table(devstack, tmp_path):
    proc = cli(devstack, "run", "--json", "--queue", "parked", "--tag", "a100-box", "--", "x", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    assert run["spec"]["tag"] == "a100-box"
    assert cli(devstack, "kill", run["id"], home=tmp_path).returncode == 0
    bad = cli(devstack, "run", "--tag", "Not A Tag", "--", "x", home=tmp_path)
    assert "tag" in one_error_line(bad, 2)  # answered 422: a bad value
    pools = cli(devstack, "pools", home=tmp_path)
    assert pools.returncode == 0, pools.stderr
    assert "launches" in pools.stdout and "parked" in pools.stdout
    data = json.loads(cli(devstack, "pools", "--json", home=tmp_path).stdout)
    parked = next(p for p in data["pools"] if p["name"] == "parked")
    assert parked["launches"]["launched"] == 0 and parked["disabled"] is None
    assert parked["last_decision"] in (None, "no backlog", "pool parked at max_workers=0")


def test_tables_through_a_pipe_are_not_cut(devstack, tmp_path):
    """Piped, a table row is one line however wide: the full id and name, never cut at 80 columns."""
    name = "a-long-run-name-that-would-never-fit-in-80-columns"[:48]
    proc = cli(devstack, "run", "--queue", "parked", "--name", name, "--", "x", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    try:
        table = cli(devstack, "ls", "--limit", "5", home=tmp_path)
        assert table.returncode == 0, table.stderr
        (row,) = [line for line in table.stdout.splitlines() if run_id in line]
        assert name in row and "parked" in row and "queued" in row
        assert len(row) > 80
    finally:
        cli(devstack, "kill", run_id, home=tmp_path)


def test_what_a_new_user_reads(devstack, tmp_path):
    """An admin lists another user's runs with ``ls --user`` (a user may not: the API's one line);
    ``ls`` with nothing to show says so instead of an empty table; the hint after a submit keeps
    the run id on its line through a pipe; a run asked for by a name is said to be named by id."""
    token = new_user(devstack, tmp_path, "newcomer")
    name = json.loads(cli(devstack, "whoami", "--json", token=token, home=tmp_path).stdout)["user"]
    empty = cli(devstack, "ls", token=token, home=tmp_path)
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "no runs\n")
    submitted = cli(
        devstack, "run", "--queue", "parked", "--name", "sleeper", "--", "sleep 60", token=token, home=tmp_path
    )
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    try:
        (hint,) = submitted.stderr.splitlines()  # one line, however long, through a pipe
        assert hint.endswith(f"follow with: runplane logs -f {run_id}") and len(hint) > 80, hint
        listed = cli(devstack, "ls", "--user", name, token="admin-token", home=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert [line for line in listed.stdout.splitlines() if run_id in line]
        refused = one_error_line(cli(devstack, "ls", "--user", name, home=tmp_path), 3)  # alice is no admin
        assert refused == "error: listing another user's runs needs the admin scope"
        by_name = one_error_line(cli(devstack, "logs", "sleeper", token=token, home=tmp_path), 3)
        assert by_name == "error: run sleeper not found (runs are named by id: r-...; runplane ls lists yours)"
        by_id = one_error_line(cli(devstack, "status", "r-" + "0" * 24, token=token, home=tmp_path), 3)
        assert by_id == f"error: run r-{'0' * 24} not found"
    finally:
        cli(devstack, "kill", run_id, token=token, home=tmp_path)


def test_tokens_and_whoami(devstack, tmp_path):
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
    assert one_error_line(denied, 3).startswith("error: token of alice lacks the 'admin' permission")
    revoked = cli(devstack, "token", "revoke", token["id"], "--json", token="admin-token", home=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout) == {"id": token["id"], "revoked": True}
    after = cli(devstack, "whoami", token=secret, home=tmp_path)
    assert one_error_line(after, 3) == "error: token is not valid"
    gone = cli(devstack, "token", "revoke", token["id"], token="admin-token", home=tmp_path)
    assert one_error_line(gone, 3).startswith(f"error: token {token['id']} not found")


def test_an_admin_sets_a_users_default_group(devstack, tmp_path):
    name = f"gina-{uuid.uuid4().hex[:6]}"
    made = cli(devstack, "token", "create", name, "-g", "vision", "-g", "nlp", token="admin-token", home=tmp_path)
    secret = made.stdout.strip()
    refused = cli(devstack, "run", "--queue", "parked", "--", "x", token=secret, home=tmp_path)
    assert "you are in several groups (nlp, vision)" in one_error_line(refused, 2)
    set_ = cli(devstack, "user", "set", name, "--default-group", "vision", "--json", token="admin-token", home=tmp_path)
    assert set_.returncode == 0, set_.stderr
    stored = json.loads(set_.stdout)
    assert (stored["default_group"], stored["groups"]) == ("vision", ["nlp", "vision"])
    shown = cli(devstack, "user", "show", name, token="admin-token", home=tmp_path)
    assert shown.stdout.strip() == f"{name}: groups nlp, vision; default group vision"
    me = cli(devstack, "whoami", token=secret, home=tmp_path)
    assert me.stdout.strip() == f"{name} (groups: nlp, vision) (default group: vision); scopes: runs:read, runs:write"
    ran = cli(devstack, "run", "--json", "--queue", "parked", "--", "x", token=secret, home=tmp_path)
    run = json.loads(ran.stdout)
    assert run["group"] == "vision"
    cli(devstack, "kill", run["id"], token=secret, home=tmp_path)
    neither = cli(devstack, "user", "set", name, token="admin-token", home=tmp_path)
    assert one_error_line(neither, 2) == "error: give --default-group GROUP or --no-default-group"
    cleared = cli(devstack, "user", "set", name, "--no-default-group", "--json", token="admin-token", home=tmp_path)
    assert json.loads(cleared.stdout)["default_group"] is None
    denied = cli(devstack, "user", "show", name, token=secret, home=tmp_path)
    assert one_error_line(denied, 3).startswith(f"error: token of {name} lacks the 'admin' permission")


@pytest.mark.slow
def test_every_command_speaks_json(devstack, docker_client, tmp_path):
    """--json prints one JSON document on stdout (logs -f: one per line), nothing else."""

    def data(*args, **kw):
        proc = cli(devstack, *args, home=tmp_path, **kw)
        assert proc.returncode == 0, (args, proc.stderr)
        return json.loads(proc.stdout)

    final = data("run", "--wait", "--json", "--", "echo out; echo err >&2; echo 1 > f")
    assert final["state"] == "succeeded" and final["exit_code"] == 0  # the run's output went to stderr
    run_id = final["id"]
    assert data("status", "--json")["id"] == run_id
    assert run_id in [r["id"] for r in data("ls", "--limit", "3", "--json")["runs"]]
    assert data("logs", "--json") == {"data": "out\n", "next_offset": 4, "complete": True}
    assert data("logs", "--stderr", "--tail", "1", "--json")["data"] == "err\n"
    followed = cli(devstack, "logs", "-f", "--json", home=tmp_path)
    assert [json.loads(line)["data"] for line in followed.stdout.splitlines()] == ["out\n"]
    dest = tmp_path / "out"
    assert data("download", run_id, str(dest), "--json") == {"files": [str(dest / "f")]}
    assert "default" in [p["name"] for p in data("pools", "--json")["pools"]]
    assert isinstance(data("workers", "--json")["workers"], list)
    assert data("whoami", "--json")["user"] == "alice"
    queued = data("run", "--queue", "parked", "--json", "--", "x")
    assert queued["state"] == "queued"
    assert [r["state"] for r in data("kill", queued["id"], "--json")["runs"]] == ["killed"]
    made = data("token", "create", "erin", "--json", token="admin-token")
    assert made["token"].startswith("rp_") and made["user"] == "erin"
    listed = data("token", "ls", "--user", "erin", "--json", token="admin-token")["tokens"]
    assert made["id"] in [t["id"] for t in listed]
    assert data("token", "revoke", made["id"], "--json", token="admin-token") == {"id": made["id"], "revoked": True}


@pytest.mark.slow
def test_kill_all_in_one_state(devstack, tmp_path):
    """kill --all --state queued kills the caller's queued runs, and nothing of anyone else's."""
    token = new_user(devstack, tmp_path, "killer")
    ids = []
    for _ in range(2):
        proc = cli(devstack, "run", "--queue", "parked", "--", "echo never", token=token, home=tmp_path)
        assert proc.returncode == 0, proc.stderr
        ids.append(proc.stdout.strip())
    other = cli(devstack, "run", "--queue", "parked", "--", "x", home=tmp_path)  # alice's: left alone
    assert other.returncode == 0, other.stderr
    try:
        running = cli(devstack, "kill", "--all", "--state", "running", "--json", token=token, home=tmp_path)
        assert (running.returncode, json.loads(running.stdout)) == (0, {"runs": []}), running.stderr
        proc = cli(devstack, "kill", "--all", "--state", "queued", "--json", token=token, home=tmp_path)
        assert proc.returncode == 0, proc.stderr
        killed = json.loads(proc.stdout)["runs"]
        assert sorted(r["id"] for r in killed) == sorted(ids)
        assert {r["state"] for r in killed} == {"killed"}
        assert proc.stderr.strip() == "2 runs killed"
        again = cli(devstack, "kill", "--all", token=token, home=tmp_path)
        assert (again.returncode, again.stderr.strip()) == (0, "0 runs killed")
        alice = Client(devstack.api_url, "alice-token")
        assert alice.get(other.stdout.strip()).state == "queued"
    finally:
        cli(devstack, "kill", other.stdout.strip(), home=tmp_path)


@pytest.mark.slow
def test_login_and_profiles(devstack, tmp_path):
    """login checks the token, then saves URL and token (0600); --profile picks them; profiles
    lists them without tokens."""
    bare = {"RUNPLANE_API_URL": "", "RUNPLANE_TOKEN": ""}  # the profile's settings, not the environment's
    config = tmp_path / ".config" / "runplane" / "config.toml"
    bad = cli(devstack, "login", devstack.api_url, "--token", "wrong", home=tmp_path, env=bare)
    assert one_error_line(bad, 3) == "error: token is not valid"
    assert not config.exists()  # a refused token is never saved
    done = cli(devstack, "login", devstack.api_url, "--profile", "work", home=tmp_path, env=bare, stdin="alice-token\n")
    assert done.returncode == 0, done.stderr
    assert f"as alice; saved as profile 'work' in {config}" in done.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    made = cli(devstack, "login", devstack.api_url, "--json", token="bob-token", home=tmp_path)  # RUNPLANE_TOKEN
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["profile"] == "default" and json.loads(made.stdout)["me"]["user"] == "bob"
    me = cli(devstack, "--profile", "work", "whoami", home=tmp_path, env=bare)
    assert (me.returncode, me.stdout.split(";")[0]) == (0, "alice"), me.stderr
    # the flag wins over the environment's token; without it, the environment wins over the profile
    assert cli(devstack, "--profile", "work", "whoami", token="bob-token", home=tmp_path).stdout.startswith("alice")
    assert cli(devstack, "whoami", token="carol-token", home=tmp_path).stdout.startswith("carol")
    assert cli(devstack, "whoami", home=tmp_path, env=bare).stdout.startswith("bob")  # the default profile
    listed = cli(devstack, "profiles", "--json", home=tmp_path, env=bare)
    assert json.loads(listed.stdout) == [
        {"name": "work", "url": devstack.api_url, "current": False},
        {"name": "default", "url": devstack.api_url, "current": True},
    ]
    table = cli(devstack, "--profile", "work", "profiles", home=tmp_path, env=bare)
    assert "work" in table.stdout and devstack.api_url in table.stdout
    assert "alice-token" not in table.stdout + listed.stdout and "bob-token" not in table.stdout + listed.stdout
    unknown = cli(devstack, "--profile", "prod", "ls", home=tmp_path, env=bare)
    assert "no profile 'prod'" in one_error_line(unknown, 2)


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
    assert alice.get(run_id).state == "killed"


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
    run = Client(devstack.api_url, "alice-token").get(run_id)
    assert len([e for e in run.events if e.state == "preparing"]) == 1


def test_download_shows_progress_on_a_terminal(devstack, docker_client, tmp_path):
    """With stderr on a terminal, download draws a progress bar there; stdout still lists the files."""
    import pty

    proc = cli(devstack, "run", "--wait", "--", "head -c 3000000 /dev/zero > big; echo x > small", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    leader, follower = pty.openpty()
    env = {**os.environ, "RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": "alice-token", "HOME": str(tmp_path)}
    try:
        down = subprocess.run(
            [sys.executable, "-m", "runplane.cli", "download", proc.stderr.split()[0], str(tmp_path / "out")],
            stdout=subprocess.PIPE, stderr=follower, text=True, env={**env, "TERM": "xterm"}, timeout=120,
        )  # fmt: skip
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all is read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    assert down.returncode == 0, drawn
    assert down.stdout.splitlines() == [str(tmp_path / "out" / "big"), str(tmp_path / "out" / "small")]
    assert b"outputs" in drawn and b"\x1b[" in drawn  # the bar, drawn with a terminal's escape codes
    assert (tmp_path / "out" / "big").stat().st_size == 3000000
