"""The relay function's three routes (functions/aws/relay.py), on API Gateway's WebSocket proxy events.

``$connect`` (the upgrade waits on it): the ticket of the ``Authorization: Bearer`` header is checked
as the one-machine hub checks it (``read_ticket``, the session read, ``admits``: client, then
worker); any ticket that does not open the session is 401, whatever is wrong with it; a side that
is connected already is 409, unless its connection is gone (the gateway says so, past its
``CONNECT_GRACE_SECONDS``, or its records are past their life): then the new one takes its place.
The connection's record is written before the place is claimed (and dropped when the claim
fails): a place never names a connection the relay does not know. ``$default``: the message (a
frame's base64) goes unchanged to the peer's connection; one before the peer is there is dropped
(the sides' HELLO exchange copes); the sender's record counts its messages of each second, and
one past the relay's ``message_rate`` ends its side with GONE ``too_fast``; a sender whose side's
place names another connection is told GONE ``replaced`` and hung up; one that is not a frame's
base64, or carries over ``max_frame`` payload bytes, ends its side; a client's GONE frame is
never passed on (only the relay and the worker say GONE). A peer found gone ends the session:
the sender gets GONE ``<peer>_gone`` and is hung up. ``$disconnect`` (best effort: the records'
TTL is the backstop): the records go and the peer gets GONE ``<side>_gone`` and is hung up.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Mapping
from typing import Any

from runplane.adapters.aws.relay import AwsSessionRelay, Held, other
from runplane.domain import session_wire
from runplane.domain.errors import Misconfigured, NotFound, RunplaneError
from runplane.domain.session_wire import FrameType
from runplane.domain.sessions import Side, admits, read_ticket
from runplane.ports import SessionStore

__all__ = ["CONNECT_GRACE_SECONDS", "RelayRoutes"]

log = logging.getLogger(__name__)

CONNECT_GRACE_SECONDS = 10.0
"""A connection recorded this recently that the gateway calls gone may still be in its ``$connect``
(API Gateway posts to a connection only once its ``$connect`` answered): a message for it is
dropped, it is not taken for gone, and another connection of its side does not take its place."""
_CLAIMS = 3  # tries at a side whose holder goes while it is looked at


def _answer(status: int, message: str = "") -> dict[str, Any]:
    return {"statusCode": status, **({"body": message} if message else {})}


class RelayRoutes:
    """The relay function's logic: ``handle`` one WebSocket proxy event of ``relay``'s API, with
    sessions read from ``sessions`` and tickets judged at ``clock``."""

    def __init__(self, sessions: SessionStore, relay: AwsSessionRelay, clock: Callable[[], float]) -> None:
        self.sessions, self.relay, self.clock = sessions, relay, clock
        self.connections, self.gateway = relay.connections, relay.gateway

    @classmethod
    def of(cls, sessions: SessionStore | None, relay: object, clock: Callable[[], float]) -> RelayRoutes:
        """The routes of a stack's ``sessions`` and ``relay``. Raises Misconfigured when the stack has
        no AWS relay (``RUNPLANE_RELAY_URL`` unset)."""
        if sessions is None or not isinstance(relay, AwsSessionRelay):
            raise Misconfigured("the relay function needs RUNPLANE_RELAY_URL (the WebSocket API's wss:// URL)")
        return cls(sessions, relay, clock)

    def handle(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """The answer to one event. A store or gateway failure is logged and answered (503 to a
        ``$connect``, 500 else), never raised: API Gateway would send a failed ``$default``'s
        side a text message of its own ("Internal server error"), which is no frame."""
        context = event.get("requestContext") or {}
        route, connection_id = context.get("routeKey"), context.get("connectionId")
        if not isinstance(connection_id, str) or not connection_id:
            return _answer(400, "no connection")
        try:
            return self._route(route, connection_id, event)
        except RunplaneError as e:
            log.warning("relay %s of %s failed: %s", route, connection_id, e)
            return _answer(503, "try again") if route == "$connect" else _answer(500)

    def _route(self, route: object, connection_id: str, event: Mapping[str, Any]) -> dict[str, Any]:
        if route == "$connect":
            return self.connect(connection_id, event.get("headers") or {})
        if route == "$disconnect":
            self.disconnect(connection_id)
            return _answer(200)
        body = event.get("body")
        if event.get("isBase64Encoded") or not isinstance(body, str):
            self.end(connection_id)  # API Gateway itself closes binary messages (1003): never here
            return _answer(200)
        self.message(connection_id, body)
        return _answer(200)

    def connect(self, connection_id: str, headers: Mapping[str, Any]) -> dict[str, Any]:
        admitted = self._admit(headers)
        if isinstance(admitted, int):
            return _answer(admitted, "this ticket does not open a session here" if admitted == 401 else "try again")
        session_id, side = admitted
        held = Held(session_id, side, connection_id, self.clock())
        self.connections.record(held)  # first: whoever ends the session from here on finds it
        if not self._claim(held):
            self.connections.drop(connection_id)
            return _answer(409, f"the {side} of this session is connected already")
        return _answer(200)

    def _claim(self, held: Held) -> bool:
        """Take ``held``'s side: free, or held by a connection that is gone (and not still in its own
        ``$connect``, which the gateway calls gone too)."""
        for _ in range(_CLAIMS):
            if self.connections.claim(held):
                return True
            holder = self.connections.side(held.session_id, held.side)
            if holder is None:
                continue
            if held.connected_at - holder.connected_at < CONNECT_GRACE_SECONDS:
                return False
            if self.gateway.alive(holder.connection_id):
                return False
            if self.connections.claim(held, replacing=holder.connection_id):
                self.connections.drop(holder.connection_id)
                return True
        return False

    def _admit(self, headers: Mapping[str, Any]) -> tuple[str, Side] | int:
        """The session and side a request's ticket is for, else the status refusing it (401; 503 when
        the session cannot be read)."""
        value = next((v for k, v in headers.items() if str(k).lower() == "authorization"), "")
        scheme, _, text = str(value).partition(" ")
        read = read_ticket(text.strip()) if scheme.lower() == "bearer" else None
        if read is None:
            return 401
        session_id, secret = read
        try:
            session = self.sessions.get(session_id)
        except NotFound:
            return 401
        except RunplaneError as e:
            log.warning("relay could not read session %s: %s", session_id, e)
            return 503
        now = self.clock()
        for side in ("client", "worker"):
            if admits(session, side, secret, now):
                return session_id, side
        return 401

    def message(self, connection_id: str, body: str) -> None:
        spent = self.connections.spend(connection_id, int(self.clock()))
        if spent is None:  # its session was hung up (or its records expired): it goes too
            self.gateway.delete(connection_id)
            return
        held, sent = spent
        if sent > self.relay.message_rate:
            self.end(connection_id, "too_fast")
            return
        try:
            frame = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            self.end(connection_id)
            return
        if len(frame) < session_wire.HEADER.size or len(frame) - session_wire.HEADER.size > self.relay.max_frame:
            self.end(connection_id)
            return
        if frame[0] == FrameType.GONE and held.side == "client":  # only the relay and the worker say GONE
            return
        sides = self.connections.sides(held.session_id)
        mine = sides.get(held.side)
        if mine is None or mine.connection_id != connection_id:  # its place was freed, or is another's
            self.connections.drop(connection_id)
            if mine is None:
                self.gateway.delete(connection_id)
            else:
                self.relay.hang_up(connection_id, "replaced")
            return
        peer = sides.get(other(held.side))
        if peer is None:  # not there yet: dropped
            return
        if not self.gateway.post(peer.connection_id, body.encode()):
            if self.clock() - peer.connected_at < CONNECT_GRACE_SECONDS:
                return
            self.end(peer.connection_id)

    def disconnect(self, connection_id: str) -> None:
        self.end(connection_id)

    def end(self, connection_id: str, reason: str | None = None) -> None:
        """``connection_id``'s side goes: its records are dropped, its peer gets GONE ``<side>_gone``
        and is hung up, and it is closed (told GONE ``reason`` first, when there is one). Once,
        whoever else ends it at the same time."""
        held = self.connections.drop(connection_id)
        if held is not None:
            peer = self.connections.side(held.session_id, other(held.side))
            if peer is not None and self.connections.drop(peer.connection_id) is not None:
                self.relay.hang_up(peer.connection_id, f"{held.side}_gone")
        if reason is not None:
            self.relay.hang_up(connection_id, reason)
        self.gateway.delete(connection_id)
