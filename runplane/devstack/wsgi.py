"""The production front of ``runplane serve``: cheroot serving a WSGI app around ``Cloud.http``."""

from __future__ import annotations

import http
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from cheroot import wsgi
from cheroot.errors import MaxSizeExceeded
from cheroot.ssl.builtin import BuiltinSSLAdapter

from runplane.devstack.cloud import Cloud, FrontRequest, FrontResponse
from runplane.devstack.front import MAX_REQUEST

__all__ = ["THREADS", "ProductionFront"]

log = logging.getLogger(__name__)
THREADS = 64
"""Requests served at once: each long poll (a client waiting on a run) holds one for its wait."""
SOCKET_TIMEOUT = 120
"""Seconds a connection may stay silent mid-request before it is dropped."""
CHUNK = 256 * 1024
_HOP_BY_HOP = {"connection", "content-length", "keep-alive", "transfer-encoding"}

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class ProductionFront:
    """The stack's front on ``address`` for production, as the dev front (``front.FrontServer``)
    is for development: every request, whatever its method, goes to ``cloud.http``; a body over
    MAX_REQUEST is refused with 413 (by Content-Length or chunked).

    Why cheroot: it is a threaded HTTP/1.1 server in pure Python with TLS built in (no compiler,
    no proxy needed in front), production-proven (CherryPy's server), and it serves every request
    in a thread of the one process. A pre-forking server such as gunicorn would run the stack in
    several worker processes, while the stack keeps its dispatcher and schedule threads, and its
    stores' wake-ups, in one process; the pool of threads is sized for long polls (THREADS).
    ``tls_cert``/``tls_key``: PEM files for HTTPS (cheroot's builtin ``ssl`` adapter).
    """

    def __init__(
        self, address: tuple[str, int], cloud: Cloud, tls_cert: Path | None = None, tls_key: Path | None = None
    ) -> None:
        self.cloud = cloud
        self._server = wsgi.Server(
            address, self._app, numthreads=THREADS, timeout=SOCKET_TIMEOUT, server_name="runplane", shutdown_timeout=2
        )
        self._server.max_request_body_size = MAX_REQUEST
        if tls_cert is not None and tls_key is not None:
            self._server.ssl_adapter = BuiltinSSLAdapter(str(tls_cert), str(tls_key))
        self._server.prepare()  # binds now: a busy port fails here, before anything else starts

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
        try:
            body = environ["wsgi.input"].read()
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
