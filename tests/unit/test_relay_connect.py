"""Opening a relay connection: an opening the relay does not answer in time is tried once more
(over TLS 1.3 a request can be left unsent when session tickets come as it is written), and a
relay that never answers still fails after the second try."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import threading
from collections.abc import Iterator

import pytest

from runplane.client import _link_dial
from runplane.domain.sessions import BINARY

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@contextlib.contextmanager
def relay(answer_from: int) -> Iterator[tuple[str, list[socket.socket]]]:
    """A loopback server that reads each opening and answers it (101) from its ``answer_from``-th
    connection on; the earlier ones are held unanswered."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                held.append(conn)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                if len(held) < answer_from:
                    continue
                key = next(
                    line.split(b":", 1)[1].strip()
                    for line in request.split(b"\r\n")
                    if line.lower().startswith(b"sec-websocket-key:")
                )
                accept = base64.b64encode(hashlib.sha1(key + _GUID.encode()).digest())
                conn.sendall(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"ws://127.0.0.1:{server.getsockname()[1]}/v1/relay", held
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_an_opening_left_unanswered_is_tried_again() -> None:
    with relay(answer_from=2) as (url, held):
        conn = _link_dial.connect(url, {"Authorization": "Bearer t"}, BINARY, open_timeout=0.5, env_proxy=False)
        try:
            assert len(held) == 2
        finally:
            conn.close()


def test_a_relay_that_never_answers_fails_after_the_second_try() -> None:
    with relay(answer_from=99) as (url, held), pytest.raises(TimeoutError):
        _link_dial.connect(url, {}, BINARY, open_timeout=0.3, env_proxy=False)
    assert len(held) == _link_dial.OPEN_TRIES == 2
