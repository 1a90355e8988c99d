"""``runplane secret set|ls|rm`` and ``runplane run --secret``/``--image-pull-secret`` as a user
runs them: a separate process talking HTTP to the local stack. The value comes from stdin (one
trailing newline taken off), a file, never from a flag; it is printed by no command; every error
is one line with README.md's exit codes (2 usage, also 400/422 answers; 3 refused, 404 included)."""

from __future__ import annotations

import json
import os
import re
import sys
import uuid

import pytest

from tests.e2e.test_cli import cli, new_user, one_error_line

pytestmark = pytest.mark.docker


def cells(line: str) -> list[str]:
    """The cells of a table row as ``runplane`` prints it (rich's box), or [] for a rule."""
    return [c.strip() for c in re.split("[│┃]", line)[1:-1]]


def test_set_from_stdin_and_a_file_list_use_and_remove(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "secrets")
    value = f"wandb-{uuid.uuid4().hex}"

    def run(*args, stdin=None):
        return cli(devstack, *args, token=token, home=tmp_path, stdin=stdin)

    made = run("secret", "set", "wandb", stdin=value + "\n")  # what `echo "$KEY" |` sends
    assert made.returncode == 0, made.stderr
    assert made.stderr.strip() == f"wandb: set ({len(value)} bytes); a run uses it with --secret ENV=wandb"
    assert value not in made.stdout + made.stderr
    crlf = run("secret", "set", "crlf", "--json", stdin="abcd\r\n")
    assert json.loads(crlf.stdout)["size"] == 4  # one line end taken off, \r\n too
    key_file = tmp_path / "key.json"
    key_file.write_text('{"k": 1}\n')
    from_file = run("secret", "set", "key-file", "--from-file", str(key_file), "--json")
    assert json.loads(from_file.stdout)["size"] == len('{"k": 1}\n')  # a file is taken whole

    listed = run("secret", "ls")
    assert listed.returncode == 0, listed.stderr
    header, *rows = [cells(line) for line in listed.stdout.splitlines() if cells(line)]
    assert header == ["ref", "scope", "size", "updated", "by"], listed.stdout
    user = rows[0][4]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("crlf", f"user {user}", "4"),
        ("key-file", f"user {user}", "9"),
        ("wandb", f"user {user}", str(len(value))),
    ]
    assert value not in listed.stdout
    as_json = json.loads(run("secret", "ls", "--json").stdout)["secrets"]
    assert {s["ref"]: s["size"] for s in as_json} == {"crlf": 4, "key-file": 9, "wandb": len(value)}
    assert all(set(s) == {"name", "ref", "scope", "owner", "size", "updated_at", "updated_by"} for s in as_json)

    submitted = run(
        "run", "--json", "--queue", "parked", "--secret", "TOKEN=wandb", "--image-pull-secret", "key-file", "--", "x"
    )
    assert submitted.returncode == 0, submitted.stderr
    spec = json.loads(submitted.stdout)["spec"]
    assert (spec["secrets"], spec["image_pull_secret"]) == ({"TOKEN": "wandb"}, "key-file")
    assert value not in submitted.stdout
    assert run("kill", json.loads(submitted.stdout)["id"]).returncode == 0

    removed = run("secret", "rm", "wandb", "--json")
    assert json.loads(removed.stdout) == {"ref": "wandb", "deleted": True}
    assert one_error_line(run("secret", "rm", "wandb"), 3) == "error: secret wandb does not exist"
    missing = run("run", "--queue", "parked", "--secret", "TOKEN=wandb", "--", "x")
    assert one_error_line(missing, 3) == "error: secret wandb does not exist"
    for name in ("crlf", "key-file"):
        assert run("secret", "rm", name).returncode == 0


