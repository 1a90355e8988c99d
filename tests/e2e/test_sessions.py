"""``runplane exec``, ``shell`` and ``port-forward`` as a user runs them, into a run of the local
stack on the real Docker engine: the CLI a separate process, the relay the stack's front, the
worker a local agent of the stack."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from runplane.client import Client, NotFound, Run
from tests.e2e.test_cli import cli, one_error_line

MISSING = [
    part
    for module, part in (
        ("runplane.adapters.local.sessions", "the session stores"),
        ("runplane.api.routes.sessions", "the sessions API"),
        ("runplane.devstack.relay", "the one-machine relay"),
        ("worker_agent.sessions", "the agent's side of sessions"),
    )
    if importlib.util.find_spec(module) is None
]
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(bool(MISSING), reason=f"sessions need {', '.join(MISSING)}, not in this tree yet"),
]

HTTPD = (
    "mkdir -p /tmp/www && echo served-by-the-run > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8000 -h /tmp/www"
)


@contextlib.contextmanager
def _running(api: Client, command: str) -> Iterator[Run]:
    run = api.submit(command, queue="default")
    try:
        deadline = time.monotonic() + 120
        while run.refresh(wait=5).state != "running":
            assert not run.done and time.monotonic() < deadline, run.view
        yield run
    finally:
        if not run.refresh().done:
            run.kill()


@pytest.fixture
def sleeping(devstack) -> Iterator[Run]:
    """A run of alice's that sleeps (without network, as runs are by default)."""
    with _running(Client(devstack.api_url, "alice-token"), "sleep 600") as run:
        yield run


def test_exec_feeds_stdin_and_exits_as_the_command_did(devstack, sleeping):
    proc = cli(devstack, "exec", "-i", sleeping.id, "--", "sh", stdin="echo hi; echo err >&2; exit 3\n")
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "hi\n", "err\n")
    missing = cli(devstack, "exec", sleeping.id, "--", "no-such-command")
    assert missing.returncode in (126, 127) and "not found" in missing.stdout + missing.stderr, missing
    result = sleeping.exec(["sh", "-c", "cat; exit 5"], stdin=b"\x00\xffbytes")
    assert (result.exit_code, result.stdout, result.stderr) == (5, b"\x00\xffbytes", b"")


def test_another_users_exec_is_not_found_and_a_run_not_running_is_said(devstack, sleeping):
    proc = cli(devstack, "exec", sleeping.id, "--", "true", token="bob-token")
    assert one_error_line(proc, 3) == f"error: run {sleeping.id} not found"
    with pytest.raises(NotFound):
        Client(devstack.api_url, "bob-token").get(sleeping.id)
    queued = Client(devstack.api_url, "alice-token").submit("true", queue="parked")  # no worker: stays queued
    try:
        proc = cli(devstack, "port-forward", queued.id, "0:80")
        assert one_error_line(proc, 3) == f"error: run {queued.id} is not running (queued)"
    finally:
        queued.kill()


def test_interrupt_reaches_the_command_without_a_terminal(devstack, sleeping):
    env = {**os.environ, "RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": "alice-token"}
    script = 'trap "echo got-int; exit 7" INT; echo ready; while true; do sleep 0.1; done'
    proc = subprocess.Popen(
        [sys.executable, "-m", "runplane.cli", "exec", sleeping.id, "--", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)  # a SIGNAL frame: the command's trap answers
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out) == (7, "got-int\n"), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_exec_goes_on_through_dropped_relay_connections(devstack, sleeping):
    """The relay's connections of both sides drop mid-command (no GONE, no close): both sides dial
    again (the client with a fresh ticket, the worker with a new secret) and the session resumes."""
    api, hub = Client(devstack.api_url, "alice-token"), devstack._relay
    got: dict[str, object] = {}
    command = ["sh", "-c", "echo before; sleep 2; echo after; exit 3"]
    execing = threading.Thread(target=lambda: got.setdefault("result", sleeping.exec(command)), daemon=True)
    execing.start()
    deadline = time.monotonic() + 60
    while not (live := [s.id for s in api.sessions(sleeping.id) if s.state == "active"]) or len(hub.held(live[0])) < 2:
        assert execing.is_alive() and time.monotonic() < deadline, got
        time.sleep(0.05)
    assert hub.abort(live[0]) == 2
    execing.join(60)
    result = got["result"]
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"before\nafter\n", b""), result  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30  # the worker writes the end once the client hung up
    while (ended := next(s for s in api.sessions(sleeping.id) if s.id == live[0])).ended_at is None:
        assert time.monotonic() < deadline, ended
        time.sleep(0.2)
    assert (ended.end_reason, ended.exit_code) == ("exited", 3)  # one session, resumed: not lost


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=20) as answer:
        return answer.read().decode()


def test_port_forward_reaches_a_server_inside_a_run_without_network(devstack):
    api = Client(devstack.api_url, "alice-token")
    with _running(api, HTTPD) as run:
        local = _free_port()
        env = {**os.environ, "RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": "alice-token"}
        forward = subprocess.Popen(
            [sys.executable, "-m", "runplane.cli", "port-forward", run.id, f"{local}:8000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            assert forward.stdout is not None
            line = forward.stdout.readline()
            assert line.strip() == f"forwarding 127.0.0.1:{local} -> port 8000 of {run.id}", forward.stderr
            got: list[str] = []
            fetches = [threading.Thread(target=lambda: got.append(_get(local))) for _ in range(2)]
            for fetch in fetches:
                fetch.start()
            for fetch in fetches:
                fetch.join(timeout=60)
            assert got == ["served-by-the-run\n"] * 2
            with run.port_forward(8000) as fwd:  # the SDK's, beside the CLI's
                assert _get(fwd.local_port) == "served-by-the-run\n"
            run.kill()
            _, stderr = forward.communicate(timeout=60)
            assert forward.returncode == 0, stderr
            assert f"run {run.id} ended (killed); closing 127.0.0.1:{local}" in stderr
        finally:
            if forward.poll() is None:
                forward.kill()
                forward.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_shell_at_a_terminal_follows_its_size(devstack, sleeping):
    name = f"rp-{uuid.uuid4().hex[:8]}"
    env = f"RUNPLANE_API_URL={devstack.api_url} RUNPLANE_TOKEN=alice-token TERM=xterm"
    command = f"env {env} {sys.executable} -m runplane.cli shell {sleeping.id}; echo shell-exit-$?; sleep 60"

    def screen() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout

    def until(text: str) -> str:
        deadline = time.monotonic() + 60
        while text not in (seen := screen()):
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
        return seen

    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "40", command], check=True)
    try:
        until("$")  # the shell's prompt (nothing else on the screen has one yet)
        subprocess.run(["tmux", "send-keys", "-t", name, "echo marker-$((6*7)); stty size", "Enter"], check=True)
        until("marker-42")
        until("40 120")
        subprocess.run(["tmux", "resize-window", "-t", name, "-x", "100", "-y", "30"], check=True)
        # the client hears of the resize by a signal, the keys typed after it by its terminal: on a loaded
        # machine those may come first, so the size is asked again until the new one shows
        deadline = time.monotonic() + 60
        while "30 100" not in (seen := screen()):
            assert time.monotonic() < deadline, seen
            subprocess.run(["tmux", "send-keys", "-t", name, "stty size", "Enter"], check=True)
            time.sleep(1)
        subprocess.run(["tmux", "send-keys", "-t", name, "ls /inputs; exit 4", "Enter"], check=True)
        until("shell-exit-4")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
