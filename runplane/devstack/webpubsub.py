"""A stand-in for Azure Web PubSub on one machine, for the subset runplane uses: what the azure
cloud of ``runplane dev`` puts in the service's place, and what the relay's tests run against.

- Clients: ``GET /client/hubs/{hub}`` (or ``/client/?hub={hub}``) upgraded to a WebSocket, with a
  JWT (HS256 under the access key; ``aud`` ``<endpoint>/client/hubs/<hub>``, ``exp`` required) in
  ``?access_token=`` or ``Authorization: Bearer``; else 401. Claims ``sub`` (the user),
  ``role`` and ``webpubsub.group`` (joined on connect), one value or a list.
- Simple clients only (a subprotocol other than the service's is kept, the service's own
  ``json.webpubsub.azure.v1`` / ``protobuf`` are not served: 400): ``sendEvent`` mode (each message
  a ``message`` event to the hub's handler, whose answer comes back as a message) or
  ``?webpubsub_mode=sendToGroup&group=G`` (each message published to ``G``'s members, binary or
  text as it came, in order; without the role ``webpubsub.sendToGroup`` or
  ``webpubsub.sendToGroup.G`` the connection is closed 1008: the documentation says the role is
  needed, not what befalls a message without it). Messages over 1 MB close the connection (1009).
- The hub's event handler (``handle``: its URL and system events): the abuse-protection
  ``OPTIONS`` once per URL, then ``connect`` (blocking: 200 ``{userId, groups, roles}``, 204, or a
  4xx answered to the client), ``connected``, ``disconnected`` (``{"reason"}``, after every
  connect that succeeded, in order) as CloudEvents in binary mode with ``ce-signature``; the
  ``connect`` body has ``claims``, ``query`` (less ``access_token``), ``headers`` and
  ``subprotocols``.
- REST, ``/api/hubs/{hub}/...`` with a JWT (HS256, ``aud`` the request's URL without its query):
  ``:send``, ``groups/{g}/:send``, ``connections/{id}/:send`` (a ``application/octet-stream`` body
  goes out binary, any other as text; 202), ``groups/{g}/:closeConnections``, ``DELETE
  connections/{id}`` (204), ``HEAD connections/{id}`` and ``HEAD groups/{g}`` (any member: 200,
  else 404), ``PUT|DELETE
  groups/{g}/connections/{id}`` (200/404). A send is delivered before it is answered.
Not here: the PubSub subprotocols, permissions by REST, users, MQTT, Socket.IO, reconnectable
clients. Where the documentation says nothing (echo to a member that publishes to its own group:
here it gets it), the fake picks and says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
import socket
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx
import jwt
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request
from websockets.protocol import Protocol, Side, State
from websockets.server import ServerProtocol
from websockets.sync.connection import Connection

log = logging.getLogger(__name__)
MAX_MESSAGE = 1024 * 1024
EVENT_SECONDS = 30.0
CLOCK_SKEW = 300
"""Seconds a token's times may be off (ASP.NET's default skew, which the service is built on, is as much)."""
_SERVICE_PROTOCOLS = ("json.webpubsub.azure.v1", "protobuf.webpubsub.azure.v1")
_REST = re.compile(r"/api/hubs/(?P<hub>[^/]+)(?P<rest>/.*)")


@dataclass(frozen=True)
class Handler:
    """A hub's event handler: where events go, and which system events it takes."""

    url: str
    system_events: frozenset[str] = frozenset({"connect", "connected", "disconnected"})


@dataclass(eq=False)
class _Conn:
    id: str
    hub: str
    user: str
    ws: Connection
    groups: set[str] = field(default_factory=set)
    roles: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: Future[Any] | None = None
    """Its last system event queued (``connected``): its message events wait for it, in order."""

    def send(self, message: str | bytes) -> None:
        with self.lock, contextlib.suppress(ConnectionClosed):
            self.ws.send(message)


class Refused(Exception):
    def __init__(self, status: int, body: bytes = b"") -> None:
        super().__init__(status)
        self.status, self.body = status, body


