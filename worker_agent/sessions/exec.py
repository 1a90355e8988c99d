"""A command in a run's container for a session (``exec``, ``shell``): ``docker exec`` through the
engine's API, as the container's user, in its working directory, with its environment and
``RUNPLANE_SESSION`` (and ``TERM``), never privileged. Its input comes from the client's STDIN
frames, its output goes back as DATA (without a terminal the engine's stream carries stdout and
stderr in 8-byte-headed pieces, which are taken apart here), and EXIT follows the last of it. When
the session ends first, everything the command started is killed (procs.py): nothing of it is
left running in the run."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors
import requests
from websockets.exceptions import ConnectionClosed

from runplane.domain.session_wire import (
    MAX_PAYLOAD,
    STDERR,
    STDIN,
    STDOUT,
    Frame,
    FrameType,
    chunks,
    json_frame,
    read_resize,
)
from runplane.domain.sessions import Session, SessionKind
from worker_agent.sessions.link import Link
from worker_agent.sessions.procs import Proc, Procs, end_session

log = logging.getLogger(__name__)

SHELL = ["/bin/sh", "-c", "command -v bash >/dev/null && exec bash || exec sh"]
"""What ``shell`` runs: the image's bash if it has one, else its sh (every run's image has /bin/sh)."""
EXIT_STATUS_SECONDS = 5.0
"""How long the command's exit status is waited for once its output ended."""
_STREAM_HEADER = struct.Struct(">BxxxL")
_CHANNELS = {1: STDOUT, 2: STDERR}


class ExecFailed(Exception):
    """The command could not be started in the run's container."""


def command_of(session: Session) -> list[str]:
    return list(SHELL) if session.kind == SessionKind.SHELL else list(session.command or [])


