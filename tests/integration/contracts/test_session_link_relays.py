"""The sides' one Link (runplane.client._link) over every relay of the contract (relay_stacks.py):
the client says HELLO before its worker is there (a gateway drops it), and still the two meet and
more than a window of bytes crosses each way, in order, in the relay's own encoding and frame size."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runplane.client._link import Link
from runplane.domain.session_wire import STDIN, STDOUT, WINDOW, Frame, FrameType, json_frame
from tests.integration.contracts.relay_stacks import FIXTURES, STACKS, RelayStack


@pytest.fixture(params=sorted(STACKS))
def relay(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RelayStack]:
    fixtures = {name: request.getfixturevalue(name) for name in FIXTURES.get(request.param, ())}
    with STACKS[request.param](tmp_path, **fixtures) as stack:
        yield stack


def _take(link: Link, size: int, channel: int, into: dict[int, bytes]) -> None:
    got = bytearray()
    while len(got) < size:
        frame = link.recv(20)
        assert frame is not None, f"{len(got)} of {size} bytes came"
        assert frame.type == FrameType.DATA and frame.channel == channel, frame
        got += frame.payload
    into[channel] = bytes(got)


def test_links_meet_late_and_carry_more_than_a_window_each_way_in_order(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    up, down = os.urandom(WINDOW + WINDOW // 2), os.urandom(WINDOW + WINDOW // 2)
    client_side = relay.dial(session, client_ticket)
    client = Link(client_side.ws, relay.max_frame, encoding=relay.encoding)
    worker: Link | None = None
    try:
        client.send(json_frame(FrameType.HELLO, {"side": "client"}))
        worker = Link(relay.dial(session, worker_ticket).ws, relay.max_frame, encoding=relay.encoding)
        worker.send(json_frame(FrameType.HELLO, {"side": "worker"}))
        for link, peer in ((client, "worker"), (worker, "client")):
            hello = link.recv(20)
            assert hello is not None and hello.type == FrameType.HELLO and hello.json()["side"] == peer
        got: dict[int, bytes] = {}
        reader = threading.Thread(target=_take, args=(worker, len(up), STDIN, got), daemon=True)
        reader.start()
        sender = threading.Thread(target=worker.send, args=(Frame(FrameType.DATA, STDOUT, 0, down),), daemon=True)
        sender.start()
        client.send(Frame(FrameType.DATA, STDIN, 0, up))
        _take(client, len(down), STDOUT, got)
        reader.join(30)
        sender.join(30)
        assert got == {STDIN: up, STDOUT: down}
    finally:
        client.close()
        if worker is not None:
            worker.close()
