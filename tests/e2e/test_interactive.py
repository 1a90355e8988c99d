"""Interactive runs (``runplane run -it``, ``run -i``, ``runplane attach``) as a user runs them, on
the local stack with the real Docker engine: the CLI a separate process (under tmux for a
terminal), the relay the stack's front, the worker a local agent of the stack. The test pools'
``default`` has ``max_idle_interactive: 15s``."""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runplane.client import Client, Conflict, InvalidRequest, NotFound, Run
from runplane.client.sessions import Access, Link, meet, open_link, pump_exec
from runplane.domain.session_wire import STDIN, FrameType
from tests.e2e.test_cli import cli
from tests.e2e.test_sessions import MISSING

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(bool(MISSING), reason=f"sessions need {', '.join(MISSING)}, not in this tree yet"),
]


def _until_running(run: Run) -> Run:
    deadline = time.monotonic() + 120
    while run.refresh(wait=5).state != "running":
        assert not run.done and time.monotonic() < deadline, run.view
    return run


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_run_it_gives_the_command_a_terminal_and_ends_as_the_shell_did(devstack, tmp_path):
    name = f"rp-{uuid.uuid4().hex[:8]}"
    env = f"RUNPLANE_API_URL={devstack.api_url} RUNPLANE_TOKEN=alice-token TERM=xterm HOME={tmp_path}"
    cli_ = f"env {env} {sys.executable} -m runplane.cli"
    # ~. leaves the run going; runplane attach (the last run) joins it again
    command = f"{cli_} run -it -- sh; echo run-exit-$?; {cli_} attach; echo attach-exit-$?; sleep 60"

    def screen() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout

    shown = [""]

    def until(text: str) -> str:
        deadline = time.monotonic() + 90
        while text not in (seen := screen()):
            shown[0] = seen or shown[0]
            assert time.monotonic() < deadline, (text, shown[0])
            time.sleep(0.2)
        return seen

    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "40", command], check=True)
    try:
        run_id = re.search(r"(r-[0-9a-f]{24}) submitted", until(" submitted to pool default"))
        assert run_id is not None
        until("built-in shell (ash)")  # written before the terminal joined: replayed from the engine's log
        until("output $")  # the shell's prompt
        # ~. with the line it ends: busybox's sh asks the terminal where its cursor is after each
        # line, and the answer (input too) would come between them
        subprocess.run(["tmux", "send-keys", "-t", name, "echo one-$((1+1))", "Enter", "~."], check=True)
        until("it goes on (runplane attach")
        until("run-exit-0")
        subprocess.run(["tmux", "send-keys", "-t", name, "echo typed-$((6*7)); stty size; exit 0", "Enter"], check=True)
        until("typed-42")
        until("40 120")  # the run's terminal has the size of the one it was typed in
        until("attach-exit-0")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    run = Client(devstack.api_url, "alice-token").get(run_id.group(1))
    assert (run.state, run.exit_code) == ("succeeded", 0), run.view
    logs = run.logs()  # what the shell printed is the run's log
    assert "one-2" in logs and "typed-42" in logs, logs
    attached = [e.message for e in run.view.events if e.message.startswith("attach by alice, ")]
    assert len(attached) == 2 and attached[-1].endswith("exit 0"), run.view.events


def test_run_i_feeds_piped_stdin_and_exits_as_the_command_did(devstack):
    proc = cli(devstack, "run", "-i", "--", "sh", stdin="echo hi; echo err >&2; exit 3\n")
    assert (proc.returncode, proc.stdout) == (3, "hi\n"), proc.stderr
    assert "err\n" in proc.stderr
    run = _until_running(Client(devstack.api_url, "alice-token").submit("cat; echo err >&2; exit 4", interactive=True))
    result = run.attach(stdin=b"\x00\xffbytes")  # the SDK's: fed, its input ended, its output taken
    assert (result.exit_code, result.stdout, result.stderr) == (4, b"\x00\xffbytes", b"err\n")
    assert run.wait(timeout=60).state == "failed"
    old = cli(devstack, "run", "-i", "data=run:r-0/x", "--", "true")  # --input's short flag, before -i was this
    assert old.returncode == 2 and "an input is --input NAME=SOURCE" in old.stderr, old


