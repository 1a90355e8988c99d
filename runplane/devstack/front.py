"""The local stack's HTTP front: requests read off the socket (by Content-Length or chunked, within
MAX_REQUEST) and handed to the cloud's API function, its answer written back."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO, cast

from runplane.adapters.local.object_urls import PATH_PREFIX
from runplane.devstack.cloud import Cloud, FrontRequest
from runplane.devstack.relay import RELAY_PATH, RelayHub

log = logging.getLogger(__name__)
MAX_REQUEST = 10 * 1024 * 1024


class FrontServer(ThreadingHTTPServer):
    """The local stack's front door on ``address``: each request, whatever its method, goes to
    ``cloud.http`` in a thread of its own, as API Gateway or the Functions host hands it over;
    but for ``relay``'s WebSocket (RELAY_PATH), once the stack has one, held in that thread."""

    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 drops connects of a burst of clients: each waits 1 s to retry

    def __init__(self, address: tuple[str, int], cloud: Cloud) -> None:
        super().__init__(address, _Front)
        self.cloud = cloud
        self.relay: RelayHub | None = None


class _BadBody(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class _Front(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120  # a client that stops sending mid-request does not hold a thread for ever
    disable_nagle_algorithm = True  # headers and body go out at once, not after a delayed ACK
    server_version = "runplane-dev"
    server: FrontServer

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        relay = self.server.relay
        if path == RELAY_PATH and relay is not None:
            # the connection is the relay's from here (socketserver shuts it down at the end)
            self.close_connection = True
            relay.serve(self.connection, self.path, dict(self.headers.items()))
            return
        if self.command == "PUT" and path.startswith(PATH_PREFIX):
            # an object's bytes, read from the socket as they are stored (as large as the URL's
            # signed size); what is left unread of a refused one ends the connection
            self.close_connection = True
            self._forward(path, query, b"", cast(BinaryIO, self.rfile))
            return
        try:
            body = self._body()
        except _BadBody as e:
            self.close_connection = True  # what follows on the connection cannot be trusted
            message = json.dumps({"error": {"code": e.code, "message": e.message}}).encode()
            self._reply(e.status, {"content-type": "application/json"}, message)
            return
        self._forward(path, query, body, None)

    def _forward(self, path: str, query: str, body: bytes, stream: BinaryIO | None) -> None:
        request = FrontRequest(
            method=self.command,
            path=path,
            query=query,
            headers=dict(self.headers.items()),
            body=body,
            client_ip=self.client_address[0],
            host=self.headers.get("Host") or f"127.0.0.1:{self.server.server_address[1]}",
            stream=stream,
        )
        response = self.server.cloud.http(request)
        self._reply(response.status, response.headers, response.body, response.file)

    def _body(self) -> bytes:
        """The request body, by Content-Length or chunked (as API Gateway takes both). Raises
        _BadBody for a body too large or framed wrongly."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked()
        raw = (self.headers.get("Content-Length") or "0").strip()
        if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
            raise _BadBody(400, "bad_request", "Content-Length is not a number of bytes")
        if int(raw) > MAX_REQUEST:
            raise _BadBody(413, "payload_too_large", "request body too large")
        return self.rfile.read(int(raw)) if int(raw) else b""

    def _chunked(self) -> bytes:
        body = bytearray()
        while True:
            line = self.rfile.readline(1024).strip().split(b";")[0].strip()
            if not _CHUNK_SIZE.fullmatch(line):
                raise _BadBody(400, "bad_request", "chunked body is malformed")
            size = int(line, 16)
            if len(body) + size > MAX_REQUEST:
                raise _BadBody(413, "payload_too_large", "request body too large")
            if size == 0:
                for _ in range(100):  # trailers, up to the blank line
                    if not self.rfile.readline(1024).strip():
                        return bytes(body)
                raise _BadBody(400, "bad_request", "chunked body has too many trailers")
            body += self.rfile.read(size)
            if self.rfile.read(2) != b"\r\n":
                raise _BadBody(400, "bad_request", "chunked body is malformed")

    def _reply(self, status: int, headers: dict[str, str], body: bytes, file: BinaryIO | None = None) -> None:
        """Write the answer; its body is ``file`` (from where it is to its end, sent from the file
        in chunks, never read whole; closed here) when there is one, else ``body``."""
        with file or contextlib.nullcontext():
            length = len(body) if file is None else os.fstat(file.fileno()).st_size - file.tell()
            self.send_response(status)
            for key, value in headers.items():
                if key.lower() not in ("content-length", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(length))
            self.end_headers()  # buffered; the flush below sends headers and body together
            if self.command == "HEAD":
                return
            if file is None:
                self.wfile.write(body)
            elif length:
                self.connection.sendfile(file, file.tell(), length)

    def __getattr__(self, name: str) -> Any:
        # every method goes to the API, which answers 405 (with Allow) for one no route serves
        if name.startswith("do_"):
            return self._handle
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)
