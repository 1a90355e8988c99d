"""The worker's side of a session's connection to its relay: the one Link of both sides
(runplane.client._link: frames numbered, put in order, acked and kept alive through any relay, a
send that waits while the client has taken too little), with the worker's ways: a send raises
websockets' ConnectionClosed once the connection is over, a receive answers None."""

from __future__ import annotations

import logging
from collections.abc import Callable

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection

from runplane.client import _link
from runplane.client._link_dial import connect, shown
from runplane.client._link_order import SessionLost
from runplane.domain.session_wire import Frame
from runplane.domain.sessions import RelayEndpoint

log = logging.getLogger(__name__)

CONNECT_SECONDS = 10.0


class RelayUnreachable(Exception):
    """The relay could not be reached, or refused this side's ticket."""


def connection(endpoint: RelayEndpoint) -> ClientConnection:
    """A WebSocket connection to ``endpoint``. Raises RelayUnreachable."""
    url = endpoint.url
    try:
        conn: ClientConnection = connect(
            url, endpoint.headers, endpoint.encoding, open_timeout=CONNECT_SECONDS, env_proxy=False
        )
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as e:
        raise RelayUnreachable(f"the relay at {shown(url)} cannot be reached: {e}") from e
    return conn


class Link(_link.Link):
    """One side's connection to a session's relay, used by at most two threads: one receives,
    any may send."""

    @classmethod
    def dial(cls, endpoint: RelayEndpoint, redial: Callable[[], ClientConnection] | None = None) -> Link:
        """A link to ``endpoint``; with ``redial`` (a new connection, raising Refused once the session
        is over), one that dials again when its connection drops."""
        return cls(connection(endpoint), endpoint.max_frame, encoding=endpoint.encoding, redial=redial)

    def send(self, frame: Frame) -> None:
        """Send one frame (numbered here unless a HELLO, PING, PONG or ACK); blocks while the peer
        is slow. Raises ConnectionClosed."""
        try:
            super().send(frame)
        except SessionLost as e:
            raise ConnectionClosed(None, None) from e

    def recv(self, until: float | None = None) -> Frame | None:
        """The next frame from the peer (never a PING, PONG or ACK); None when the connection is
        over (closed, the peer silent too long, or a message that is no frame) or, with
        ``until`` (of ``clock``), once it has passed."""
        while True:
            left = None if until is None else until - self.clock()
            if left is not None and left <= 0:
                return None
            try:
                frame = super().recv(left if left is not None else 1.0)
            except SessionLost as e:
                log.info("session link over: %s", e)
                return None
            if frame is not None or until is not None:
                return frame