def describe(session: Session, limit: int = 60) -> str:
    """The command as a timeline says it, clipped."""
    text = shlex.join(command_of(session)) if session.kind == SessionKind.EXEC else "shell"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ExecSession:
    """The command of ``session`` in container ``container`` (a docker Container, inspected),
    its output sent on ``link`` by a thread of its own."""

    def __init__(
        self,
        api: Any,
        container: Any,
        session: Session,
        link: Link,
        procs: Procs,
        run_ending: Callable[[], bool] = lambda: False,
    ) -> None:
        self.api, self.container, self.session, self.link, self.procs = api, container, session, link, procs
        self.run_ending = run_ending
        self.exec_id = ""
        self.pid = 0
        self.proc: Proc | None = None
        """The command's process as it started (a pid reused since is not it)."""
        self.cgroup: Path | None = None
        """The session's own cgroup (procs.Procs.confine), if one could be made."""
        self.exit_code: int | None = None
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        self._output: threading.Thread | None = None

    def start(self, rows: int | None, cols: int | None) -> None:
        """Start the command and the thread that sends its output. Raises ExecFailed."""
        session = self.session
        config = self.container.attrs.get("Config") or {}
        env = {"RUNPLANE_SESSION": session.id}
        if session.term or session.tty:
            env["TERM"] = session.term or "xterm"
        try:
            created = self.api.exec_create(
                self.container.id,
                command_of(session),
                stdout=True,
                stderr=True,
                stdin=session.stdin,
                tty=session.tty,
                privileged=False,
                user=config.get("User") or "",
                environment=env,
                workdir=config.get("WorkingDir") or None,
            )
            self.exec_id = created["Id"]
            hijacked = self.api.exec_start(self.exec_id, socket=True, tty=session.tty)
        except (docker.errors.APIError, requests.RequestException) as e:
            raise ExecFailed(f"the command could not start: {e}") from e
        self._sock = hijacked._sock
        # the engine's socket keeps the client's request timeout (docker-py's, 60 s by default): a
        # command silent for longer is not over, nor is input the command reads slowly lost
        self._sock.settimeout(None)
        self.pid = self._exec_pid()
        if self.pid:
            self.proc = self.procs.stat(self.pid)
            self.cgroup = self.procs.confine(self.container.id, self.pid, session.id)
        if session.tty and rows and cols:
            self.resize(rows, cols)
        self._output = threading.Thread(target=self._send_output, name=f"session-{session.id}-out", daemon=True)
        self._output.start()

    def _exec_pid(self) -> int:
        for _ in range(50):
            try:
                pid = int(self.api.exec_inspect(self.exec_id).get("Pid") or 0)
            except (docker.errors.APIError, requests.RequestException):
                pid = 0
            if pid > 0:
                return pid
            time.sleep(0.01)
        return 0

    # -- from the client ------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        sock = self._sock
        if sock is None:
            return
        if frame.type == FrameType.DATA and frame.channel == STDIN and self.session.stdin:
            # blocks while the command reads nothing: the client waits; an error: the command closed
            # its input or ended, and EXIT is on its way
            with contextlib.suppress(OSError):
                sock.sendall(frame.payload)
        elif frame.type == FrameType.EOF and frame.channel == STDIN and self.session.stdin:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        elif frame.type == FrameType.RESIZE and self.session.tty:
            self.resize(*read_resize(frame))
        elif frame.type == FrameType.SIGNAL and self.pid and frame.payload:
            self.signal(frame.payload[0])

    def resize(self, rows: int, cols: int) -> None:
        try:
            self.api.exec_resize(self.exec_id, height=rows, width=cols)
        except (docker.errors.APIError, requests.RequestException) as e:
            log.info("session %s: resize failed: %s", self.session.id, e)

    def signal(self, signo: int) -> None:
        """Send ``signo`` on: with a terminal, to its foreground process group (the job the
        terminal's ^C would reach: the command itself, or what its shell runs in the foreground);
        else to the command. Only to processes of the session that are still those listed."""
        exec_proc = self.proc
        if exec_proc is None or not 0 < signo < signal.NSIG:
            return
        targets = [exec_proc]
        if self.session.tty:
            now = self.procs.stat(exec_proc.pid)
            if now is None or now.start != exec_proc.start:
                return  # the command ended: nothing of the session is in the foreground
            found = self.procs.of_session(self.container.id, self.pid, self.session.id, self.cgroup)
            targets = [p for p in found if now.tpgid > 0 and p.pgrp == now.tpgid] or [exec_proc]
        for proc in targets:
            pidfd = self.procs.signal(proc, self.container.id, signo)
            if pidfd is not None:
                os.close(pidfd)

    # -- to the client --------------------------------------------------------------------

    def _send_output(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            pump_output(sock, self.session.tty, self._data)
        except ConnectionClosed:
            return  # the client is gone: the session ends the command (stop)
        if self._stopping.is_set() or self._run_over():
            return  # the run's end ended it: the session ends with the run (GONE run_ended), no EXIT
        self.exit_code = self._exit_status()
        with contextlib.suppress(ConnectionClosed):
            self.link.send(json_frame(FrameType.EXIT, {"code": self.exit_code}))
        self.link.close()  # the session's reader sees the end

    def _run_over(self) -> bool:
        """Whether the run is ending (killed, handed back, taken away) or its container stopped."""
        if self.run_ending():
            return True
        try:
            state = self.api.inspect_container(self.container.id).get("State") or {}
        except (docker.errors.APIError, requests.RequestException):
            return True
        return not state.get("Running")

    def _data(self, channel: int, data: bytes) -> None:
        for piece in chunks(channel, data):
            if piece:
                self.link.send(Frame(FrameType.DATA, channel, 0, piece))

    def _exit_status(self) -> int:
        deadline = time.monotonic() + EXIT_STATUS_SECONDS
        while True:
            try:
                info = self.api.exec_inspect(self.exec_id)
            except (docker.errors.APIError, requests.RequestException):
                return 255
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() >= deadline:
                return 255
            time.sleep(0.02)

    # -- the end --------------------------------------------------------------------------

    def stop(self) -> None:
        """End the command and all it started (unless it ended of itself), close its stream and
        wait for the output thread. Idempotent."""
        with self._stop_lock:
            output = self._output
            if self._sock is None:
                return
            if output is not None and output.is_alive():
                self._stopping.set()  # no EXIT: the command is ended, it did not end
            # what it started and left behind too (a background child), whether it ended or not
            left = end_session(self.procs, self.container.id, self.pid or None, self.session.id, self.cgroup)
            if left:
                log.warning(
                    "session %s: %d of its processes still run after SIGKILL: %s",
                    self.session.id,
                    len(left),
                    [p.pid for p in left],
                )
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        if output is not None and output is not threading.current_thread():
            output.join(timeout=EXIT_STATUS_SECONDS + 5)
        with self._stop_lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def pump_output(sock: socket.socket, tty: bool, data: Callable[[int, bytes], None]) -> None:
    """Hand what the engine's hijacked stream of an exec or attach (``sock``) carries to ``data``, by
    channel, until it ends or breaks: with a terminal, its bytes as they come (all STDOUT); without,
    the engine's frames (an 8-byte header: the stream, 1 stdout or 2 stderr, and the size). What
    ``data`` raises goes up (websockets' ConnectionClosed: the client is gone)."""
    try:
        if tty:
            while chunk := sock.recv(MAX_PAYLOAD):
                data(STDOUT, chunk)
            return
        while header := _recv_exactly(sock, _STREAM_HEADER.size):
            stream, size = _STREAM_HEADER.unpack(header)
            payload = _recv_exactly(sock, size)
            data(_CHANNELS.get(stream, STDOUT), payload)
            if len(payload) < size:
                return
    except OSError:
        return  # the stream broke: the command's end, as an end of output would be


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            break
        data += piece
    return data
