"""A port-forward's client side: connections accepted on ``127.0.0.1:LOCAL`` each become a
channel of the session (OPEN with the run's port on a new even channel from 16), their bytes DATA
both ways, their ends EOF (one direction) and CLOSE (both)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from runplane.client.sessions import PING_SECONDS, Access, Link, SessionLost, gone, joined
from runplane.domain.session_wire import FIRST_PORT_CHANNEL, MAX_CHANNEL, BadFrame, Frame, FrameType

OPEN_SECONDS = 30.0
"""How long a connection waits for the worker's OPEN_OK before it is dropped."""


def loopback_listener(port: int) -> socket.socket:
    """A listening socket on ``127.0.0.1:port`` (0: any free port). Raises OSError (in use, ...)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    return listener


@dataclass
class _Connection:
    sock: socket.socket
    opened: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    sent_eof: bool = False
    got_eof: bool = False


class Forward:
    """Forwards ``listener``'s connections to port ``remote`` of the run, through ``link`` (a
    session that has met its worker). ``accept()`` starts taking connections; ``pump()`` moves
    the worker's frames until the session ends (it returns the SessionLost that ended it, None
    after ``close()``); ``close()`` drops every connection and the listener, leaving no thread."""

    def __init__(
        self, link: Link, remote: int, listener: socket.socket, say: Callable[[str], None] | None = None
    ) -> None:
        self.link = link
        self.remote = remote
        self.listener = listener
        self.local_port: int = listener.getsockname()[1]
        self._say = say or (lambda line: None)
        self._lock = threading.Lock()
        self._connections: dict[int, _Connection] = {}
        self._threads: list[threading.Thread] = []
        self._next = FIRST_PORT_CHANNEL
        self._closed = threading.Event()

    def accept(self) -> None:
        self._spawn(self._accept, "forward-accept")

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                channel = self._next
                if channel > MAX_CHANNEL - 1:
                    sock.close()
                    self._say("no channel left in this session; start another port-forward")
                    continue
                self._next += 2
                self._connections[channel] = _Connection(sock)
            try:
                self.link.send_json(FrameType.OPEN, {"port": self.remote}, channel)
            except SessionLost:
                self._drop(channel, tell=False)
                return
            self._spawn(self._upstream, f"forward-{channel}", channel)

    def _upstream(self, channel: int) -> None:
        """The local connection's bytes to the run, once the worker opened its end."""
        conn = self._connections.get(channel)
        if conn is None:
            return
        if not conn.opened.wait(OPEN_SECONDS) or not conn.ok:
            self._drop(channel, tell=not conn.opened.is_set())
            return
        try:
            while True:
                try:
                    data = conn.sock.recv(self.link.max_frame)
                except OSError:
                    self._drop(channel, tell=True)
                    return
                if not data:
                    break
                self.link.send(FrameType.DATA, channel, data)
            conn.sent_eof = True
            self.link.send(FrameType.EOF, channel)
            if conn.got_eof:
                self._drop(channel, tell=True)
        except SessionLost:
            self._drop(channel, tell=False)

    def _drop(self, channel: int, *, tell: bool) -> None:
        with self._lock:
            conn = self._connections.pop(channel, None)
        if conn is None:
            return
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)
        conn.sock.close()
        if tell and not self._closed.is_set():
            with contextlib.suppress(SessionLost):
                self.link.send(FrameType.CLOSE, channel)

    def pump(self) -> SessionLost | None:
        """The worker's frames to the local connections until the session ends."""
        while not self._closed.is_set():
            try:
                frame = self.link.receive(timeout=min(PING_SECONDS, 1.0))
            except SessionLost as e:
                return None if self._closed.is_set() else e
            if frame is None:
                continue
            if frame.type == FrameType.GONE:
                return gone(frame)
            self._downstream(frame)
        return None

    def _downstream(self, frame: Frame) -> None:
        conn = self._connections.get(frame.channel)
        if conn is None:
            return  # a connection already dropped here
        if frame.type == FrameType.OPEN_OK:
            conn.ok = True
            conn.opened.set()
        elif frame.type == FrameType.OPEN_FAIL:
            try:
                reason = str(frame.json().get("reason") or "refused")
            except BadFrame:
                reason = "refused"
            self._say(f"127.0.0.1:{self.local_port} -> port {self.remote} of the run: {reason}")
            conn.opened.set()
        elif frame.type == FrameType.DATA:
            try:
                conn.sock.sendall(frame.payload)  # blocks while the local reader is slow: backpressure
            except OSError:
                self._drop(frame.channel, tell=True)
        elif frame.type == FrameType.EOF:
            conn.got_eof = True
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            if conn.sent_eof:
                self._drop(frame.channel, tell=True)
        elif frame.type == FrameType.CLOSE:
            self._drop(frame.channel, tell=False)

    def close(self) -> None:
        """Stop listening, drop every connection, end the threads (the link is the caller's)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for channel in list(self._connections):
            self._drop(channel, tell=False)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)


class PortForward:
    """A port-forward running on its own threads (``Run.port_forward``): ``local_port`` takes
    connections until ``close()`` or the session ends (``ended``: the SessionLost that ended it)."""

    def __init__(
        self, link: Link, remote: int, listener: socket.socket, leave: Callable[[], object] | None = None
    ) -> None:
        self._forward = Forward(link, remote, listener)
        self._leave = leave
        self.link = link
        self.local_port = self._forward.local_port
        self.remote_port = remote
        self.ended: SessionLost | None = None
        self._pump = threading.Thread(target=self._run, name="forward-pump", daemon=True)

    def start(self) -> PortForward:
        self._forward.accept()
        self._pump.start()
        return self

    def _run(self) -> None:
        self.ended = self._forward.pump()

    def close(self) -> None:
        """Stop forwarding: the session is closed (``leave``: else its worker would wait for this
        side to dial again), then the link."""
        self._forward.close()
        if self._leave is not None and self.ended is None:
            with contextlib.suppress(Exception):  # best effort: the session ends with the link either way
                self._leave()
        self.link.close()
        if self._pump.is_alive() and self._pump is not threading.current_thread():
            self._pump.join(timeout=5.0)

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_forward(
    access: Access,
    remote: int,
    listener: socket.socket,
    run_over: Callable[[], str | None] | None = None,
    *,
    renew: Callable[[], Access] | None = None,
    leave: Callable[[], object] | None = None,
) -> PortForward:
    """Join the port-forward session of ``access`` and forward ``listener``'s connections to port
    ``remote`` of the run, on threads of its own (``renew``: see ``open_link``; ``leave``: closes
    the session, called by ``close``). Closes ``listener`` when the session cannot be joined
    (NotJoined)."""
    try:
        link = joined(access, run_over=run_over, renew=renew)
    except BaseException:
        listener.close()
        raise
    return PortForward(link, remote, listener, leave).start()
