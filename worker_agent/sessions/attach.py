"""An interactive run's own command for a session (``attach``): the engine's attach stream of the run's
container (created with its stdin open, and a terminal where the run has one) for its output, sent
back as DATA, RESIZE made the container's terminal size, and EXIT with the container's exit code
once the command ended of itself. The command's input is ``Input``: one attach of the container's
stdin that the agent holds from the run's first attach session to its end, into which each attach
session writes its client's STDIN frames; a session's leaving never ends it, only an EOF frame does
(without a terminal: the command's end of input, the engine's ``StdinOnce``; with one, ^D typed into
it). The first attach of an attempt replays what the command wrote before it (the engine's log of
it, its last REPLAYED writes; without a terminal, stdout and stderr as one); a later one starts
where it joins. Detaching (the client goes, the session is closed) ends nothing: the command goes
on, and ``runplane attach`` joins it again. ``Input`` is also the run's input clock: the watch ends
a run that had no input for its pool's ``max_idle_interactive``."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import docker.errors
import requests
from websockets.exceptions import ConnectionClosed

from runplane.domain.session_wire import MAX_PAYLOAD, STDIN, STDOUT, Frame, FrameType, chunks, json_frame, read_resize
from runplane.domain.sessions import Session
from worker_agent.sessions.exec import ExecFailed, pump_output
from worker_agent.sessions.link import Link

log = logging.getLogger(__name__)

JOIN_SECONDS = 10.0
REPLAYED = 1000
"""The most of the engine's log entries (the command's writes) the first attach replays."""


EOT = b"\x04"
"""^D: what a terminal's end of input is (its line discipline ends a read with it)."""


class Input:
    """An interactive run's input: when it last had some (from its start, each byte an attach
    session writes to it), and the one attach of its container's stdin (``hold``, by its first
    attach session; ``release`` at the run's end) that every attach session writes into. ``idle()``
    is None once its input ended (EOF without a terminal): nothing more is waited for then."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.last = clock()
        self.ended = False
        self.replayed = False
        """Whether an attach session of the attempt has replayed the command's output so far."""
        self.tty = False
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._sock: socket.socket | None = None
        self._released = False

    def touch(self) -> None:
        self.last = self.clock()

    def idle(self) -> float | None:
        """Seconds since the last input; None once the input ended."""
        return None if self.ended else self.clock() - self.last

    def first_attach(self) -> bool:
        """True for the attempt's first attach only (it replays the output before it)."""
        with self._lock:
            first, self.replayed = not self.replayed, True
        return first

    def hold(self, api: Any, container_id: str, tty: bool) -> None:
        """Attach to the container's stdin, once for the run (later calls do nothing); nothing
        after ``release``. Raises ExecFailed."""
        with self._lock:
            if self._sock is not None or self._released or self.ended:
                return
            try:
                hijacked = api.attach_socket(container_id, params={"stdin": 1, "stream": 1})
            except (docker.errors.APIError, requests.RequestException) as e:
                raise ExecFailed(f"the run's command could not be attached to: {e}") from e
            self._sock, self.tty = hijacked._sock, tty
            self._sock.settimeout(None)  # a command that reads slowly is not gone

    def write(self, data: bytes) -> None:
        """Give ``data`` to the command (dropped once its input ended)."""
        self.touch()
        sock = self._sock
        if sock is None or self.ended:
            return
        with self._writing, contextlib.suppress(OSError):  # the command ended: its EXIT is on its way
            sock.sendall(data)

    def end(self) -> None:
        """An attach session's EOF: with a terminal, ^D typed into it (the terminal goes on); without
        one, the end of the command's input for good."""
        sock = self._sock
        if self.tty:
            self.write(EOT)
            return
        self.ended = True
        if sock is not None:
            with self._writing, contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)

    def release(self) -> None:
        """The run is over: let go of its stdin (nothing is held again). Idempotent."""
        with self._lock:
            self._released = True
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a write blocked on a command that does not read ends
            sock.close()


