"""The one-machine relay: where the two sides of a session (runplane.domain.sessions) meet, a
WebSocket at ``/v1/relay`` of the embedded stack's front, in the process whose API makes sessions.

A side dials with ``Authorization: Bearer <ticket>``. The hub reads the ticket, reads the session
and lets the side in only when the ticket is that session's client's or worker's (``admits``): else
401 before any WebSocket is open. One connection per side at a time (a second: 409), at most
``max_connections`` in all (503), and at most ``max_per_owner`` sessions of one user at the hub:
a side, client or worker, that would bring one more is refused (429; a worker refused ends its
session, ``relay_lost``), a side whose peer waits is always let in. A side waits alone at most
``wait_seconds`` for its peer (then GONE ``peer_absent``; what it sends meanwhile waits in its
connection's small queue, then in TCP: nothing is dropped, nothing grows without bound); once both
are there, every binary message of one goes to the other unchanged, in order, with a blocking send (a peer that
reads slowly slows its sender down: TCP backpressure end to end). A text message, a message
over ``max_frame`` payload bytes and its header, or a GONE frame from the client (only the relay,
and the worker that ends a session, say why it ended) ends the connection. When a side goes, its peer
gets GONE ``{"reason": "client_gone" | "worker_gone"}`` and is closed; ``close`` hangs up both
sides of a session with GONE ``{"reason"}``, ``stop`` every session (``relay_lost``).

The fronts hand the hub a connection whose HTTP request they have read (``serve``): the hub
answers the handshake itself (websockets' sans-I/O ``ServerProtocol.accept`` builds the 101 from
the headers the front parsed) and runs the WebSocket on the raw socket with websockets' threaded
connection, on a ``Protocol`` that starts open (the request is read already).
"""

from __future__ import annotations

import contextlib
import http
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request
from websockets.protocol import Protocol, Side, State
from websockets.server import ServerProtocol
from websockets.sync.connection import Connection

from runplane.adapters.local.relay import MAX_FRAME, RELAY_PATH
from runplane.domain import session_wire
from runplane.domain.errors import NotFound, RunplaneError
from runplane.domain.sessions import REQUEST_SECONDS, admits, read_ticket
from runplane.domain.sessions import Side as SessionSide
from runplane.ports import SessionStore

__all__ = ["MAX_FRAME", "RELAY_PATH", "RelayHub"]

log = logging.getLogger(__name__)
MAX_CONNECTIONS = 512
"""Sides held at once; past it, 503 (each holds a few threads)."""
MAX_PER_OWNER = 32
"""Sessions of one user the hub holds at once (a session is held while one of its sides is):
the side that would bring one more, a client or a worker, is refused (429), so that one user
cannot take every place of the hub by opening sessions and never dialing (their workers dial).
A side whose peer waits is let in: its session is counted already."""
SEND_SECONDS = 120.0
"""How long one send may wait on a peer that does not read (its TCP window full) before the peer
is taken for gone; a live side answers pings within 30 s."""
PING_SECONDS = 30.0
"""WebSocket pings to each side; a side that answers none within as long is gone."""
_GRACE = 0.25  # how often a side waiting alone looks whether it is still there
_GONE_TYPE = bytes([session_wire.FrameType.GONE])


