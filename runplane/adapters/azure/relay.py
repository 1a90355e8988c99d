"""Azure's SessionRelay: Azure Web PubSub, one hub (``runplane``), two groups per session.

Each side is a *simple WebSocket client in sendToGroup mode*: every frame it sends, binary as it
is, is published by the service to its peer's group, in order, with no code of ours on the way.
The client is a member of ``s.<session>.c`` and publishes to ``s.<session>.w``; the worker the
mirror. Neither is ever in the group it publishes to, so nothing echoes back.

Who may join is decided by our ``connect`` event handler (``handle_event``, served by the function
app at EVENTS_PATH and named in the hub's settings), not by the token in the URL: the URL carries a
*connect-only* token (``sub`` the session id, no role, no group; it opens a connection that can
neither receive nor send anything), so a session record, which keeps both URLs, keeps no usable
secret. The side's ticket travels as ``X-Runplane-Ticket: Bearer <ticket>`` (the service hands the
connection's request headers to the ``connect`` event); the handler checks it as the embedded
relay does (``admits``) and answers the side's one group and its one role (sendToGroup of the
peer's group), or 401. Events are authenticated by ``ce-signature`` (HMAC-SHA256 of the connection
id under the hub's access key), which signs nothing else: so the user id the ``connect`` answer
gives a side, ``<session>.<side>.<tag>``, carries a tag of its own, an HMAC of the connection id and
the rest under the same key, and a ``disconnected`` event acts only on the side its connection was
let in as (another user id is 401), and only once the service says (REST) that connection is gone
and no connection of that side is left: a leaked signature of a connection cannot hang up another
session, nor a side still there. A ``disconnected`` side's peer then gets GONE ``<side>_gone`` and is
closed; ``close`` sends GONE to both groups and closes their connections (the service's REST API,
with tokens minted here under the access key).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpx

from runplane.domain import session_wire
from runplane.domain.errors import NotFound, RunplaneError
from runplane.domain.sessions import BINARY, RelayEndpoint, Session, Side, admits, read_ticket
from runplane.ports import SessionStore

log = logging.getLogger(__name__)

HUB = "runplane"
TICKET_HEADER = "X-Runplane-Ticket"
EVENTS_PATH = "/relay/events"
"""Where the function app takes the hub's events (its route ``relay/events``)."""
MAX_FRAME = 64 * 1024
"""Payload bytes per frame: well under the service's 1 MB per message."""
TOKEN_SECONDS = 15 * 60
"""How long a URL's connect-only token opens connections: a side dials within a minute of the
session's making (the client's fresh ticket comes with a fresh URL)."""
WORKER_TOKEN_SECONDS = 24 * 3600
"""How long the worker's URL (kept in the session: it dials again with it after a drop) opens
connections: as long as a session can last. It opens nothing without a ticket of the session's."""
REST_SECONDS = 60
API_VERSION = "2024-12-01"
_SIDES: tuple[Side, Side] = ("client", "worker")


def group(session_id: str, side: Side) -> str:
    """The group ``side`` of ``session_id`` is a member of (its peer publishes to it)."""
    return f"s.{session_id}.{side[0]}"


def _peer(side: Side) -> Side:
    return "worker" if side == "client" else "client"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(key: str, claims: Mapping[str, Any]) -> str:
    """A JWT (HS256) of ``claims`` signed with ``key``: what the service takes from clients and on
    its REST API."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64(json.dumps(dict(claims), separators=(",", ":")).encode())
    signature = hmac.new(key.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(signature)}"


def signature(key: str, connection_id: str) -> str:
    """``ce-signature``'s value for ``connection_id`` under ``key`` (one of those the header lists)."""
    return "sha256=" + hmac.new(key.encode(), connection_id.encode(), hashlib.sha256).hexdigest()


def user_id(key: str, connection_id: str, session_id: str, side: Side) -> str:
    """The user id a side's connection ``connection_id`` is let in as: ``<session>.<side>.<tag>``, the
    tag an HMAC under ``key`` of the connection id and the rest (what binds the unsigned
    ``ce-userId`` of its later events to their signed connection id)."""
    named = f"{session_id}.{side}"
    tag = hmac.new(key.encode(), f"user-id\n{connection_id}\n{named}".encode(), hashlib.sha256).hexdigest()
    return f"{named}.{tag[:32]}"


@dataclass(frozen=True)
class WebPubSubAccess:
    """A Web PubSub resource: its endpoint (``https://NAME.webpubsub.azure.com``) and an access key."""

    endpoint: str
    key: str

    @classmethod
    def parse(cls, text: str) -> WebPubSubAccess:
        """From a connection string, ``Endpoint=https://...;AccessKey=...;Version=1.0;`` (and
        ``Port=N;`` when not the scheme's). Raises ValueError naming what is missing (never the key)."""
        parts: dict[str, str] = {}
        for item in text.split(";"):
            name, sep, value = item.strip().partition("=")
            if sep:
                parts[name.strip().lower()] = value.strip()
        endpoint, key = parts.get("endpoint", ""), parts.get("accesskey", "")
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname or not key:
            raise ValueError("a Web PubSub connection string needs Endpoint=https://... and AccessKey=...")
        netloc = url.netloc if not parts.get("port") else f"{url.hostname}:{int(parts['port'])}"
        return cls(f"{url.scheme}://{netloc}".lower(), key)


