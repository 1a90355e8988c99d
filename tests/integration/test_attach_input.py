"""An interactive run's input (``worker_agent.sessions.attach.Input``) on the real Docker engine: the
one attach of its container's stdin that every attach session writes into, ended by an EOF only:
without a terminal the command's end of input, with one ^D typed into it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import TEST_IMAGE
from worker_agent.sessions.attach import Input

pytestmark = pytest.mark.docker


def _started(docker_client: Any, command: str, tty: bool) -> Any:
    container = docker_client.containers.create(
        TEST_IMAGE,
        ["sh", "-c", command],
        stdin_open=True,
        tty=tty,
        detach=tty,  # as container_spec: without a terminal, StdinOnce
        network_mode="none",
        labels={"io.runplane.test": "attach-input"},
    )
    container.start()
    return container


def _until_logged(docker_client: Any, container: Any, text: str) -> str:
    deadline = time.monotonic() + 30
    while text not in (logged := docker_client.api.logs(container.id).decode()):
        assert time.monotonic() < deadline, logged
        time.sleep(0.1)
    return logged


def test_input_outlives_its_attach_sessions_and_only_an_eof_ends_it(docker_client):
    api, now = docker_client.api, [0.0]
    lines = _started(docker_client, "while read l; do echo got-$l; done; echo input-ended; sleep 60", tty=False)
    terminal = _started(docker_client, "cat; echo cat-done; sleep 60", tty=True)
    try:
        given, typed = Input(lambda: now[0]), Input(lambda: now[0])
        given.hold(api, lines.id, tty=False)  # the first attach session
        given.write(b"one\n")
        _until_logged(docker_client, lines, "got-one")
        now[0] = 7.0
        assert given.idle() == 7.0
        given.hold(api, lines.id, tty=False)  # a second one, after the first left: the same input
        given.write(b"two\n")
        _until_logged(docker_client, lines, "got-two")
        given.end()
        assert "input-ended" in _until_logged(docker_client, lines, "input-ended")
        assert given.idle() is None  # nothing more is waited for
        typed.hold(api, terminal.id, tty=True)
        typed.write(b"x\n")
        typed.end()  # ^D at the start of a line: cat ends, the terminal goes on
        assert _until_logged(docker_client, terminal, "cat-done").endswith("x\r\nx\r\ncat-done\r\n")
        assert typed.idle() == 0.0
        for held in (given, typed):
            held.release()
            held.release()
    finally:
        for container in (lines, terminal):
            container.remove(force=True)
