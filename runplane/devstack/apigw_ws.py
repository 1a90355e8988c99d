"""A fake of an API Gateway WebSocket API's data plane on loopback, for the AWS dev stack and the tests
(moto has the control plane only): one port serves the stage's WebSocket (``ws://HOST:PORT/STAGE``)
and its ``@connections`` API (``http://HOST:PORT/STAGE/@connections/{id}``, what boto3's
``apigatewaymanagementapi`` reaches with that ``endpoint_url``).

What it does as the service does (docs.aws.amazon.com/apigateway, WebSocket APIs):
- an upgrade builds the ``$connect`` proxy event (``requestContext`` routeKey, eventType, connectionId,
  domainName, stage, apiId, connectedAt, ...; ``headers``, ``queryStringParameters``) and waits on the
  function: an answer other than 2xx refuses the upgrade with that status; the connection takes
  posts only once its ``$connect`` answered;
- each text message is a ``$default`` event, invoked on a thread of its own, so two messages of
  one connection may run at once (the service promises no order); a binary message closes the
  connection (1003), one over 32 KB too (1009);
- a closed connection is a ``$disconnect`` event;
- ``@connections``: POST (a message to that connection, as text when it is UTF-8), GET, DELETE (a
  close); a connection that is not there is 410 GoneException, a message over 32 KB 413; a request
  without a SigV4 signature 403 (the signature itself is not checked);
- a connection closes after ``idle_seconds`` without a message either way (10 minutes) and after
  ``max_seconds`` whatever (2 hours); both settable to seconds for tests;
- when throttled (``throttle(rate, burst)``: the stage's default route throttle, a token bucket
  over all connections' messages), a message past it is not handed to the function: its sender
  gets the service's text message ``{"message": "Too Many Requests", "connectionId", "requestId"}``
  instead.

Where it differs (README, "Fakes"): the service delivers ``$disconnect`` on a best-effort basis,
this fake always, and only once the connection's ``$default`` invocations under way have
returned; it invokes the function in this process, with no timeout (the service's is 29 s) and,
unless told to, no throttling (the service's account and stage throttles, and Lambda's concurrency
limits, are not there), and throttles messages only, not upgrades; WebSocket pings are answered,
as the service does, but do not count as activity.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request
from websockets.protocol import Protocol, Side, State
from websockets.server import ServerProtocol
from websockets.sync.connection import Connection

from runplane.devstack.lambda_shim import LambdaContext

__all__ = ["IDLE_SECONDS", "MAX_FRAME", "MAX_SECONDS", "ApiGatewayWebSocket"]

log = logging.getLogger(__name__)

MAX_FRAME = 32 * 1024
"""The service's most bytes per WebSocket frame (and per @connections message)."""
IDLE_SECONDS = 600.0
MAX_SECONDS = 7200.0
Handler = Callable[[dict[str, Any], Any], Any]


@dataclass(eq=False)
class _Conn:
    id: str
    ws: Connection
    connected_at: float
    source_ip: str
    user_agent: str
    last_active: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: set[Future[None]] = field(default_factory=set)