@dataclass(frozen=True)
class EventAnswer:
    """What the event route answers the service."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


_REFUSED = EventAnswer(
    401,
    {"Content-Type": "application/json"},
    json.dumps({"error": {"code": "unauthorized", "message": "this ticket does not open a session here"}}).encode(),
)


class WebPubSubSessionRelay:
    """Sessions meet in ``hub`` of the Web PubSub resource ``access``. ``sessions``: where the
    ``connect`` event checks tickets; ``http``: the client of the REST API (made when not given)."""

    def __init__(
        self,
        access: WebPubSubAccess,
        sessions: SessionStore,
        hub: str = HUB,
        clock: Callable[[], float] = time.time,
        http: httpx.Client | None = None,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.access, self.sessions, self.hub, self.clock = access, sessions, hub, clock
        self.max_frame = max_frame
        self._http = http or httpx.Client(timeout=REST_SECONDS)
        scheme = "wss" if access.endpoint.startswith("https:") else "ws"
        self.client_url = f"{scheme}{access.endpoint[access.endpoint.index(':') :]}/client/hubs/{quote(hub)}"

    # ---- the port ---------------------------------------------------------------------------

    def endpoint(self, session: Session, ticket: str) -> RelayEndpoint:
        return RelayEndpoint(
            url=self._url(self._token(session, TOKEN_SECONDS), group(session.id, "worker")),
            headers={TICKET_HEADER: f"Bearer {ticket}"},
            max_frame=self.max_frame,
            encoding=BINARY,
            worker_url=self._url(self._token(session, WORKER_TOKEN_SECONDS), group(session.id, "client")),
        )

    def _token(self, session: Session, seconds: int) -> str:
        """A connect-only token of the hub for ``seconds`` (the ``connect`` event still asks for a ticket)."""
        now = int(self.clock())
        claims = {"aud": f"{self.access.endpoint}/client/hubs/{self.hub}", "iat": now, "exp": now + seconds}
        return mint(self.access.key, {**claims, "sub": session.id})

    def close(self, session_id: str, reason: str) -> None:
        """GONE ``{"reason"}`` to both sides, then their connections closed (GONE to both first: the
        ``disconnected`` event of the first closed finds the session over and tells its peer
        nothing more). A failure of the service's is logged: the session is over in its store
        either way."""
        gone = session_wire.json_frame(session_wire.FrameType.GONE, {"reason": reason}).encode()
        try:
            for side in _SIDES:
                self._send(group(session_id, side), gone)
            for side in _SIDES:
                self._close(group(session_id, side), reason)
        except RunplaneError as e:
            log.warning("session %s: the relay did not hang up: %s", session_id, e)

    # ---- the hub's events -------------------------------------------------------------------

    def handle_event(self, method: str, headers: Mapping[str, str], body: bytes) -> EventAnswer:
        """Answer one request of the service to the event handler (CloudEvents, binary mode):
        the abuse-protection ``OPTIONS``, then ``connect`` (the side's group and role, or 401),
        ``connected`` and ``disconnected`` (the peer told and closed). A request whose
        ``ce-signature`` is not of ``ce-connectionId`` under the key is 401; never raises."""
        h = {k.lower(): v for k, v in headers.items()}
        if method.upper() == "OPTIONS":
            origin = h.get("webhook-request-origin", "")
            if origin and origin.lower() == (urlsplit(self.access.endpoint).hostname or ""):
                return EventAnswer(200, {"WebHook-Allowed-Origin": origin})
            return EventAnswer(400)
        if method.upper() != "POST":
            return EventAnswer(405)
        connection = h.get("ce-connectionid", "")
        offered = {s.strip() for s in h.get("ce-signature", "").split(",")}
        if not connection or not any(hmac.compare_digest(signature(self.access.key, connection), s) for s in offered):
            return EventAnswer(401)
        if h.get("ce-hub") != self.hub:
            return EventAnswer(401)
        kind = h.get("ce-type", "")
        if kind == "azure.webpubsub.sys.connect":
            return self._connect(connection, h.get("ce-userid", ""), body)
        if kind == "azure.webpubsub.sys.disconnected":
            return self._disconnected(connection, h.get("ce-userid", ""))
        if kind != "azure.webpubsub.sys.connected":  # a message event: no side of ours sends any
            return EventAnswer(400)
        return EventAnswer(204)

    def _connect(self, connection: str, user: str, body: bytes) -> EventAnswer:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return EventAnswer(400)
        headers, query = (request.get(k) if isinstance(request, dict) else None for k in ("headers", "query"))
        if not isinstance(headers, dict) or not isinstance(query, dict):
            return EventAnswer(400)
        ticket_text = ""
        for name, values in headers.items():
            if isinstance(name, str) and name.lower() == TICKET_HEADER.lower() and isinstance(values, list) and values:
                ticket_text = str(values[0])
        scheme, _, text = ticket_text.partition(" ")
        read = read_ticket(text.strip()) if scheme.lower() == "bearer" else None
        if read is None or read[0] != user:  # the URL's token names the session the ticket is of
            return _REFUSED
        session_id, secret = read
        try:
            session = self.sessions.get(session_id)
        except NotFound:
            return _REFUSED
        except RunplaneError as e:
            log.warning("relay could not read session %s: %s", session_id, e)
            return EventAnswer(503)
        side = next((s for s in _SIDES if admits(session, s, secret, self.clock())), None)
        if side is None or query.get("group") != [group(session_id, _peer(side))]:
            return _REFUSED  # the other side's URL: it would publish to itself
        try:
            held = self._rest("HEAD", f"/groups/{quote(group(session_id, side), safe='')}", b"", {}, ok=(404,))
        except RunplaneError as e:
            log.warning("relay could not look at session %s: %s", session_id, e)
            return EventAnswer(503)
        if held == 200:  # (two at once both pass: the service's group has no conditional join)
            return EventAnswer(
                409,
                {"Content-Type": "application/json"},
                json.dumps(
                    {"error": {"code": "conflict", "message": f"the {side} of this session is connected already"}}
                ).encode(),
            )
        answer = {
            "userId": user_id(self.access.key, connection, session_id, side),
            "groups": [group(session_id, side)],
            "roles": [f"webpubsub.sendToGroup.{group(session_id, _peer(side))}"],
        }
        return EventAnswer(200, {"Content-Type": "application/json"}, json.dumps(answer).encode())

    def _disconnected(self, connection: str, user: str) -> EventAnswer:
        """The peer of the side ``connection`` was let in as told and closed, once the service says
        that connection is gone and no connection of its side is left; 401 for a user id that is
        not the one ``connection`` was let in as."""
        session_id, side = _named(user)
        if session_id is None or side is None:
            return EventAnswer(401)
        if not hmac.compare_digest(user_id(self.access.key, connection, session_id, side), user):
            return EventAnswer(401)
        try:
            there = [
                self._rest("HEAD", f"/connections/{quote(connection, safe='')}", b"", {}, ok=(404,)),
                self._rest("HEAD", f"/groups/{quote(group(session_id, side), safe='')}", b"", {}, ok=(404,)),
            ]
        except RunplaneError as e:
            log.warning("session %s: the relay could not look at the %s: %s", session_id, side, e)
            return EventAnswer(204)
        if 200 in there:  # the connection, or another of its side, is still there: not that side's end
            return EventAnswer(204)
        self._tell_gone(session_id, side)
        return EventAnswer(204)

    def _tell_gone(self, session_id: str, side: Side) -> None:
        peer, reason = _peer(side), f"{side}_gone"
        try:
            over = self.sessions.get(session_id).state.over
        except NotFound:
            over = True
        except RunplaneError:
            over = False
        try:
            if not over:  # one that is over was closed, or its worker said how it ended before it went
                self._send(
                    group(session_id, peer),
                    session_wire.json_frame(session_wire.FrameType.GONE, {"reason": reason}).encode(),
                )
            self._close(group(session_id, peer), reason)
        except RunplaneError as e:
            log.warning("session %s: the relay did not tell the %s: %s", session_id, peer, e)

    # ---- the service's REST API -------------------------------------------------------------

    def _url(self, token: str, to: str) -> str:
        return f"{self.client_url}?" + urlencode({"access_token": token, "webpubsub_mode": "sendToGroup", "group": to})

    def _send(self, name: str, frame: bytes) -> None:
        self._rest("POST", f"/groups/{quote(name, safe='')}/:send", frame, {"Content-Type": "application/octet-stream"})

    def _close(self, name: str, reason: str) -> None:
        self._rest("POST", f"/groups/{quote(name, safe='')}/:closeConnections", b"", {}, {"reason": reason})

    def _rest(
        self,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        params: dict[str, str] | None = None,
        ok: tuple[int, ...] = (),
    ) -> int:
        """The status of one call of the REST API: a success, or one of ``ok``; else RunplaneError."""
        url = f"{self.access.endpoint}/api/hubs/{quote(self.hub, safe='')}{path}"
        now = int(self.clock())
        token = mint(self.access.key, {"aud": url, "iat": now, "exp": now + REST_SECONDS})
        try:
            answer = self._http.request(
                method,
                url,
                params={**(params or {}), "api-version": API_VERSION},
                content=body,
                headers={**headers, "Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as e:
            raise RunplaneError(f"Web PubSub cannot be reached: {type(e).__name__}") from e
        if answer.status_code >= 300 and answer.status_code not in ok:
            raise RunplaneError(f"Web PubSub answered {answer.status_code} to {method} {path.split('/')[-1]}")
        return answer.status_code


def _named(user: str) -> tuple[str | None, Side | None]:
    """The session and side a user id (``user_id``'s form) names; (None, None) when it names none."""
    parts = user.rsplit(".", 2)
    if len(parts) != 3 or not parts[0]:
        return None, None
    side = next((s for s in _SIDES if s == parts[1]), None)
    return (parts[0], side) if side is not None else (None, None)