@dataclass(eq=False)
class _Conn:
    session_id: str
    side: SessionSide
    ws: Connection | None = None
    """None until its handshake is written."""
    met: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Pair:
    owner: str
    sides: dict[SessionSide, _Conn] = field(default_factory=dict)
    over: bool = False


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class RelayHub:
    """The sessions' meeting point of one process. ``sessions``: where tickets are checked (read at
    each connect, so a session closed or ended is not joined again); ``wait_seconds``: how long a
    side waits for its peer; ``clock``: what ``admits`` is asked at; ``max_connections``: sides held
    at once (past it, 503); ``max_per_owner``: sessions of one user held at once (past it, the side
    that would bring one more is 429)."""

    def __init__(
        self,
        sessions: SessionStore,
        clock: Callable[[], float] = time.time,
        wait_seconds: float = REQUEST_SECONDS,
        max_frame: int = MAX_FRAME,
        max_connections: int = MAX_CONNECTIONS,
        max_per_owner: int = MAX_PER_OWNER,
    ) -> None:
        self.sessions, self.clock = sessions, clock
        self.wait_seconds, self.max_frame, self.max_connections = wait_seconds, max_frame, max_connections
        self.max_per_owner = max_per_owner
        self._lock = threading.Lock()
        self._pairs: dict[str, _Pair] = {}
        self._count = 0
        self._owners: dict[str, int] = {}
        """Sessions held of each user."""

    def serve(self, sock: socket.socket, path: str, headers: Mapping[str, str]) -> None:
        """Serve one side on ``sock``, whose request (``path`` and ``headers``) the front has read:
        answer the handshake (an HTTP error when it is not one, or the ticket is not let in), then
        hold the side until it or its peer goes. Blocks for the side's whole life; never raises for
        what the side does. The socket is the hub's from here and is closed when it returns."""
        try:
            self._serve(sock, path, Headers(list(headers.items())))
        except Exception:  # a side's failure is its own: the front goes on
            log.exception("relay connection failed")
        finally:
            sock.close()

    def close(self, session_id: str, reason: str) -> None:
        """Hang up both sides of ``session_id`` (each gets GONE ``{"reason"}``); quiet when none is here."""
        with self._lock:
            pair = self._pairs.get(session_id)
        if pair is not None:
            self._end(session_id, pair, reason, None)

    def stop(self, reason: str = "relay_lost") -> None:
        """Hang up every session held (the front stops)."""
        with self._lock:
            pairs = list(self._pairs.items())
        for session_id, pair in pairs:
            self._end(session_id, pair, reason, None)

    def abort(self, session_id: str) -> int:
        """Drop the connections of ``session_id`` at once, with no GONE and no close (as a network
        that fails would, for tests): how many were dropped. The hub then ends the pair as usual."""
        with self._lock:
            pair = self._pairs.get(session_id)
            held = [] if pair is None else [side.ws for side in pair.sides.values() if side.ws is not None]
        for ws in held:
            with contextlib.suppress(OSError):
                ws.socket.shutdown(socket.SHUT_RDWR)
        return len(held)

    def held(self, session_id: str) -> list[SessionSide]:
        """The sides of ``session_id`` connected now."""
        with self._lock:
            pair = self._pairs.get(session_id)
            return sorted(pair.sides) if pair is not None else []

    def _serve(self, sock: socket.socket, path: str, headers: Headers) -> None:
        handshake = ServerProtocol()
        response = handshake.accept(Request(path, headers))
        if response.status_code != 101:
            sock.settimeout(SEND_SECONDS)
            sock.sendall(response.serialize())
            return
        try:
            session_id, side, owner = self._admit(headers)
            conn = self._join(session_id, side, owner)
        except Refused as e:
            sock.settimeout(SEND_SECONDS)
            sock.sendall(_error(e))
            return
        sock.settimeout(SEND_SECONDS)
        try:
            sock.sendall(response.serialize())
            ws = Connection(
                sock,
                Protocol(Side.SERVER, state=State.OPEN, max_size=self.max_frame + session_wire.HEADER.size),
                ping_interval=PING_SECONDS,
                ping_timeout=PING_SECONDS,
                close_timeout=5,
            )
        except BaseException:
            self._leave(conn)
            raise
        try:
            self._run(conn, ws)
        finally:  # a failure of the hub's own frees the side's place (a no-op once its pair ended)
            self._leave(conn)

    def _admit(self, headers: Headers) -> tuple[str, SessionSide, str]:
        """The session, side and owner a request's ticket is for. Raises Refused (401, whatever is
        wrong with it: which is not told)."""
        refused = Refused(401, "unauthorized", "this ticket does not open a session here")
        scheme, _, text = (headers.get("Authorization") or "").partition(" ")
        read = read_ticket(text.strip()) if scheme.lower() == "bearer" else None
        if read is None:
            raise refused
        session_id, secret = read
        try:
            session = self.sessions.get(session_id)
        except NotFound:
            raise refused from None
        except RunplaneError as e:
            log.warning("relay could not read session %s: %s", session_id, e)
            raise Refused(503, "unavailable", "the session could not be read; try again") from None
        now = self.clock()
        for side in ("client", "worker"):
            if admits(session, side, secret, now):
                return session_id, side, session.owner
        raise refused

    def _join(self, session_id: str, side: SessionSide, owner: str) -> _Conn:
        conn = _Conn(session_id, side)
        with self._lock:
            if self._count >= self.max_connections:
                raise Refused(503, "unavailable", "the relay holds as many connections as it can; try again")
            pair = self._pairs.get(session_id)
            if pair is None and self._owners.get(owner, 0) >= self.max_per_owner:
                message = (
                    f"{self.max_per_owner} of your sessions are at the relay, the most one user may;"
                    " close one of them first"
                )
                raise Refused(429, "too_many_connections", message)
            if pair is not None and side in pair.sides:
                raise Refused(409, "conflict", f"the {side} of this session is connected already")
            if pair is None:
                pair = self._pairs[session_id] = _Pair(owner)
                self._owners[owner] = self._owners.get(owner, 0) + 1
            pair.sides[side] = conn
            self._count += 1
        return conn

    def _run(self, conn: _Conn, ws: Connection) -> None:
        """Wait for the peer (at most wait_seconds), then forward what ``conn`` sends to it."""
        with self._lock:
            conn.ws = ws
            pair = self._pairs.get(conn.session_id)
            peer = None if pair is None else pair.sides.get(_other(conn.side))
            if peer is not None and peer.ws is not None:
                peer.met.set()
                conn.met.set()
        if pair is None or pair.sides.get(conn.side) is not conn:  # closed between the join and now
            ws.close(1000, "closed")
            return
        deadline = time.monotonic() + self.wait_seconds
        while not conn.met.wait(min(_GRACE, max(0.0, deadline - time.monotonic()))):
            if ws.state is State.CLOSED:
                self._end(conn.session_id, pair, f"{conn.side}_gone", conn)
                return
            if time.monotonic() >= deadline:
                self._end(conn.session_id, pair, "peer_absent", None)
                return
        peer = pair.sides.get(_other(conn.side))
        if peer is None or peer.ws is None:  # the pair ended as they met
            ws.close(1000, "closed")
            return
        try:
            while True:
                message = ws.recv()
                if isinstance(message, str):
                    ws.close(1003, "frames are binary messages")
                    break
                if conn.side == "client" and message[:1] == _GONE_TYPE:
                    ws.close(1008, "only the relay and the worker say GONE")
                    break
                peer.ws.send(message)
        except ConnectionClosed:
            pass
        finally:
            left = ws.state is not State.OPEN
            gone = conn.side if left else peer.side
            self._end(conn.session_id, pair, f"{gone}_gone", conn if left else peer)

    def _end(self, session_id: str, pair: _Pair, reason: str, left: _Conn | None) -> None:
        """End ``pair`` once: each side but ``left`` gets GONE ``{"reason"}``; every side is closed."""
        with self._lock:
            if pair.over:
                return
            pair.over = True
            if self._pairs.get(session_id) is pair:
                self._drop(session_id, pair)
            sides = list(pair.sides.values())
            self._count -= len(sides)
        gone = session_wire.json_frame(session_wire.FrameType.GONE, {"reason": reason}).encode()
        for side in sides:
            side.met.set()
            if side.ws is None:  # its own thread closes it
                continue
            if side is not left:
                with contextlib.suppress(ConnectionClosed):
                    side.ws.send(gone)
            side.ws.close(1000, reason)

    def _leave(self, conn: _Conn) -> None:
        with self._lock:
            pair = self._pairs.get(conn.session_id)
            if pair is not None and pair.sides.get(conn.side) is conn:
                del pair.sides[conn.side]
                self._count -= 1
                if not pair.sides:
                    self._drop(conn.session_id, pair)

    def _drop(self, session_id: str, pair: _Pair) -> None:
        """Let go of ``pair``, held at ``session_id``, and give its user's place back (the lock held)."""
        del self._pairs[session_id]
        left = self._owners.get(pair.owner, 0) - 1
        if left > 0:
            self._owners[pair.owner] = left
        else:
            self._owners.pop(pair.owner, None)


def _other(side: SessionSide) -> SessionSide:
    return "worker" if side == "client" else "client"


def _error(refused: Refused) -> bytes:
    body = json.dumps({"error": {"code": refused.code, "message": refused.message}}).encode()
    phrase = http.HTTPStatus(refused.status).phrase
    head = (
        f"HTTP/1.1 {refused.status} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body
