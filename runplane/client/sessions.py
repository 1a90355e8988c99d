"""The client's side of a session (``runplane exec``, ``shell``, ``port-forward``; ``Run.exec``,
``Run.port_forward``): dial the relay the API named, say HELLO, wait for the worker's, then move
frames (runplane.domain.session_wire) between the relay and stdin/stdout/stderr or local sockets.

A ``Link`` is one connection to the relay (runplane.client._link: in order, acked, kept alive,
whatever the relay). A run's bytes are only ever DATA payload: they are written out as they are,
never read as frames.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import select
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runplane.client import _link
from runplane.client._link import PING_SECONDS as PING_SECONDS
from runplane.client._link_dial import connect, shown
from runplane.client._link_order import Refused
from runplane.client._link_order import SessionLost as SessionLost
from runplane.client.errors import ApiError, Conflict, NotFound
from runplane.domain.session_wire import (
    MAX_PAYLOAD,
    PROTOCOL_VERSION,
    STDIN,
    STDOUT,
    BadFrame,
    Frame,
    FrameType,
    chunks,
    json_frame,
    resize,
    signal_frame,
)
from runplane.domain.sessions import BASE64, BINARY, REQUEST_SECONDS, TERM_PATTERN, EndReason

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection
MEET_SECONDS = REQUEST_SECONDS + 15.0
"""How long a client waits for the worker's HELLO: a session no worker took by ``expires_at`` is
expired, and the relay holds a side at most that long."""
LOST = 255
"""The exit status of a session that ended without its command's exit (``ssh`` says so too)."""
SIGWINCH = 28


@dataclass(frozen=True)
class Access:
    """How to reach a session's relay: the API's answer to opening a session, or to a fresh ticket."""

    session_id: str
    url: str
    headers: dict[str, str]
    max_frame: int = MAX_PAYLOAD
    encoding: str = BINARY

    @classmethod
    def read(cls, answer: Any) -> Access:
        """From the API's answer (a SessionView or its JSON): ``id`` and ``relay {url, headers,
        max_frame, encoding}``."""
        data: Mapping[str, Any] = answer if isinstance(answer, Mapping) else answer.model_dump(mode="json")
        relay = data.get("relay") or {}
        max_frame = relay.get("max_frame") or MAX_PAYLOAD
        encoding = BASE64 if relay.get("encoding") == BASE64 else BINARY
        return cls(
            str(data["id"]),
            str(relay["url"]),
            dict(relay.get("headers") or {}),
            min(int(max_frame), MAX_PAYLOAD),
            encoding,
        )


def dial(access: Access, *, open_timeout: float = 10.0) -> ClientConnection:
    """A WebSocket connection to ``access``'s relay (the ticket in its headers). Raises SessionLost
    when the relay refuses it or cannot be reached."""
    from websockets.exceptions import InvalidHandshake, InvalidURI

    try:
        conn: ClientConnection = connect(access.url, access.headers, access.encoding, open_timeout=open_timeout)
    except (InvalidHandshake, InvalidURI, OSError, TimeoutError) as e:
        raise SessionLost("relay_lost", f"cannot reach the session's relay at {shown(access.url)}: {e}") from None
    return conn


def open_link(access: Access, *, open_timeout: float = 10.0, renew: Callable[[], Access] | None = None) -> Link:
    """A Link to ``access``'s relay, spoken as it says (its encoding, its frame size). With ``renew``
    (a fresh ticket for the session: ``Client.session_ticket``), a connection that drops is dialled
    again with a fresh ticket and the session goes on where it was."""
    redial = None if renew is None else functools.partial(redialled, renew, open_timeout)
    return Link(dial(access, open_timeout=open_timeout), access.max_frame, encoding=access.encoding, redial=redial)