@pytest.mark.parametrize(
    ("args", "stdin", "message", "code"),
    [
        (["secret", "set", "empty"], "\n", "error: the value from stdin is empty: nothing was set", 2),
        (["secret", "set", "f", "--from-file", "/nonexistent/key"], None, "error: cannot read /nonexistent/key", 2),
        (["secret", "set", "Bad Name"], "value", "error: ", 2),  # answered 422
        (["secret", "set", "hf", "--group", "vision"], "value", "error: ", 3),  # alice is no admin: 403
        (["secret", "rm", "never-set"], None, "error: secret never-set does not exist", 3),
        (["run", "--secret", "TOKEN", "--", "x"], None, "error: --secret must look like ENV=NAME", 2),
        (["run", "--secret", "A=x", "--secret", "A=y", "--", "x"], None, "error: --secret names A twice", 2),
        (["run", "--env", "A=1", "--secret", "A=x", "--", "x"], None, "error: A is given by --env and by --secret", 2),
        (["run", "--queue", "parked", "--secret", "A=bob-only", "--", "x"], None, "error: secret bob-only does", 3),
        (["run", "--queue", "parked", "--image-pull-secret", "bob-only", "--", "x"], None, "error: secret bob-only", 3),
    ],
)
def test_errors_are_one_line(devstack, tmp_path, args, stdin, message, code):
    bob = cli(devstack, "secret", "set", "bob-only", token="bob-token", home=tmp_path, stdin="bob's value")
    assert bob.returncode == 0, bob.stderr
    line = one_error_line(cli(devstack, *args, home=tmp_path, stdin=stdin), code)  # as alice
    assert line.startswith(message)
    assert "bob's value" not in line


def test_an_admin_sets_a_groups_secret_its_members_list_and_use(devstack, tmp_path):
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = cli(devstack, "token", "create", "dana", "--group", group, "--json", token="admin-token", home=tmp_path)
    token = json.loads(member.stdout)["token"]
    made = cli(devstack, "secret", "set", "hf", "--group", group, token="admin-token", home=tmp_path, stdin="hf_x\n")
    assert made.returncode == 0, made.stderr
    assert made.stderr.startswith(f"{group}/hf: set (4 bytes)")
    try:
        listed = json.loads(cli(devstack, "secret", "ls", "--json", token=token, home=tmp_path).stdout)["secrets"]
        assert [(s["ref"], s["scope"], s["owner"]) for s in listed] == [(f"{group}/hf", "group", group)]
        group_ls = cli(devstack, "secret", "ls", "--group", group, token="admin-token", home=tmp_path)
        assert f"{group}/hf" in group_ls.stdout and f"group {group}" in group_ls.stdout
        run = cli(
            devstack, "run", "--queue", "parked", "--secret", f"HF={group}/hf", "--", "x", token=token, home=tmp_path
        )
        assert run.returncode == 0, run.stderr
        cli(devstack, "kill", run.stdout.strip(), token=token, home=tmp_path)
        outsider = cli(devstack, "run", "--queue", "parked", "--secret", f"HF={group}/hf", "--", "x", home=tmp_path)
        assert one_error_line(outsider, 3) == f"error: secret {group}/hf does not exist"
    finally:
        removed = cli(devstack, "secret", "rm", "hf", "--group", group, token="admin-token", home=tmp_path)
        assert removed.returncode == 0, removed.stderr


def _at_a_terminal(devstack, home, args, answers):
    """``runplane ARGS`` with a terminal of its own (its controlling one, as getpass reads): each of
    ``answers`` typed after the next prompt. Returns (exit status, what the terminal showed)."""
    import pty

    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TERM": "xterm"}
    env |= {"RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": "alice-token"}
    pid, leader = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        os.execve(sys.executable, [sys.executable, "-m", "runplane.cli", *args], env)
    shown = b""
    try:
        for answer in answers:
            while not shown.rstrip().endswith(b":"):
                shown += os.read(leader, 4096)
            os.write(leader, answer.encode() + b"\n")
            shown += b"|"  # where an answer went (typed, never echoed)
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child has exited and closed the terminal
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


def test_at_a_terminal_the_value_is_asked_twice_and_never_shown(devstack, tmp_path):
    value = f"typed-{uuid.uuid4().hex}"
    code, shown = _at_a_terminal(devstack, tmp_path, ["secret", "set", "typed"], [value, value])
    assert code == 0, shown
    assert "value of typed (not shown):" in shown and "again:" in shown
    assert f"typed: set ({len(value)} bytes)" in shown and value not in shown
    code, shown = _at_a_terminal(devstack, tmp_path, ["secret", "set", "typed"], ["one-value", "another"])
    assert code == 2 and "error: the two values differ: nothing was set" in shown, shown
    sizes = {s["ref"]: s["size"] for s in json.loads(cli(devstack, "secret", "ls", "--json").stdout)["secrets"]}
    assert sizes["typed"] == len(value)  # the second, refused, changed nothing
    assert cli(devstack, "secret", "rm", "typed").returncode == 0