class ApiGatewayWebSocket:
    """The stage ``stage`` of a WebSocket API whose three routes are ``handler`` (a Lambda handler,
    called in this process with a fake context). ``start`` binds ``host:port`` (0: a free port)."""

    def __init__(
        self,
        handler: Handler,
        stage: str = "v1",
        api_id: str = "local",
        host: str = "127.0.0.1",
        port: int = 0,
        idle_seconds: float = IDLE_SECONDS,
        max_seconds: float = MAX_SECONDS,
        workers: int = 16,
    ) -> None:
        self.handler, self.stage, self.api_id = handler, stage, api_id
        self.idle_seconds, self.max_seconds = idle_seconds, max_seconds
        self._conns: dict[str, _Conn] = {}
        self._lock = threading.Lock()
        self._quiet = threading.Condition(self._lock)  # notified as each connection's $disconnect returns
        self._serving = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="apigw-ws")
        self._server = _Server((host, port), self)
        self._thread: threading.Thread | None = None
        self._rate: float | None = None
        self._burst, self._tokens, self._filled = 0.0, 0.0, time.monotonic()
        self.domain = f"{host}:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        """The stage's WebSocket URL (what a deployed stack's ``RelayUrl`` is)."""
        return f"ws://{self.domain}/{self.stage}"

    @property
    def manage_url(self) -> str:
        """The ``@connections`` endpoint (boto3's ``endpoint_url`` for ``apigatewaymanagementapi``)."""
        return f"http://{self.domain}/{self.stage}"

    def start(self) -> str:
        self._thread = threading.Thread(target=self._server.serve_forever, name="apigw-ws", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Close every connection and stop serving, once each connection's ``$disconnect`` returned
        (10 s at most)."""
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.ws.close(1001, "Going away")
        with self._quiet:  # their $disconnect may still use @connections: served meanwhile
            self._quiet.wait_for(lambda: self._serving == 0, timeout=10)
        self._server.shutdown()
        self._server.server_close()
        self._pool.shutdown(wait=True, cancel_futures=False)

    def throttle(self, rate: float | None, burst: int = 500) -> None:
        """Throttle messages from now on to ``rate`` a second with bursts of ``burst`` (the bucket
        starts full), over all connections, as the stage's route throttle does; None: no throttle."""
        with self._lock:
            self._rate, self._burst, self._tokens, self._filled = rate, float(burst), float(burst), time.monotonic()

    def _take(self) -> bool:
        """Whether a message may go on (a token taken), under the throttle."""
        with self._lock:
            if self._rate is None:
                return True
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._filled) * self._rate)
            self._filled = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True

    def _throttled(self, conn: _Conn) -> None:
        """What the service answers a throttled message's sender (the message goes no further)."""
        answer = {"message": "Too Many Requests", "connectionId": conn.id, "requestId": secrets.token_urlsafe(12)}
        with contextlib.suppress(ConnectionClosed), conn.lock:
            conn.ws.send(json.dumps(answer))

    def connections(self) -> list[str]:
        """The ids of the connections open now."""
        with self._lock:
            return sorted(self._conns)

    # ---- events ----------------------------------------------------------------------------------

    def _context(self, route: str, kind: str, conn_id: str, connected_at: float, ip: str, agent: str) -> dict[str, Any]:
        now = time.time()
        return {
            "routeKey": route,
            "eventType": kind,
            "messageDirection": "IN",
            "extendedRequestId": uuid.uuid4().hex,
            "requestId": uuid.uuid4().hex,
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "requestTimeEpoch": int(now * 1000),
            "stage": self.stage,
            "connectedAt": int(connected_at * 1000),
            "identity": {"sourceIp": ip, "userAgent": agent},
            "domainName": self.domain,
            "connectionId": conn_id,
            "apiId": self.api_id,
        }

    def _invoke(self, event: dict[str, Any]) -> Any:
        return self.handler(event, LambdaContext(function_name="runplane-relay"))

    def _message(self, conn: _Conn, body: str) -> None:
        context = self._context("$default", "MESSAGE", conn.id, conn.connected_at, conn.source_ip, conn.user_agent)
        context["messageId"] = secrets.token_urlsafe(12)
        try:
            self._invoke({"requestContext": context, "body": body, "isBase64Encoded": False})
        except Exception:  # the service answers the client an error message; here it is logged
            log.exception("the relay function failed on a message of %s", conn.id)

    def _disconnect(self, conn: _Conn, code: int, reason: str) -> None:
        context = self._context(
            "$disconnect", "DISCONNECT", conn.id, conn.connected_at, conn.source_ip, conn.user_agent
        )
        context.update(disconnectStatusCode=code, disconnectReason=reason)
        try:
            self._invoke({"requestContext": context, "headers": {}, "isBase64Encoded": False})
        except Exception:
            log.exception("the relay function failed on the $disconnect of %s", conn.id)

    # ---- the WebSocket ---------------------------------------------------------------------------

    def serve_upgrade(self, sock: socket.socket, path: str, headers: Headers, ip: str) -> None:
        """Serve one WebSocket on ``sock`` (its request read): ``$connect``, messages, ``$disconnect``."""
        response = ServerProtocol().accept(Request(path, headers))
        sock.settimeout(30)
        if response.status_code != 101:
            sock.sendall(response.serialize())
            return
        conn_id = base64.b64encode(secrets.token_bytes(10)).decode()
        agent, connected_at = headers.get("User-Agent", ""), time.time()
        query = dict(parse_qsl(urlsplit(path).query))
        context = self._context("$connect", "CONNECT", conn_id, connected_at, ip, agent)
        event = {
            "requestContext": context,
            "headers": dict(headers.raw_items()),
            "multiValueHeaders": {k: headers.get_all(k) for k in headers},
            "isBase64Encoded": False,
            **({"queryStringParameters": query} if query else {}),
        }
        try:
            answer = self._invoke(event) or {}
            status = int(answer.get("statusCode", 200))
        except Exception:
            log.exception("the relay function failed on a $connect")
            answer, status = {"body": '{"message": "Internal server error"}'}, 500
        if not 200 <= status < 300:
            body = str(answer.get("body") or "").encode()
            sock.sendall(
                f"HTTP/1.1 {status} Refused\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            return
        ws = Connection(sock, Protocol(Side.SERVER, state=State.OPEN, max_size=MAX_FRAME), close_timeout=5)
        conn = _Conn(conn_id, ws, connected_at, ip, agent, time.monotonic())
        with conn.lock:  # posted to from here (its $connect answered), each post after the handshake's answer
            with self._lock:
                self._conns[conn_id] = conn
                self._serving += 1
            sock.sendall(response.serialize())
        try:
            self._read(conn)
        finally:
            with self._lock:
                self._conns.pop(conn_id, None)
            for pending in list(conn.pending):  # its messages under way are handed over first
                with contextlib.suppress(Exception):
                    pending.result()
            close = ws.protocol.close_rcvd or ws.protocol.close_sent
            try:
                self._disconnect(conn, close.code if close else 1006, close.reason if close else "")
            finally:
                with self._quiet:
                    self._serving -= 1
                    self._quiet.notify_all()

    def _read(self, conn: _Conn) -> None:
        started = time.monotonic()
        while True:
            now = time.monotonic()
            deadline = min(conn.last_active + self.idle_seconds, started + self.max_seconds)
            try:
                message = conn.ws.recv(timeout=max(0.0, deadline - now))
            except TimeoutError:
                if time.monotonic() >= min(conn.last_active + self.idle_seconds, started + self.max_seconds):
                    conn.ws.close(1001, "Going away")
                continue
            except ConnectionClosed:
                return
            conn.last_active = time.monotonic()
            if isinstance(message, bytes):
                conn.ws.close(1003, "Binary frames are not supported")
                continue
            if not self._take():
                self._throttled(conn)
                continue
            try:
                future = self._pool.submit(self._message, conn, message)
            except RuntimeError:  # stopping: the message goes with the connection
                return
            conn.pending.add(future)
            future.add_done_callback(conn.pending.discard)

    # ---- @connections ----------------------------------------------------------------------------

    def manage(self, method: str, conn_id: str, body: bytes, signed: bool) -> tuple[int, dict[str, Any] | None, str]:
        """One @connections request: (status, JSON body or None, error type or "")."""
        if not signed:
            return 403, {"message": "Missing Authentication Token"}, "ForbiddenException"
        with self._lock:
            conn = self._conns.get(conn_id)
        if conn is None or conn.ws.state is not State.OPEN:
            return 410, {"message": None}, "GoneException"
        if method == "GET":
            active = time.gmtime(time.time() - (time.monotonic() - conn.last_active))
            return (
                200,
                {
                    "connectedAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(conn.connected_at)),
                    "lastActiveAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", active),
                    "identity": {"sourceIp": conn.source_ip, "userAgent": conn.user_agent},
                },
                "",
            )
        if method == "DELETE":
            conn.ws.close(1000, "")
            return 204, None, ""
        if len(body) > MAX_FRAME:
            return 413, {"message": "Message too long"}, "PayloadTooLargeException"
        try:
            message: str | bytes = body.decode()
        except UnicodeDecodeError:
            message = body
        try:
            with conn.lock:
                conn.ws.send(message)
        except ConnectionClosed:
            return 410, {"message": None}, "GoneException"
        conn.last_active = time.monotonic()
        return 200, None, ""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: ApiGatewayWebSocket) -> None:
        super().__init__(address, _Handler)
        self.api = api


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("apigw-ws: " + format, *args)

    def do_GET(self) -> None:
        api = self.server.api
        path = urlsplit(self.path).path
        if (self.headers.get("Upgrade") or "").lower() == "websocket":
            self.close_connection = True
            if path.rstrip("/") != f"/{api.stage}":
                self._reply(403, {"message": "Forbidden"}, "ForbiddenException")
                return
            headers = Headers(list(self.headers.items()))
            api.serve_upgrade(self.connection, self.path, headers, self.client_address[0])
            return
        self._manage("GET")

    def do_POST(self) -> None:
        self._manage("POST")

    def do_DELETE(self) -> None:
        self._manage("DELETE")

    def _manage(self, method: str) -> None:
        api = self.server.api
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        prefix = f"/{api.stage}/@connections/"
        path = urlsplit(self.path).path
        if not path.startswith(prefix):
            self._reply(403, {"message": "Forbidden"}, "ForbiddenException")
            return
        signed = (self.headers.get("Authorization") or "").startswith("AWS4-HMAC-SHA256 ")
        status, answer, error = api.manage(method, unquote(path.removeprefix(prefix)), body, signed)
        self._reply(status, answer, error)

    def _reply(self, status: int, answer: dict[str, Any] | None, error: str) -> None:
        data = json.dumps(answer).encode() if answer is not None else b""
        self.send_response(status)
        if error:
            self.send_header("x-amzn-ErrorType", error)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