def redialled(renew: Callable[[], Access], open_timeout: float) -> ClientConnection:
    """A new connection to the session's relay, with a fresh ticket. Raises Refused when the API
    says the session is over (then a dropped connection ends it), anything else to be tried again."""
    try:
        access = renew()
    except (NotFound, Conflict) as e:
        raise Refused(f"the session is over: {e}") from None
    return dial(access, open_timeout=open_timeout)


class Link(_link.Link):
    """One side's connection to the relay (runplane.client._link), with the client's ways to send.
    ``send`` may be called from any thread; ``receive`` from one thread only."""

    def send(self, frame_type: FrameType | Frame, channel: int = 0, payload: bytes = b"") -> None:
        super().send(frame_type if isinstance(frame_type, Frame) else Frame(frame_type, channel, 0, payload))

    def send_json(self, frame_type: FrameType, data: dict[str, Any], channel: int = 0) -> None:
        super().send(json_frame(frame_type, data, channel))

    def send_data(self, channel: int, data: bytes) -> None:
        for part in chunks(channel, data, self.max_frame):
            self.send(FrameType.DATA, channel, part)

    def send_resize(self, rows: int, cols: int) -> None:
        super().send(resize(rows, cols))

    def send_signal(self, signo: int) -> None:
        super().send(signal_frame(signo))

    def receive(self, timeout: float = 1.0) -> Frame | None:
        """The next frame other than PING/PONG, or None after ``timeout`` seconds. Raises SessionLost
        when the connection closed, the peer is silent too long, or it sent something that is not
        a frame; GONE is returned like any frame."""
        return self.recv(timeout)


class NotJoined(SessionLost):
    """The session ended, or its relay could not be reached, before the worker joined it: it still
    holds one of the run's slots until it expires, unless closed (``Client.close_session``)."""


def gone(frame: Frame) -> SessionLost:
    """The SessionLost a GONE frame says."""
    try:
        reason = str(frame.json().get("reason") or "gone")
    except BadFrame:
        reason = "gone"
    words = {
        "worker_gone": "the worker left the session",
        "client_gone": "the relay dropped this side of the session",
        "run_ended": "the run ended",
        "closed": "the session was closed",
        "peer_absent": "no worker joined it in time (is the run still running?)",
        "too_fast": "this side sent more messages a second than the relay takes from one connection",
        "replaced": "another connection took this side's place in the session",
    }
    return SessionLost(reason, f"session ended: {words.get(reason, reason)}")


