"""A port-forward session: the client opens connections (OPEN on a channel of its choosing, from
16) to the session's one port, each dialled at ``127.0.0.1`` inside the run's own network
namespace (netns.py), answered OPEN_OK or OPEN_FAIL with the reason; then DATA both ways, EOF for a
half-close and CLOSE for the end of one. What the client sends a connection is handed to a writer
thread of its own through a queue of OUT_FRAMES frames: the session's reader, which also reads the
frames that end the session, never blocks on a connection. A full queue holds the reader (and so,
through the relay, the client) back, for at most STALL_SECONDS: a connection that takes nothing for
that long is closed (CLOSE). One thread reads every connection (a selector) and sends what comes."""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed

from runplane.domain.session_wire import FIRST_PORT_CHANNEL, MAX_PAYLOAD, BadFrame, Frame, FrameType, json_frame
from runplane.domain.sessions import Session
from worker_agent.sessions.link import Link
from worker_agent.sessions.netns import DialFailed

log = logging.getLogger(__name__)

MAX_CHANNELS = 64
"""Connections one port-forward session may have open at once."""
OUT_FRAMES = 16
"""Frames from the client one connection may have waiting for the run's side to read them."""
STALL_SECONDS = 15.0
"""How long a connection whose queue is full may hold the session's reader before it is closed."""
_EOF = b""
"""In a connection's queue: the client ended its input (a DATA frame is never empty)."""

Dialer = Callable[[int], socket.socket]
"""Connects to a port inside the run (raises DialFailed)."""


@dataclass
class _Channel:
    sock: socket.socket
    reading: bool = True  # until the run's side ends its output (EOF sent)
    writing: bool = True  # until the client ends its input (EOF received)
    ended_input: bool = False  # the client's EOF passed on to the run's side (after all it sent)
    done: bool = False  # dropped: no frame of it goes to the client any more
    out: queue.Queue[bytes | None] = field(default_factory=lambda: queue.Queue(OUT_FRAMES))
    writer: threading.Thread | None = None


@dataclass
class _Mailbox:
    """What the reader asks of the output thread (which alone touches the selector)."""

    adds: list[int] = field(default_factory=list)
    drops: list[int] = field(default_factory=list)


