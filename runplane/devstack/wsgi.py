"""The production front of ``runplane serve``: cheroot serving a WSGI app around ``Cloud.http``."""

from __future__ import annotations

import contextlib
import http
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import quote

from cheroot import wsgi
from cheroot.errors import FatalSSLAlert, MaxSizeExceeded
from cheroot.makefile import StreamReader, StreamWriter
from cheroot.server import ChunkedRFile, HTTPConnection, HTTPRequest, KnownLengthRFile
from cheroot.ssl.builtin import BuiltinSSLAdapter

from runplane.adapters.local.object_urls import PATH_PREFIX
from runplane.devstack.cloud import Cloud, FrontRequest, FrontResponse
from runplane.devstack.front import MAX_REQUEST
from runplane.devstack.relay import RELAY_PATH, RelayHub
from runplane.domain.uploads import PUT_URL_SECONDS
from runplane.services.watch import MAX_WAITING

__all__ = ["THREADS", "ProductionFront"]

log = logging.getLogger(__name__)
THREADS = 2 * MAX_WAITING
"""Requests served at once: each long poll (a client waiting on a run) holds one for its wait, and
at most MAX_WAITING wait at once, so half the threads always serve other requests."""
SOCKET_TIMEOUT = 120
"""Seconds a connection may stay silent while its answer is written, or between two requests."""
HEAD_SECONDS = 10
"""Seconds a client has to send a request's line and headers (and, on HTTPS, to shake hands first)
from when a thread takes it up: a client trickling its headers holds a thread no longer."""
BODY_SECONDS = 60
"""Seconds a client has to send a request's body (at most MAX_REQUEST) after its headers."""
PUT_BODY_SECONDS = PUT_URL_SECONDS
"""Seconds a client has to send the body of an object's PUT (as large as the size its URL was
signed for: an upload, of up to the stack's ``max_upload_bytes``)."""
MAX_HEADERS = 64 * 1024
"""Bytes of a request's line and headers; past it, 414 (the line) or 413 (the headers)."""
CHUNK = 256 * 1024
_HOP_BY_HOP = {"connection", "content-length", "keep-alive", "transfer-encoding"}

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class ProductionFront:
    """The stack's front on ``address`` for production, as the dev front (``front.FrontServer``)
    is for development: every request, whatever its method, goes to ``cloud.http``; a body over
    MAX_REQUEST is refused with 413 (by Content-Length or chunked), but for the PUT of a signed
    object URL (``object_urls``), whose body, of the size the URL was signed for, is handed on to
    be stored as it is read (within PUT_BODY_SECONDS).

    Why cheroot: it is a threaded HTTP/1.1 server in pure Python with TLS built in (no compiler,
    no proxy needed in front), production-proven (CherryPy's server), and it serves every request
    in a thread of the one process. A pre-forking server such as gunicorn would run the stack in
    several worker processes, while the stack keeps its dispatcher and schedule threads, and its
    stores' wake-ups, in one process; the pool of threads is sized for long polls (THREADS).
    The relay's WebSocket (RELAY_PATH), once the stack has one (``relay``), is answered by it and
    its connection handed to a thread of its own: a session holds none of the THREADS.
    ``tls_cert``/``tls_key``: PEM files for HTTPS (cheroot's builtin ``ssl`` adapter, shaking hands
    in the thread that serves the connection, never in the one that accepts them).

    A client gets HEAD_SECONDS to send a request's head and BODY_SECONDS its body, MAX_HEADERS
    bytes of head and MAX_REQUEST of body; a Content-Length that is not a number is refused (400)
    before any body is read.
    """

    def __init__(
        self, address: tuple[str, int], cloud: Cloud, tls_cert: Path | None = None, tls_key: Path | None = None
    ) -> None:
        self.cloud = cloud
        self._server = _Server(
            address, self._app, numthreads=THREADS, timeout=SOCKET_TIMEOUT, server_name="runplane", shutdown_timeout=2
        )
        self._server.max_request_body_size = 0  # _Request holds each body to its own limit
        self._server.max_request_header_size = MAX_HEADERS
        self._server.ConnectionClass = _Connection
        if tls_cert is not None and tls_key is not None:
            self._server.ssl_adapter = _TLS(str(tls_cert), str(tls_key))
        self._server.prepare()  # binds now: a busy port fails here, before anything else starts

    @property
    def relay(self) -> RelayHub | None:
        return self._server.relay

    @relay.setter
    def relay(self, hub: RelayHub | None) -> None:
        self._server.relay = hub

    @property
    def server_address(self) -> tuple[str, int]:
        host, port = self._server.bind_addr[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        self._server.serve()

    def shutdown(self) -> None:
        self._server.stop()

    def server_close(self) -> None:
        self._server.stop()

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        raw = environ.get("REQUEST_URI") or quote(environ.get("PATH_INFO", "/"), safe="/%")
        path, _, query = str(raw).partition("?")
        headers = {
            key[5:].replace("_", "-").title(): str(value) for key, value in environ.items() if key.startswith("HTTP_")
        }
        for key, name in (("CONTENT_TYPE", "Content-Type"), ("CONTENT_LENGTH", "Content-Length")):
            if environ.get(key):
                headers[name] = str(environ[key])
        stream: BinaryIO | None = None
        try:
            if _streamed(environ["REQUEST_METHOD"], path):  # read as it is stored, to its Content-Length
                stream, body = cast(BinaryIO, _Arrived(environ["wsgi.input"])), b""
            else:
                # the length is checked (_Request) before the body is read; a chunked body stops at the limit
                body = environ["wsgi.input"].read(MAX_REQUEST + 1)
            if len(body) > MAX_REQUEST:
                return _error(start_response, 413, "payload_too_large", "request body too large")
        except (MaxSizeExceeded, OSError) as e:
            # cheroot answers a Content-Length past MAX_REQUEST itself; a chunked body past it
            # raises here (an OSError saying so), as does a body cut short
            if isinstance(e, MaxSizeExceeded) or "too large" in str(e).lower():
                return _error(start_response, 413, "payload_too_large", "request body too large")
            return _error(start_response, 400, "bad_request", "the request body could not be read")
        port = self.server_address[1]
        request = FrontRequest(
            method=environ["REQUEST_METHOD"],
            path=path,
            query=query,
            headers=headers,
            body=body,
            client_ip=str(environ.get("REMOTE_ADDR") or ""),
            host=headers.get("Host") or f"127.0.0.1:{port}",
            stream=stream,
        )
        return _answer(start_response, self.cloud.http(request), head=request.method == "HEAD")


def _error(start_response: StartResponse, status: int, code: str, message: str) -> Iterable[bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return _answer(start_response, FrontResponse(status, {"content-type": "application/json"}, body))


def _answer(start_response: StartResponse, response: FrontResponse, head: bool = False) -> Iterable[bytes]:
    """Start the answer; its body (none for a HEAD, whose Content-Length is the GET's: cheroot
    would send what it is given)."""
    try:
        reason = http.HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    file = response.file
    length = len(response.body) if file is None else os.fstat(file.fileno()).st_size - file.tell()
    headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP]
    headers.append(("Content-Length", str(length)))
    try:
        start_response(f"{response.status} {reason}", headers)
    except BaseException:
        if file is not None:
            file.close()
        raise
    if head:
        if file is not None:
            file.close()
        return iter([])
    if file is None:
        return iter([response.body])
    return _Chunks(file, length)


class _Chunks:
    """``length`` bytes of ``file`` in chunks (never read whole); ``close`` (which the server calls
    however far it read: a HEAD, a client gone) closes the file."""

    def __init__(self, file: BinaryIO, length: int) -> None:
        self.file, self.left = file, length

    def __iter__(self) -> Iterator[bytes]:
        while self.left > 0:
            chunk = self.file.read(min(CHUNK, self.left))
            if not chunk:
                return
            self.left -= len(chunk)
            yield chunk

    def close(self) -> None:
        self.file.close()


class _Arrived:
    """The body of an object's PUT (cheroot's KnownLengthRFile), read as it arrives (``read1``)
    up to its Content-Length, so that the store can tell a body that trickles between reads."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def read1(self, size: int) -> bytes:
        remaining, read1 = (
            getattr(self.body, "remaining", None),
            getattr(getattr(self.body, "rfile", None), "read1", None),
        )
        if not isinstance(self.body, KnownLengthRFile) or not callable(read1):  # cheroot's buffered reader has it
            return bytes(self.body.read(size))
        if not isinstance(remaining, int) or remaining <= 0:
            return b""
        data = bytes(read1(min(size, remaining)))
        self.body.remaining = remaining - len(data)
        return data

    def read(self, size: int = -1) -> bytes:
        return bytes(self.body.read(None if size < 0 else size))


class _TimedIO(socket.SocketIO):
    """A connection's socket as a raw stream: each read waits at most what is left until
    ``deadline`` (None: SOCKET_TIMEOUT), each write at most SOCKET_TIMEOUT. On a TLS socket the
    first read shakes hands, under the same deadline."""

    def __init__(self, sock: socket.socket, mode: str) -> None:
        super().__init__(sock, mode)  # type: ignore[arg-type]
        self.sock = sock
        self.deadline: float | None = None
        self._shaken = not isinstance(sock, ssl.SSLSocket)

    def readinto(self, b: Any) -> int | None:
        timeout: float = SOCKET_TIMEOUT
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                raise TimeoutError("timed out")
        self.sock.settimeout(timeout)
        if not self._shaken:
            _handshake(self.sock)
            self._shaken = True
        return super().readinto(b)

    def write(self, b: Any) -> int | None:
        self.sock.settimeout(SOCKET_TIMEOUT)
        return super().write(b)


_PLAIN_HTTP = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 44\r\nConnection: close\r\n\r\n"
    b"This server only speaks HTTPS on this port.\n"
)


def _handshake(sock: socket.socket) -> None:
    """Shake hands on ``sock`` (an SSLSocket), within its timeout. A failure drops the connection
    quietly (cheroot's FatalSSLAlert), a client speaking plain HTTP is told in plain HTTP first."""
    assert isinstance(sock, ssl.SSLSocket)
    try:
        sock.do_handshake()
    except ssl.SSLError as e:
        if "http request" in str(e).lower():
            bare_send = socket.socket.sendall  # on the bare socket under the TLS one
            with contextlib.suppress(OSError):
                bare_send(sock, _PLAIN_HTTP)
        raise FatalSSLAlert(str(e)) from e
    except OSError as e:  # a timeout, the client gone
        raise FatalSSLAlert(str(e)) from e


class _Reader(StreamReader):
    def __init__(self, sock: socket.socket, mode: str = "rb", bufsize: int = 8192) -> None:
        super(StreamReader, self).__init__(_TimedIO(sock, mode), bufsize)
        self.bytes_read = 0


class _Writer(StreamWriter):
    def __init__(self, sock: socket.socket, mode: str = "wb", bufsize: int = 8192) -> None:
        super(StreamWriter, self).__init__(_TimedIO(sock, mode), bufsize)
        self.bytes_written = 0


def _timed_file(sock: socket.socket, mode: str = "r", bufsize: int = 8192) -> _Reader | _Writer:
    return _Reader(sock, mode, bufsize) if "r" in mode else _Writer(sock, mode, bufsize)


class _Request(HTTPRequest):
    """cheroot's request, its head read within HEAD_SECONDS and its body within BODY_SECONDS, and
    a Content-Length that is not digits refused before the body is read (``int`` would take
    ``-1``, which reads to the end of the connection)."""

    def parse_request(self) -> None:
        raw: _TimedIO = self.conn.rfile.raw
        raw.deadline = time.monotonic() + HEAD_SECONDS
        super().parse_request()
        raw.deadline = time.monotonic() + (PUT_BODY_SECONDS if self._streamed() else BODY_SECONDS)

    def _streamed(self) -> bool:
        method, path = getattr(self, "method", None), getattr(self, "path", None)
        if not isinstance(method, bytes) or not isinstance(path, bytes):
            return False
        return _streamed(method.decode("latin-1"), path.decode("latin-1"))

    def read_request_headers(self) -> bool:
        if not super().read_request_headers():  # type: ignore[no-untyped-call]
            return False
        length = self.inheaders.get(b"Content-Length")
        if length is not None and not (length.isdigit() and len(length) <= 12):
            self.simple_response("400 Bad Request", "Content-Length is not a number of bytes")
            return False
        if length is not None and int(length) > MAX_REQUEST and not self._streamed():
            self.simple_response("413 Request Entity Too Large", "request body too large")
            return False
        return True

    def respond(self) -> None:
        """cheroot's, reading a chunked body to MAX_REQUEST at most (an object's PUT gives its length);
        the connection of an object's PUT ends with it (a refused one leaves its body unread); the
        relay's WebSocket goes to the relay."""
        if self._relayed():
            return
        if self._streamed():
            self.close_connection = True
        if self.chunked_read:
            self.rfile = ChunkedRFile(self.conn.rfile, 0 if self._streamed() else MAX_REQUEST)
        else:
            self.rfile = KnownLengthRFile(self.conn.rfile, int(self.inheaders.get(b"Content-Length", 0)))
        self.server.gateway(self).respond()
        if self.ready:
            self.ensure_headers_sent()
        if self.chunked_write:
            self.conn.wfile.write(b"0\r\n\r\n")

    def _relayed(self) -> bool:
        """Hand the connection to the relay when the request is for it: cheroot neither reads nor
        writes nor closes it any more (``linger``: its close leaves the socket alone)."""
        relay = self.server.relay if isinstance(self.server, _Server) else None
        path = bytes(getattr(self, "path", b"") or b"").decode("latin-1")
        if relay is None or path != RELAY_PATH:
            return False
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.inheaders.items()}
        self.close_connection = True
        self.sent_headers = True  # nothing of cheroot's may follow on this connection
        self.ready = False
        self.conn.linger = True
        sock = self.conn.socket
        thread = threading.Thread(target=relay.serve, args=(sock, path, headers), name="relay-side", daemon=True)
        thread.start()
        return True


def _streamed(method: str, path: str) -> bool:
    """Whether a request's body is handed on unread: the PUT of an object URL."""
    return method == "PUT" and path.startswith(PATH_PREFIX)


class _Server(wsgi.Server):
    """cheroot's WSGI server, holding the relay its requests hand connections to."""

    relay: RelayHub | None = None


class _Connection(HTTPConnection):
    """cheroot's connection on _TimedIO streams (whatever stream the server offers: both are
    cheroot's StreamReader/StreamWriter on the socket), serving _Request."""

    RequestHandlerClass = _Request

    def __init__(self, server: Any, sock: socket.socket, makefile: Any = None) -> None:
        super().__init__(server, sock, _timed_file)


class _TLS(BuiltinSSLAdapter):
    """cheroot's builtin TLS adapter, wrapping a connection without shaking hands: cheroot wraps
    in the thread that accepts every connection, where one client that never speaks would hold
    every other up (for SOCKET_TIMEOUT); _TimedIO shakes hands on the connection's first read.

    It sends no TLS 1.3 session tickets. A ticket arrives just after the handshake, as a threaded
    client (websockets' sync client: a thread reading from its start, another writing the request)
    reads it on one thread while it writes its first request on the other: OpenSSL's connection
    is not safe to use from two threads at once, and the request was now and then lost on its
    way out (the client's TLS layer said sent, nothing left the socket), so a relay handshake
    waited unanswered. Nothing here resumes a session, so nothing is lost without them."""

    def __init__(self, certificate: str, private_key: str) -> None:
        super().__init__(certificate, private_key)
        self.context.num_tickets = 0

    def wrap(self, sock: socket.socket) -> tuple[ssl.SSLSocket, dict[str, str]]:
        try:
            wrapped = self.context.wrap_socket(sock, do_handshake_on_connect=False, server_side=True)
        except OSError as e:
            raise FatalSSLAlert(str(e)) from e
        return wrapped, {"wsgi.url_scheme": "https", "HTTPS": "on"}