def test_attach_is_the_owners_one_at_a_time_and_an_idle_run_is_killed_saying_why(devstack):
    alice, bob = Client(devstack.api_url, "alice-token"), Client(devstack.api_url, "bob-token")
    with pytest.raises(InvalidRequest, match="a sweep's runs cannot be interactive"):
        alice.submit_sweep("cat", parameters={"A": [1, 2]}, interactive=True)
    with pytest.raises(InvalidRequest, match="tty is for an interactive run"):
        alice.submit("sh", tty=True)
    batch = _until_running(alice.submit("sleep 600"))
    idle = alice.submit("cat", interactive=True)  # its 15 s without input count from its start
    try:
        _until_running(idle)
        with pytest.raises(NotFound):
            bob.open_session(idle.id, "attach")
        with pytest.raises(Conflict, match="is not interactive"):
            alice.open_session(batch.id, "attach")
        alice.open_session(idle.id, "attach")  # taken, never joined: it holds the run's one attach
        with pytest.raises(Conflict, match="has an attach session already"):
            alice.open_session(idle.id, "attach")
        batch.kill()
        idle.wait(timeout=120)  # no input for 15 s
        assert idle.state == "killed", idle.view
        assert idle.failure is not None and idle.failure.reason == "killed", idle.view
        assert idle.failure.message == "no input for 15s (max_idle_interactive)", idle.view
    finally:
        for run in (idle, batch):
            if not run.refresh().done:
                run.kill()


def _until_output(link: Link, text: bytes) -> bytes:
    seen, deadline = b"", time.monotonic() + 60
    while text not in seen:
        assert time.monotonic() < deadline, seen
        frame = link.receive(timeout=1.0)
        if frame is not None and frame.type == FrameType.DATA:
            seen += frame.payload
    return seen


@contextlib.contextmanager
def _attached(client: Client, run: Run) -> Iterator[tuple[Link, dict[str, Any]]]:
    """An attach session to ``run``: its link and the worker's HELLO; left (closed) at the end."""
    answer = client.open_session(run.id, "attach")
    link = open_link(Access.read(answer))
    try:
        yield link, meet(link)
    finally:  # left as ~. or a dropped client leaves, and closed
        link.close()
        client.close_session(run.id, answer.id)


def test_leaving_an_attach_ends_no_input_and_an_eof_is_a_terminals_own(devstack):
    alice = Client(devstack.api_url, "alice-token")
    reader = "trap 'exit 5' TERM; while read l; do echo got-$l; done; echo input-ended; while :; do sleep 1; done"
    lines = alice.submit(reader, interactive=True)
    tty = alice.submit("timeout 30 cat; echo cat-$?", interactive=True, tty=True)
    try:  # each has 15 s from its start to its first input (max_idle_interactive)
        _until_running(lines)
        _until_running(tty)
        # with a terminal, the end of the input is ^D typed into it: cat ends, the attach has its EXIT
        result = tty.attach(stdin=b"x\n")
        assert result.exit_code == 0 and result.stdout.endswith(b"x\r\ncat-0\r\n"), result
        with _attached(alice, lines) as (link, hello):  # typed, then left: the command's input goes on
            assert "input" not in hello, hello
            link.send(FrameType.DATA, STDIN, b"one\n")
            _until_output(link, b"got-one\n")
        with _attached(alice, lines) as (link, _):  # a second attach types into it, then ends its input
            link.send(FrameType.DATA, STDIN, b"two\n")
            link.send(FrameType.EOF, STDIN)
            _until_output(link, b"got-two\ninput-ended\n")
        with _attached(alice, lines) as (link, hello):  # a third is told it has the output only
            assert hello.get("input") == "ended", hello
            link.send_signal(signal.SIGTERM)
            assert pump_exec(link, lambda channel, data: None) == 5
    finally:
        for run in (lines, tty):
            if not run.refresh().done:
                with contextlib.suppress(Conflict):  # it may finish between the look and the kill
                    run.kill()


def test_run_i_of_a_command_that_ends_at_once_shows_its_output_and_exits_as_it_did(devstack, tmp_path):
    # over before (or while) its attach is joined: the worker ends the session it cannot serve, the
    # CLI stops waiting when the run is no longer running, writes the run's logs and exits with its code
    proc = cli(devstack, "run", "-i", "--", "sh", "-c", "echo quick; exit 5", home=tmp_path, timeout=45)
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    assert proc.stdout == "quick\n", (proc.stdout, proc.stderr)
    assert "session ended" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