def meet(
    link: Link,
    size: tuple[int, int] | None = None,
    *,
    wait: float = MEET_SECONDS,
    run_over: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Say HELLO (with the terminal's ``size``, rows and cols) and wait for the worker's; its HELLO.
    Raises SessionLost when the session ends first or no worker comes within ``wait`` seconds, and
    (``run_ended``) when ``run_over``, asked about once a second while waiting, says how the run
    ended (no worker serves a session of a run that is over)."""
    hello: dict[str, Any] = {"v": PROTOCOL_VERSION, "side": "client"}
    if size is not None:
        hello["rows"], hello["cols"] = size
    link.send_json(FrameType.HELLO, hello)
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        frame = link.receive(timeout=min(left, 1.0))
        if frame is None:
            if run_over is not None and (over := run_over()) is not None:
                raise SessionLost(EndReason.RUN_ENDED.value, f"session ended: the run is {over}")
            continue
        if frame.type == FrameType.GONE:
            raise gone(frame)
        if frame.type == FrameType.HELLO:
            try:
                return frame.json()
            except BadFrame as e:
                raise SessionLost("relay_lost", f"the worker's HELLO is not one: {e}") from None
    raise SessionLost("expired", f"no worker took the session within {wait:.0f} s")


_REPORT = re.compile(rb"\x1b\[\d{1,5};\d{1,5}R")
_REPORT_BEGUN = re.compile(rb"\x1b(\[(\d{1,5}(;\d{0,5})?)?)?")


class Escapes:
    """``ssh``'s way out of a terminal: ``~.`` at the start of a line leaves the session; ``~~``
    sends one ``~``; a ``~`` before anything else is sent as it is. The terminal's report of its
    cursor's position (``ESC [ row ; col R``, asked for by shells after a prompt) is passed on and
    leaves the start of a line as it was."""

    def __init__(self) -> None:
        self.line_start = True
        self.tilde = False
        self.report = b""  # what came of what may be a cursor position report

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """What of ``data`` goes to the session, and whether ``~.`` was typed (nothing after it goes)."""
        out = bytearray()
        for byte in data:
            if self.tilde:
                self.tilde = False
                if byte == ord("."):
                    return bytes(out), True
                out.append(ord("~"))
                self.line_start = False
                if byte == ord("~"):
                    continue
            elif self.line_start and not self.report and byte == ord("~"):
                self.tilde = True
                continue
            out.append(byte)
            if self.report or byte == 0x1B:
                self.report += bytes([byte])
                if _REPORT.fullmatch(self.report):
                    self.report = b""
                    continue
                if _REPORT_BEGUN.fullmatch(self.report):
                    continue
                self.report = b""  # no report: typed
                if byte == 0x1B:  # unless this begins one
                    self.report, self.line_start = b"\x1b", False
                    continue
            self.line_start = byte in (ord("\r"), ord("\n"))
        return bytes(out), False


class Feeder:
    """A thread that sends what the user gives: ``stdin`` (a file descriptor read until its end,
    or bytes) as DATA then EOF on STDIN, and what ``control`` (a pipe's read end) carries: one byte
    per signal, SIGWINCH as a RESIZE of ``size()``, any other as a SIGNAL frame. With ``escapes``
    (a terminal), ``~.`` at the start of a line closes the link (``detached``). ``stop()`` ends
    it; nothing of it is left after."""

    def __init__(
        self,
        link: Link,
        stdin: int | bytes | None,
        control: int | None = None,
        size: Callable[[], tuple[int, int] | None] | None = None,
        escapes: bool = False,
    ) -> None:
        self.link = link
        self.escapes = Escapes() if escapes else None
        self.detached = False
        """``~.`` was typed (``escapes``): the link is closed."""
        self.stdin = stdin
        self.control = control
        self.size = size
        self._stop_r, self._stop_w = os.pipe()
        self.error: SessionLost | None = None
        self.thread = threading.Thread(target=self._run, name="session-feeder", daemon=True)

    def start(self) -> Feeder:
        self.thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _run(self) -> None:
        try:
            self._feed()
        except SessionLost as e:
            self.error = e

    def _feed(self) -> None:
        stdin_fd: int | None = None
        if isinstance(self.stdin, bytes):
            if self.stdin:
                self.link.send_data(STDIN, self.stdin)
            self.link.send(FrameType.EOF, STDIN)
        elif isinstance(self.stdin, int):
            stdin_fd = self.stdin
        while True:
            watched = [fd for fd in (self._stop_r, stdin_fd, self.control) if fd is not None]
            ready, _, _ = select.select(watched, [], [])
            if self._stop_r in ready:
                return
            if self.control is not None and self.control in ready:
                for signo in os.read(self.control, 64):
                    self._signal(signo)
            if stdin_fd is not None and stdin_fd in ready:
                data = os.read(stdin_fd, self.link.max_frame)
                leave = False
                if data and self.escapes is not None:
                    data, leave = self.escapes.feed(data)
                    if not data and not leave:
                        continue
                if leave:
                    if data:
                        self.link.send(FrameType.DATA, STDIN, data)
                    self.detached = True
                    self.link.close()
                    return
                if data:
                    self.link.send(FrameType.DATA, STDIN, data)
                else:
                    self.link.send(FrameType.EOF, STDIN)
                    stdin_fd = None

    def _signal(self, signo: int) -> None:
        if signo == SIGWINCH:
            size = self.size() if self.size is not None else None
            if size is not None:
                self.link.send_resize(*size)
        elif 1 <= signo <= 64:
            self.link.send_signal(signo)


Output = Callable[[int, bytes], None]
"""Where a command's output goes: ``(channel, bytes)``, channel STDOUT or STDERR."""


def pump_exec(link: Link, output: Output, say: Callable[[str], None] | None = None) -> int:
    """Write the command's output as it comes until its EXIT; its exit status (a signal ``n``:
    128 + n). ``say`` gets the reason an EXIT gives (a command that could not start). Raises
    SessionLost when the session ends first."""
    while True:
        frame = link.receive(timeout=PING_SECONDS)
        if frame is None:
            continue
        if frame.type == FrameType.DATA and frame.channel >= STDOUT:
            output(frame.channel, frame.payload)
        elif frame.type == FrameType.EXIT:
            if say is not None and (reason := exit_reason(frame)):
                say(reason)
            return exit_status(frame)
        elif frame.type == FrameType.GONE:
            raise gone(frame)


def exit_reason(frame: Frame) -> str | None:
    try:
        reason = frame.json().get("reason")
    except BadFrame:
        return None
    return reason if isinstance(reason, str) and reason else None


def exit_status(frame: Frame) -> int:
    try:
        data = frame.json()
    except BadFrame:
        return LOST
    code, signo = data.get("code"), data.get("signal")
    if isinstance(signo, int) and not isinstance(signo, bool) and 0 < signo < 128:
        return 128 + signo
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF if code >= 0 else LOST
    return LOST


@dataclass(frozen=True)
class ExecResult:
    """A command's exit status and everything it wrote."""

    exit_code: int
    stdout: bytes
    stderr: bytes


def exec_captured(
    access: Access,
    stdin: bytes | None = None,
    *,
    wait: float = MEET_SECONDS,
    run_over: Callable[[], str | None] | None = None,
    renew: Callable[[], Access] | None = None,
) -> ExecResult:
    """Dial ``access``, feed ``stdin`` (None: the session has none) and collect the command's
    output until it exits. Raises SessionLost when the session ends before the command (NotJoined
    before the worker joined it; ``run_over``: see ``meet``; ``renew``: see ``open_link``)."""
    link = joined(access, wait=wait, run_over=run_over, renew=renew)
    out: dict[int, list[bytes]] = {STDOUT: [], 3: []}
    feeder: Feeder | None = None
    try:
        feeder = Feeder(link, stdin).start()
        code = pump_exec(link, lambda channel, data: out.setdefault(channel, []).append(data))
        return ExecResult(code, b"".join(out[STDOUT]), b"".join(out[3]))
    finally:
        if feeder is not None:
            feeder.stop()
        link.close()


def joined(
    access: Access,
    size: tuple[int, int] | None = None,
    *,
    wait: float = MEET_SECONDS,
    run_over: Callable[[], str | None] | None = None,
    renew: Callable[[], Access] | None = None,
) -> Link:
    """A Link to ``access``'s relay, met by the session's worker (``meet``). Raises NotJoined when
    the relay cannot be reached or the session ends first."""
    try:
        link = open_link(access, renew=renew)
    except SessionLost as e:
        raise NotJoined(e.reason, str(e)) from None
    try:
        meet(link, size, wait=wait, run_over=run_over)
    except BaseException as e:
        link.close()
        if isinstance(e, SessionLost):
            raise NotJoined(e.reason, str(e)) from None
        raise
    return link


def over_unless_running(state: Callable[[], str]) -> Callable[[], str | None]:
    """A ``run_over`` for ``meet``: the run's state (``state()``, read from the API) once it is no
    longer running, else None; None too when the API cannot be asked (the wait goes on)."""

    def over() -> str | None:
        try:
            now = state()
        except (ApiError, TimeoutError):
            return None
        return None if now == "running" else str(now)

    return over


def usable_term(term: str | None) -> str | None:
    """``term`` (the local ``TERM``) when the API takes it as a terminal's type, else None."""
    return term if term and re.fullmatch(TERM_PATTERN, term) else None