class WebPubSubFake:
    """The service on ``host``:``port`` (0: any free one) with access key ``key`` (made when not
    given). ``start()`` serves it in threads of its own; ``stop()`` closes every connection."""

    def __init__(self, key: str | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.key = key or secrets.token_urlsafe(32)
        self.handlers: dict[str, Handler] = {}
        self._server = _Server((host, port), self)
        self._lock = threading.Lock()
        self._conns: dict[str, _Conn] = {}
        self._groups: dict[tuple[str, str], set[_Conn]] = {}
        self._validated: set[str] = set()
        self._events = ThreadPoolExecutor(1, thread_name_prefix="webpubsub-events")  # unblocking events, in order
        self._http = httpx.Client(timeout=EVENT_SECONDS)
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    @property
    def connection_string(self) -> str:
        return f"Endpoint={self.endpoint};AccessKey={self.key};Version=1.0;"

    def handle(self, hub: str, url: str, system_events: frozenset[str] | None = None) -> None:
        """Send ``hub``'s events to ``url`` (the hub setting's event handler)."""
        self.handlers[hub] = Handler(url, system_events if system_events is not None else Handler.system_events)

    def start(self) -> WebPubSubFake:
        self._thread = threading.Thread(target=self._server.serve_forever, name="webpubsub-fake", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.ws.close(1001, "service stopping")
        self._events.shutdown(wait=True)
        self._http.close()

    def connections(self, hub: str, group: str | None = None) -> list[str]:
        """The ids of ``hub``'s connections (of ``group`` only, when given)."""
        with self._lock:
            if group is not None:
                return sorted(c.id for c in self._groups.get((hub, group), ()))
            return sorted(c.id for c in self._conns.values() if c.hub == hub)

    def user(self, connection_id: str) -> str | None:
        """The user id connection ``connection_id`` holds (what its events' ``ce-userId`` say); None
        when it is gone."""
        with self._lock:
            conn = self._conns.get(connection_id)
            return conn.user if conn is not None else None

    # ---- clients ----------------------------------------------------------------------------

    def serve_client(self, sock: socket.socket, target: str, headers: Headers) -> None:
        url = urlsplit(target)
        query = parse_qs(url.query, keep_blank_values=True)
        path = unquote(url.path)
        hub = path[len("/client/hubs/") :] if path.startswith("/client/hubs/") else (query.get("hub") or [""])[0]
        if not hub or "/" in hub:
            raise Refused(404)
        handshake = ServerProtocol(
            select_subprotocol=lambda _, offered: next((p for p in offered if p not in _SERVICE_PROTOCOLS), None)
        )
        response = handshake.accept(Request(target, headers))
        if response.status_code != 101:
            sock.sendall(response.serialize())
            return
        offered = [p.strip() for v in headers.get_all("Sec-WebSocket-Protocol") for p in v.split(",")]
        if any(p in _SERVICE_PROTOCOLS for p in offered):
            raise Refused(400, b"this stand-in serves simple WebSocket clients only")
        claims = self._client_claims(hub, query, headers)
        mode = (query.get("webpubsub_mode") or ["sendEvent"])[0]
        to = query.get("group") or []
        if mode not in ("sendEvent", "sendToGroup") or (mode == "sendToGroup" and len(to) != 1):
            raise Refused(400, b"webpubsub_mode is sendEvent, or sendToGroup with one group")
        conn_id = secrets.token_urlsafe(16)
        user, groups, roles = self._connect(hub, conn_id, claims, query, headers, offered)
        ws = Connection(sock, Protocol(Side.SERVER, state=State.OPEN, max_size=MAX_MESSAGE), close_timeout=5)
        conn = _Conn(conn_id, hub, user, ws, roles=roles)
        with conn.lock:  # in its groups before its handshake's answer; nothing reaches it before that
            with self._lock:
                self._conns[conn_id] = conn
            for name in groups:
                self._join(conn, name)
            sock.sendall(response.serialize())
        self._event(hub, "connected", conn, {})
        reason = ""
        try:
            for message in ws:
                if mode == "sendEvent":
                    self._message_event(conn, message)
                    continue
                if not ({"webpubsub.sendToGroup", f"webpubsub.sendToGroup.{to[0]}"} & conn.roles):
                    ws.close(1008, "Forbidden: no permission to send to the group")
                    break
                self.publish(hub, to[0], message)
        except ConnectionClosed as e:
            reason = e.reason if e.rcvd is not None else str(e)
        finally:
            with self._lock:
                self._conns.pop(conn_id, None)
                for members in self._groups.values():
                    members.discard(conn)
            self._event(hub, "disconnected", conn, {"reason": reason})

    def _client_claims(self, hub: str, query: Mapping[str, list[str]], headers: Headers) -> dict[str, Any]:
        token = (query.get("access_token") or [""])[0]
        scheme, _, bearer = (headers.get("Authorization") or "").partition(" ")
        token = token or (bearer.strip() if scheme.lower() == "bearer" else "")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self.key,
                algorithms=["HS256"],
                audience=f"{self.endpoint}/client/hubs/{hub}",
                options={"require": ["exp"]},
                leeway=CLOCK_SKEW,
            )
        except jwt.PyJWTError as e:
            raise Refused(401, f"the access token is not valid: {type(e).__name__}".encode()) from None
        return claims

    def _connect(
        self,
        hub: str,
        conn_id: str,
        claims: Mapping[str, Any],
        query: Mapping[str, list[str]],
        headers: Headers,
        offered: list[str],
    ) -> tuple[str, set[str], set[str]]:
        user = str(claims.get("sub") or "")
        groups, roles = set(_values(claims.get("webpubsub.group"))), set(_values(claims.get("role")))
        handler = self.handlers.get(hub)
        if handler is not None and "connect" in handler.system_events:
            body = {
                "claims": {k: [str(v) for v in _values(value)] for k, value in claims.items()},
                "query": {k: v for k, v in query.items() if k != "access_token"},
                "headers": {k: headers.get_all(k) for k in {k.title() for k in headers}},
                "subprotocols": offered,
                "clientCertificates": [],
            }
            answer = self._post(handler.url, hub, "connect", conn_id, user, "sys", json.dumps(body).encode())
            if answer is None or answer.status_code >= 500:
                raise Refused(500)
            if answer.status_code >= 400:
                raise Refused(answer.status_code, answer.content)
            if answer.status_code == 200 and answer.content:
                data = answer.json()
                user = str(data.get("userId") or user)
                groups |= set(_values(data.get("groups")))
                roles |= set(_values(data.get("roles")))
        if not user:
            raise Refused(401, b"no userId: neither the token nor the connect event gave one")
        return user, groups, roles

    def _message_event(self, conn: _Conn, message: str | bytes) -> None:
        handler = self.handlers.get(conn.hub)
        if handler is None:
            return
        if conn.events is not None:  # its connected event first: one connection's events keep their order
            with contextlib.suppress(Exception):
                conn.events.result(timeout=30)
        body = message if isinstance(message, bytes) else message.encode()
        kind = "application/octet-stream" if isinstance(message, bytes) else "text/plain"
        answer = self._post(handler.url, conn.hub, "message", conn.id, conn.user, "user", body, kind)
        if answer is None or answer.status_code >= 300:
            conn.ws.close(1011, "the event handler failed the message")
        elif answer.status_code == 200 and answer.content:
            binary = answer.headers.get("content-type", "").startswith("application/octet-stream")
            conn.send(answer.content if binary else answer.text)

    def _event(self, hub: str, name: str, conn: _Conn, body: dict[str, Any]) -> None:
        handler = self.handlers.get(hub)
        if handler is not None and name in handler.system_events:
            data = json.dumps(body).encode()
            conn.events = self._events.submit(self._post, handler.url, hub, name, conn.id, conn.user, "sys", data)

    def _post(
        self,
        url: str,
        hub: str,
        name: str,
        conn_id: str,
        user: str,
        kind: str,
        body: bytes,
        content_type: str = "application/json",
    ) -> httpx.Response | None:
        """One CloudEvent to ``url`` (after the abuse-protection handshake, once per URL); None when
        the handler cannot be reached or did not allow the service."""
        origin = urlsplit(self.endpoint).hostname or ""
        try:
            if url not in self._validated:
                check = self._http.options(url, headers={"WebHook-Request-Origin": origin})
                if check.headers.get("WebHook-Allowed-Origin") not in ("*", origin):
                    log.warning("event handler %s did not allow %s", url, origin)
                    return None
                self._validated.add(url)
            event_headers = {
                "Content-Type": content_type,
                "WebHook-Request-Origin": origin,
                "ce-specversion": "1.0",
                "ce-type": f"azure.webpubsub.{kind}.{name}",
                "ce-source": f"/hubs/{hub}/client/{conn_id}",
                "ce-id": secrets.token_hex(8),
                "ce-signature": "sha256=" + hmac.new(self.key.encode(), conn_id.encode(), hashlib.sha256).hexdigest(),
                "ce-userId": user,
                "ce-connectionId": conn_id,
                "ce-hub": hub,
                "ce-eventName": name,
            }
            return self._http.post(url, content=body, headers=event_headers)
        except httpx.HTTPError as e:
            log.warning("event %s to %s failed: %s", name, url, e)
            return None

    # ---- groups and REST --------------------------------------------------------------------

    def _join(self, conn: _Conn, name: str) -> None:
        with self._lock:
            self._groups.setdefault((conn.hub, name), set()).add(conn)
            conn.groups.add(name)

    def publish(self, hub: str, group: str | None, message: str | bytes) -> None:
        """``message`` to every member of ``group`` of ``hub`` (every connection when None)."""
        with self._lock:
            members = list(self._conns.values() if group is None else self._groups.get((hub, group), ()))
        for conn in members:
            if conn.hub == hub:
                conn.send(message)

    def rest(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        url = urlsplit(target)
        match = _REST.fullmatch(url.path)
        if match is None:
            return 404, b""
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        try:
            jwt.decode(
                token.strip() if scheme.lower() == "bearer" else "",
                self.key,
                algorithms=["HS256"],
                audience=f"{self.endpoint}{url.path}",
                options={"require": ["exp"]},
                leeway=CLOCK_SKEW,
            )
        except jwt.PyJWTError:
            return 401, b""
        hub, rest = unquote(match["hub"]), match["rest"]
        message: str | bytes = body
        if not (headers.get("Content-Type") or "").startswith("application/octet-stream"):
            message = body.decode("utf-8", "replace")
        parts = [unquote(p) for p in rest.strip("/").split("/")]
        reason = (parse_qs(url.query).get("reason") or [""])[0][:120]
        if method == "POST" and parts == [":send"]:
            self.publish(hub, None, message)
            return 202, b""
        if parts[0] == "groups" and len(parts) >= 2:
            return self._group_call(method, hub, parts[1], parts[2:], message, reason), b""
        with self._lock:
            conn = self._conns.get(parts[1]) if len(parts) == 2 or parts[2:] == [":send"] else None
        if parts[0] != "connections" or conn is None or conn.hub != hub:
            return 404, b""
        if method == "POST" and parts[2:] == [":send"]:
            conn.send(message)
            return 202, b""
        if method == "DELETE" and len(parts) == 2:
            conn.ws.close(1000, reason)
            return 204, b""
        return (200 if method == "HEAD" and len(parts) == 2 else 404), b""

    def _group_call(self, method: str, hub: str, name: str, rest: list[str], message: str | bytes, reason: str) -> int:
        with self._lock:
            members = list(self._groups.get((hub, name), ()))
            other = self._conns.get(rest[1]) if len(rest) == 2 and rest[0] == "connections" else None
        if method == "HEAD" and not rest:
            return 200 if members else 404
        if method == "POST" and rest == [":send"]:
            self.publish(hub, name, message)
            return 202
        if method == "POST" and rest == [":closeConnections"]:
            for member in members:
                member.ws.close(1000, reason)
            return 204
        if other is None or other.hub != hub or method not in ("PUT", "DELETE"):
            return 404
        if method == "PUT":
            self._join(other, name)
        else:
            with self._lock:
                self._groups.get((hub, name), set()).discard(other)
                other.groups.discard(name)
        return 200


def _values(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], fake: WebPubSubFake) -> None:
        super().__init__(address, _Request)
        self.fake = fake


class _Request(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120
    server: _Server

    def do_GET(self) -> None:
        if not self.path.startswith("/client/") or "websocket" not in (self.headers.get("Upgrade") or "").lower():
            self._reply(404, b"")
            return
        self.close_connection = True  # the socket is the WebSocket's from here
        try:
            self.server.fake.serve_client(self.connection, self.path, Headers(list(self.headers.items())))
        except Refused as e:
            self._reply(e.status, e.body)

    def _rest(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, answer = self.server.fake.rest(self.command, self.path, dict(self.headers.items()), body)
        self._reply(status, answer)

    do_POST = do_PUT = do_DELETE = do_HEAD = _rest

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if body:
            self.send_header("Content-Type", "text/plain")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)