class PortForward:
    def __init__(self, session: Session, link: Link, dial: Dialer) -> None:
        self.session, self.link, self.dial = session, link, dial
        self.opened = 0  # connections made, for the timeline
        self._channels: dict[int, _Channel] = {}
        self._lock = threading.Lock()
        self._mail = _Mailbox()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._output: threading.Thread | None = None
        self._stopped = False

    exit_code: int | None = None  # a port-forward has no command and never exits

    def start(self, rows: int | None, cols: int | None) -> None:
        self._output = threading.Thread(target=self._pump, name=f"session-{self.session.id}-out", daemon=True)
        self._output.start()

    # -- from the client ------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        chan = frame.channel
        if frame.type == FrameType.OPEN:
            self._open(frame)
        elif chan < FIRST_PORT_CHANNEL:
            return
        elif frame.type in (FrameType.DATA, FrameType.EOF):
            channel = self._channels.get(chan)
            if channel is None or not channel.writing or (frame.type == FrameType.DATA and not frame.payload):
                return
            if frame.type == FrameType.EOF:
                channel.writing = False
            queued = self._queue(channel, frame.payload if frame.type == FrameType.DATA else _EOF)
            if not queued and not self._stopping.is_set():
                self._drop(chan, tell=True)
        elif frame.type == FrameType.CLOSE:
            self._drop(chan, tell=False)

    def _open(self, frame: Frame) -> None:
        chan = frame.channel
        try:
            port = frame.json().get("port")
        except BadFrame:
            port = None
        if chan < FIRST_PORT_CHANNEL:
            return self._fail(chan, f"channel {chan} is not a connection's (from {FIRST_PORT_CHANNEL})")
        if chan in self._channels:
            return self._fail(chan, f"channel {chan} is already open")
        if not isinstance(port, int) or isinstance(port, bool) or port != self.session.port:
            return self._fail(chan, f"this session forwards port {self.session.port} only")
        if len(self._channels) >= MAX_CHANNELS:
            return self._fail(chan, f"at most {MAX_CHANNELS} connections at once")
        try:
            sock = self.dial(port)
        except DialFailed as e:
            return self._fail(chan, str(e))
        channel = _Channel(sock)
        channel.writer = threading.Thread(
            target=self._write, args=(chan, channel), name=f"session-{self.session.id}-{chan}", daemon=True
        )
        with self._lock:
            self._channels[chan] = channel
            self._mail.adds.append(chan)
        channel.writer.start()
        self.opened += 1
        self._send(Frame(FrameType.OPEN_OK, chan))
        self._wake()

    def _queue(self, channel: _Channel, item: bytes) -> bool:
        """``item`` queued for ``channel``'s writer; False when its queue stayed full STALL_SECONDS
        (or the connection or the session ended meanwhile)."""
        until = time.monotonic() + STALL_SECONDS
        while not (channel.done or self._stopping.is_set()):
            try:
                channel.out.put(item, timeout=min(0.2, max(0.0, until - time.monotonic())))
                return True
            except queue.Full:
                if time.monotonic() >= until:
                    log.info("session %s: a connection took nothing for %ss: closed", self.session.id, STALL_SECONDS)
                    return False
        return False

    def _write(self, chan: int, channel: _Channel) -> None:
        """A connection's writer: what the client sent, in order, until it ends or is dropped (whose
        shutdown ends a send in progress)."""
        while (item := channel.out.get()) is not None and not channel.done:
            try:
                if item:
                    channel.sock.sendall(item)
                    continue
                channel.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(chan, tell=True)
                return
            with self._lock:
                channel.ended_input = True
                closed = not channel.reading
            if closed:  # both ways ended
                self._drop(chan, tell=True)
            return

    def _fail(self, chan: int, reason: str) -> None:
        self._send(json_frame(FrameType.OPEN_FAIL, {"reason": reason}, channel=chan))

    def _drop(self, chan: int, tell: bool) -> None:
        """End connection ``chan`` (CLOSE to the client if ``tell``): the output thread closes it."""
        with self._lock:
            channel = self._channels.get(chan)
            if channel is None:
                return
            channel.reading = channel.writing = False
            tell_now = tell and not channel.done
            channel.done = True  # nothing more is said of it to the client
            self._mail.drops.append(chan)
        with contextlib.suppress(OSError):
            channel.sock.shutdown(socket.SHUT_RDWR)
        if tell_now:
            self._send(Frame(FrameType.CLOSE, chan))
        self._wake()

    def _send(self, frame: Frame) -> None:
        with contextlib.suppress(ConnectionClosed):
            self.link.send(frame)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- to the client --------------------------------------------------------------------

    def _pump(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        registered: dict[int, socket.socket] = {}
        try:
            while not self._stopping.is_set():
                self._take_mail(selector, registered)
                for key, _ in selector.select(timeout=1.0):
                    if key.data is None:
                        self._wake_r.recv(4096)
                        continue
                    self._read(key.data, key.fileobj, selector, registered)
        finally:
            for chan in list(registered):
                self._forget(chan, selector, registered)
            selector.close()

    def _take_mail(self, selector: selectors.BaseSelector, registered: dict[int, socket.socket]) -> None:
        with self._lock:
            adds, drops = self._mail.adds, self._mail.drops
            self._mail = _Mailbox()
        for chan in adds:
            channel = self._channels.get(chan)
            if channel is not None and channel.reading:
                selector.register(channel.sock, selectors.EVENT_READ, chan)
                registered[chan] = channel.sock
        for chan in drops:
            self._forget(chan, selector, registered)

    def _read(
        self, chan: int, sock: Any, selector: selectors.BaseSelector, registered: dict[int, socket.socket]
    ) -> None:
        try:
            data = sock.recv(MAX_PAYLOAD)
        except OSError:
            self._drop(chan, tell=True)
            return
        if data:
            self._send(Frame(FrameType.DATA, chan, 0, data))
            return
        selector.unregister(sock)  # the run's side ended its output: the client may still write
        del registered[chan]
        with self._lock:
            channel = self._channels.get(chan)
            if channel is None or channel.done:
                return
            channel.reading = False
            closed = channel.ended_input
        self._send(Frame(FrameType.EOF, chan))
        if closed:
            self._drop(chan, tell=True)

    def _forget(self, chan: int, selector: selectors.BaseSelector, registered: dict[int, socket.socket]) -> None:
        sock = registered.pop(chan, None)
        if sock is not None:
            selector.unregister(sock)
        with self._lock:
            channel = self._channels.pop(chan, None)
        if channel is not None:
            _close(channel)

    # -- the end --------------------------------------------------------------------------

    def stop(self) -> None:
        """Close every connection and wait for the output thread. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            socks = [c.sock for c in self._channels.values()]
        self._stopping.set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._wake()
        if self._output is not None and self._output is not threading.current_thread():
            self._output.join(timeout=10)
        with self._lock:
            left = list(self._channels.values())
            self._channels.clear()
        for channel in left:
            _close(channel)
        self._wake_r.close()
        self._wake_w.close()


def _close(channel: _Channel) -> None:
    """Close a dropped connection once its writer is gone (woken by the shutdown that dropped it,
    or by the end of its queue), so that no send reaches a descriptor reused meanwhile."""
    channel.done = True
    with contextlib.suppress(OSError):
        channel.sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(queue.Full):
        channel.out.put_nowait(None)
    writer = channel.writer
    if writer is not None and writer is not threading.current_thread():
        writer.join(timeout=10)
        if writer.is_alive():
            log.warning("a port-forward connection's writer did not end; its socket is left open")
            return
    channel.sock.close()
