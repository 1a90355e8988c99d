"""The worker's side of a session's connection to its relay: frames out (numbered, one sender at a
time, a blocking send so that a slow client slows the command down, never a queue that grows) and
frames in, with the keepalive: a PING every ``PING_SECONDS``, a PONG for each PING, and a peer
silent for ``SILENT_SECONDS`` taken as gone."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from runplane.domain.session_wire import HEADER, MAX_PAYLOAD, BadFrame, Frame, FrameType, Sequencer, decode, ping
from runplane.domain.sessions import RelayEndpoint

log = logging.getLogger(__name__)

PING_SECONDS = 30.0
SILENT_SECONDS = 90.0
CONNECT_SECONDS = 10.0
SEND_LOCK_SECONDS = 2.0
"""How long hanging up waits for a send in progress before it drops the connection instead."""


class RelayUnreachable(Exception):
    """The relay could not be reached, or refused this side's ticket."""


class Link:
    """One side's connection to a session's relay (``conn``), used by at most two threads: one
    receives, any may send."""

    def __init__(self, conn: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.conn = conn
        self.clock = clock
        self.bytes_out = 0  # DATA payload bytes sent, and received
        self.bytes_in = 0
        self._lock = threading.Lock()
        self._seq = Sequencer()
        self._heard = self._pinged = clock()
        self.closed = threading.Event()

    @classmethod
    def dial(cls, endpoint: RelayEndpoint) -> Link:
        url = endpoint.url
        try:
            conn: ClientConnection = connect(
                url,
                additional_headers=endpoint.headers,
                max_size=MAX_PAYLOAD + HEADER.size,
                compression=None,
                proxy=None,
                ping_interval=None,  # the frames' own PING keeps the session alive, through any relay
                open_timeout=CONNECT_SECONDS,
                close_timeout=2,
            )
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as e:
            raise RelayUnreachable(f"the relay at {url} cannot be reached: {e}") from e
        return cls(conn)

    def send(self, frame: Frame) -> None:
        """Send one frame (numbered here unless a PING or PONG); blocks while the peer is slow.
        Raises ConnectionClosed."""
        with self._lock:
            if frame.type not in (FrameType.PING, FrameType.PONG):
                frame = Frame(frame.type, frame.channel, self._seq.next(), frame.payload)
            if frame.type == FrameType.DATA:
                self.bytes_out += len(frame.payload)
            self.conn.send(frame.encode())

    def recv(self, until: float | None = None) -> Frame | None:
        """The next frame from the peer (never a PING or PONG: those are answered here); None when
        the connection is over (closed, the peer silent too long, or a message that is no frame)
        or, with ``until`` (of ``clock``), once it has passed."""
        while True:
            now = self.clock()
            if now - self._heard >= SILENT_SECONDS:
                log.info("session peer silent for %.0f s: gone", now - self._heard)
                self.close()
                return None
            if now - self._pinged >= PING_SECONDS:
                self._pinged = now
                if not self._try(ping(int(time.time() * 1000))):
                    return None
            if until is not None and now >= until:
                return None
            wait = min(self._pinged + PING_SECONDS, self._heard + SILENT_SECONDS) - now
            if until is not None:
                wait = min(wait, until - now)
            try:
                message = self.conn.recv(timeout=max(wait, 0.001))
            except TimeoutError:
                continue
            except ConnectionClosed:
                self.closed.set()
                return None
            self._heard = self.clock()
            try:
                if isinstance(message, str):
                    raise BadFrame("a frame is a binary message")
                frame = decode(message)
            except BadFrame as e:
                log.warning("session peer sent what is no frame (%s): hanging up", e)
                self.close()
                return None
            if frame.type == FrameType.PING:
                if not self._try(Frame(FrameType.PONG, 0, 0, frame.payload)):
                    return None
                continue
            if frame.type == FrameType.PONG:
                continue
            if frame.type == FrameType.DATA:
                self.bytes_in += len(frame.payload)
            return frame

    def _try(self, frame: Frame) -> bool:
        try:
            self.send(frame)
        except ConnectionClosed:
            self.closed.set()
            return False
        return True

    def close(self) -> None:
        """Hang up (quiet if already closed); a send stuck on a peer that reads nothing is cut off."""
        if self._lock.acquire(timeout=SEND_LOCK_SECONDS):
            self._lock.release()
        else:
            self.abort()
        try:
            self.conn.close()
        except Exception:  # hanging up must not fail: the connection is gone either way
            log.debug("closing a session's relay connection failed", exc_info=True)
        self.closed.set()

    def abort(self) -> None:
        """Drop the connection at once (a blocked send or receive returns)."""
        sock = getattr(self.conn, "socket", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(2)