class AttachSession:
    """The attach session ``session`` of the run in ``container`` (a docker Container), its output
    sent on ``link`` by a thread of its own; ``run_ending``: whether the run is being stopped (its
    session then ends with it, GONE ``run_ended``, not with an EXIT)."""

    def __init__(
        self,
        api: Any,
        container: Any,
        session: Session,
        link: Link,
        given: Input,
        run_ending: Callable[[], bool] = lambda: False,
    ) -> None:
        self.api, self.container, self.session, self.link, self.input = api, container, session, link, given
        self.run_ending = run_ending
        self.exit_code: int | None = None
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._output: threading.Thread | None = None

    def start(self, rows: int | None, cols: int | None) -> None:
        """Attach to the container and start the thread that sends its output. Raises ExecFailed."""
        self.input.hold(self.api, self.container.id, self.session.tty)
        params = {"stdout": 1, "stderr": 1, "stream": 1}  # its input goes through ``self.input``
        try:
            hijacked = self.api.attach_socket(self.container.id, params=params)
            # what it printed before, from the engine's log up to now (the attach's own ``logs``
            # replay is not to be relied on): a byte printed as the stream was joined may come twice
            before = self.api.logs(self.container.id, stdout=True, stderr=True, until=time.time(), tail=REPLAYED)
        except (docker.errors.APIError, requests.RequestException) as e:
            raise ExecFailed(f"the run's command could not be attached to: {e}") from e
        self._sock = hijacked._sock
        self._sock.settimeout(None)  # a command silent for long is not over
        if self.input.first_attach() and before:
            self._data(STDOUT, before)
        if self.session.tty and rows and cols:
            self.resize(rows, cols)
        self._output = threading.Thread(target=self._send_output, name=f"session-{self.session.id}-out", daemon=True)
        self._output.start()

    # -- from the client ------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        if self._sock is None:
            return
        if frame.type == FrameType.DATA and frame.channel == STDIN:
            self.input.write(frame.payload)
        elif frame.type == FrameType.EOF and frame.channel == STDIN:
            self.input.end()
        elif frame.type == FrameType.RESIZE and self.session.tty:
            self.resize(*read_resize(frame))
        elif frame.type == FrameType.SIGNAL and not self.session.tty and frame.payload:
            self.signal(frame.payload[0])

    def resize(self, rows: int, cols: int) -> None:
        try:
            self.api.resize(self.container.id, height=rows, width=cols)
        except (docker.errors.APIError, requests.RequestException) as e:
            log.info("session %s: resize failed: %s", self.session.id, e)

    def signal(self, signo: int) -> None:
        """A signal to the run's command (its container's first process), as ``docker run`` passes
        one on; never to anything outside the container."""
        try:
            self.api.kill(self.container.id, signal=signo)
        except (docker.errors.APIError, requests.RequestException) as e:
            log.info("session %s: signal %d not sent: %s", self.session.id, signo, e)

    # -- to the client --------------------------------------------------------------------

    def _send_output(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            pump_output(sock, self.session.tty, self._data)
        except ConnectionClosed:
            return  # the client is gone: the command goes on
        if self._stopping.is_set() or self.run_ending():
            return  # detached, or the run is being stopped: its session ends with GONE
        code = self._exit_code()
        if code is None:
            return  # the stream broke while the command goes on: the session ends, the run does not
        self.exit_code = code
        with contextlib.suppress(ConnectionClosed):
            self.link.send(json_frame(FrameType.EXIT, {"code": code}))
        self.link.close()

    def _exit_code(self) -> int | None:
        """The command's exit code once its container stopped; None while it runs."""
        try:
            self.container.reload()
        except (docker.errors.APIError, requests.RequestException):
            return None
        state = self.container.attrs.get("State") or {}
        if state.get("Running"):
            return None
        code = state.get("ExitCode")
        return int(code) if isinstance(code, int) else None

    def _data(self, channel: int, data: bytes) -> None:
        for piece in chunks(channel, data, self.session.relay_frame or MAX_PAYLOAD):
            if piece:
                self.link.send(Frame(FrameType.DATA, channel, 0, piece))

    # -- the end --------------------------------------------------------------------------

    def stop(self) -> None:
        """Leave the command (it goes on): close the attach stream and wait for the output thread.
        Idempotent."""
        with self._lock:
            output, sock = self._output, self._sock
            if sock is None:
                return
            if output is not None and output.is_alive():
                self._stopping.set()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if output is not None and output is not threading.current_thread():
            output.join(timeout=JOIN_SECONDS)
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
