"""The one Link of a session's two sides over a relay played here as a gateway is: it carries text
messages only (base64 frames of at most 16 KiB), hands a connection's messages on in any order,
drops what is sent to a side not yet connected, and takes everything at once (no backpressure)."""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from websockets.exceptions import ConnectionClosed, ConnectionClosedError

from runplane.client import _link, _link_dial
from runplane.client._link import Link
from runplane.client._link_order import Refused, SessionLost
from runplane.client.sessions import Access
from runplane.domain.session_wire import (
    HEADER,
    SEQ_SPAN,
    STDIN,
    STDOUT,
    WINDOW,
    Frame,
    FrameType,
    Sequencer,
    decode,
    frame_bytes,
    json_frame,
    message,
    ping,
)
from runplane.domain.sessions import BASE64, BINARY
from worker_agent.sessions.link import Link as WorkerLink

GATEWAY_FRAME = 16 * 1024
_CLOSED = object()
Tamper = Callable[[str, Frame], int]
"""How many times the relay hands on a frame of ``side``: 0 (lost), 1, 2 (a copy)."""
Late = Callable[[str, Frame], float]
"""How many seconds the relay holds a frame of ``side`` back before it hands it on."""


class Relay:
    """Two sides, ``client`` and ``worker``. Each message is taken at once and handed on by a
    thread of the relay's own, every few milliseconds in a shuffled order."""

    def __init__(
        self, encoding: str = BASE64, tamper: Tamper | None = None, seed: int = 7, late: Late | None = None
    ) -> None:
        self.encoding = encoding
        self.tamper = tamper or (lambda side, frame: 1)
        self.late = late or (lambda side, frame: 0.0)
        self.later: list[tuple[float, str, bytes | str]] = []  # (when, to side, message): held back
        self.inbox: dict[str, queue.Queue[object]] = {}
        self.pending: dict[str, list[object]] = {"client": [], "worker": []}
        self.dropped = self.reordered = 0
        self.wrong: list[str] = []  # what no gateway would have carried
        self.log: list[tuple[str, Frame]] = []  # (from side, frame), as sent
        self.in_flight = {"client": 0, "worker": 0}  # bytes on their way to each side
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._pump = threading.Thread(target=self._hand_on, daemon=True)
        self._pump.start()

    def connect(self, side: str) -> End:
        with self._lock:
            self.inbox[side] = queue.Queue()
        return End(self, side)

    def carry(self, side: str, data: bytes | str) -> None:
        peer = "worker" if side == "client" else "client"
        if self.encoding == BASE64 and not isinstance(data, str):
            self.wrong.append("a binary message")
            return
        if isinstance(data, str) and len(data) > 32 * 1024:
            self.wrong.append(f"a text message of {len(data)} characters")
        frame = decode(frame_bytes(data, self.encoding))
        if frame.type == FrameType.DATA and len(frame.payload) > GATEWAY_FRAME:
            self.wrong.append(f"a DATA frame of {len(frame.payload)} bytes")
        with self._lock:
            self.log.append((side, frame))
            if peer not in self.inbox:
                self.dropped += 1
                return
            delay = self.late(side, frame)
            for _ in range(self.tamper(side, frame)):
                self.in_flight[peer] += len(data)
                if delay:
                    self.later.append((time.monotonic() + delay, peer, data))
                else:
                    self.pending[peer].append(data)

    def _hand_on(self) -> None:
        while not self._stop.wait(0.003):
            with self._lock:
                now = time.monotonic()
                for when, side, data in [each for each in self.later if each[0] <= now]:
                    self.later.remove((when, side, data))
                    self.pending[side].append(data)
                for side, batch in self.pending.items():
                    if not batch:
                        continue
                    shuffled = list(batch)
                    self._random.shuffle(shuffled)
                    self.reordered += sum(1 for a, b in zip(batch, shuffled, strict=True) if a is not b)
                    for data in shuffled:
                        self.inbox[side].put(data)
                    batch.clear()

    def taken(self, side: str, data: object) -> None:
        if isinstance(data, str | bytes):
            with self._lock:
                self.in_flight[side] -= len(data)

    def hang_up(self, side: str) -> None:
        with self._lock:
            for each in list(self.inbox.values()):
                each.put(_CLOSED)

    def stop(self) -> None:
        self._stop.set()
        self._pump.join(5)


class End:
    """A side's connection to the relay, as websockets' sync connection is used by the Link."""

    def __init__(self, relay: Relay, side: str) -> None:
        self.relay, self.side = relay, side
        self.over = False

    def send(self, data: bytes | str) -> None:
        if self.over:
            raise ConnectionClosedError(None, None)
        self.relay.carry(self.side, data)

    def recv(self, timeout: float | None = None) -> object:
        if self.over:
            raise ConnectionClosedError(None, None)
        try:
            data = self.relay.inbox[self.side].get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        if data is _CLOSED:
            self.over = True
            raise ConnectionClosedError(None, None)
        self.relay.taken(self.side, data)
        return data

    def close(self) -> None:
        if not self.over:
            self.over = True
            self.relay.hang_up(self.side)


@contextmanager
def relay(**kwargs: object) -> Iterator[Relay]:
    played = Relay(**kwargs)  # type: ignore[arg-type]
    try:
        yield played
    finally:
        played.stop()


def meet(client: Link, worker: Link) -> None:
    """Both sides say HELLO and each takes the other's (the only HELLO it is handed)."""
    client.send(json_frame(FrameType.HELLO, {"side": "client"}))
    worker.send(json_frame(FrameType.HELLO, {"side": "worker"}))
    for link, peer in ((client, "worker"), (worker, "client")):
        hello = link.recv(10)
        assert hello is not None and hello.type == FrameType.HELLO and hello.json()["side"] == peer


def drain(link: Link, size: int, channel: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        frame = link.recv(10)
        assert frame is not None, f"{len(got)} of {size} bytes came"
        assert frame.type == FrameType.DATA and frame.channel == channel, frame
        got += frame.payload
    return bytes(got)


def sender(link: Link, channel: int, data: bytes, piece: int = 40_000) -> threading.Thread:
    def send() -> None:
        for i in range(0, len(data), piece):
            link.send(Frame(FrameType.DATA, channel, 0, data[i : i + piece]))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_8_mib_each_way_arrive_in_order_through_a_gateway_that_reorders_drops_early_and_never_pushes_back() -> None:
    up, down = os.urandom(8 << 20), os.urandom(8 << 20)
    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        client.send(json_frame(FrameType.HELLO, {"side": "client"}))  # no worker yet: the relay drops it
        deadline = time.monotonic() + 10
        while not played.dropped:
            assert time.monotonic() < deadline, played.wrong
            time.sleep(0.01)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            worker.send(json_frame(FrameType.HELLO, {"side": "worker"}))
            for link, peer in ((client, "worker"), (worker, "client")):
                hello = link.recv(10)
                assert hello is not None and hello.type == FrameType.HELLO and hello.json()["side"] == peer
            threads = [sender(client, STDIN, up), sender(worker, STDOUT, down)]
            got: dict[str, bytes] = {}
            reader = threading.Thread(target=lambda: got.setdefault("up", drain(worker, len(up), STDIN)))
            reader.start()
            got["down"] = drain(client, len(down), STDOUT)
            reader.join(60)
            for thread in threads:
                thread.join(10)
            assert got == {"up": up, "down": down}
        finally:
            client.close()
            worker.close()
    assert played.wrong == []
    assert played.reordered > 0  # the order was the Link's doing, not the relay's
    sent = [f for side, f in played.log if side == "client" and f.type == FrameType.DATA]
    assert max(len(f.payload) for f in sent) == GATEWAY_FRAME  # cut to the relay's frame size
    assert sum(1 for _, f in played.log if f.type == FrameType.ACK) > 0


def test_a_reader_that_takes_nothing_holds_its_sender_back_within_the_window() -> None:
    data = os.urandom(8 << 20)
    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            meet(client, worker)
            thread = sender(worker, STDOUT, data)
            last, still_since = -1, time.monotonic()
            while time.monotonic() - still_since < 0.5:  # until the sender stopped getting on
                if worker.bytes_out != last:
                    last, still_since = worker.bytes_out, time.monotonic()
                time.sleep(0.05)
            assert thread.is_alive()
            assert 0 < worker.bytes_out <= WINDOW + 2 * GATEWAY_FRAME
            assert played.in_flight["client"] == 0  # the client's link took it all off the relay
            assert drain(client, len(data), STDOUT) == data  # and once read, the rest comes
            thread.join(10)
            assert not thread.is_alive()
        finally:
            client.close()
            worker.close()


def test_closing_a_link_frees_a_sender_held_back_by_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_link, "LINGER_SECONDS", 0.2)  # the client never acks: hang up soon
    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        ended: list[SessionLost] = []

        def send() -> None:
            try:
                worker.send(Frame(FrameType.DATA, STDOUT, 0, os.urandom(4 * WINDOW)))
            except SessionLost as e:
                ended.append(e)

        try:
            meet(client, worker)
            thread = threading.Thread(target=send, daemon=True)
            thread.start()
            thread.join(0.5)
            assert thread.is_alive()  # held back: the client takes nothing
            worker.close()
            thread.join(10)
            assert not thread.is_alive() and len(ended) == 1 and ended[0].reason == "relay_lost"
            assert worker.bytes_out <= WINDOW + 2 * GATEWAY_FRAME
        finally:
            client.close()
            worker.close()


def test_a_side_that_hangs_up_first_lets_its_last_frames_be_taken() -> None:
    """The relay passes a hang-up on at once, ahead of messages it has not handed on yet."""
    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            meet(client, worker)
            for i in range(100):
                worker.send(Frame(FrameType.DATA, STDOUT, 0, b"%d," % i))
            worker.send(json_frame(FrameType.EXIT, {"code": 0}))
            closing = threading.Thread(target=worker.close, daemon=True)
            closing.start()
            got = b""
            while (frame := client.recv(10)) is not None and frame.type == FrameType.DATA:
                got += frame.payload
            assert frame is not None and frame.type == FrameType.EXIT
            assert got == b"".join(b"%d," % i for i in range(100))
            closing.join(10)
            assert not closing.is_alive()
        finally:
            client.close()
            worker.close()


def test_lost_and_copied_hellos_and_copied_frames_still_meet_once_and_deliver_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_link, "HELLO_SECONDS", 0.05)
    hellos = {"client": 0, "worker": 0}

    def tamper(side: str, frame: Frame) -> int:
        if frame.type == FrameType.HELLO:
            hellos[side] += 1
            return 0 if hellos[side] <= 2 else 2  # each side's first two lost, the others twice
        return 2  # every other frame comes twice

    with relay(tamper=tamper) as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            meet(client, worker)
            for i in range(50):
                client.send(Frame(FrameType.DATA, STDIN, 0, b"%d," % i))
            client.send(Frame(FrameType.EOF, STDIN))
            got = b""
            while (frame := worker.recv(10)) is not None and frame.type == FrameType.DATA:
                got += frame.payload
            assert frame is not None and frame.type == FrameType.EOF
            assert got == b"".join(b"%d," % i for i in range(50))
            assert worker.recv(0.3) is None  # no second HELLO, no copy
        finally:
            client.close()
            worker.close()
    assert min(hellos.values()) >= 3


def test_a_frame_the_relay_lost_ends_the_link_as_relay_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_link, "GAP_SECONDS", 0.3)
    monkeypatch.setattr(_link, "LINGER_SECONDS", 0.2)  # what was lost is never acked

    def tamper(side: str, frame: Frame) -> int:
        return 0 if frame.type == FrameType.DATA and frame.payload == b"lost" else 1

    with relay(tamper=tamper) as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            meet(client, worker)
            for payload in (b"first", b"lost", b"after"):
                client.send(Frame(FrameType.DATA, STDIN, 0, payload))
            first = worker.recv(10)
            assert first is not None and first.payload == b"first"
            with pytest.raises(SessionLost) as lost:
                worker.recv(10)  # "after" is never handed on
            assert lost.value.reason == "relay_lost" and "lost" in str(lost.value)
        finally:
            client.close()
            worker.close()


@pytest.mark.parametrize(("encoding", "wrong"), [(BINARY, "text"), (BASE64, b"\x02\x00\x01\x00\x00\x00\x01x")])
def test_a_message_of_the_other_kind_ends_the_link(encoding: str, wrong: object) -> None:
    with relay(encoding=BINARY) as played:
        link = Link(played.connect("client"), encoding=encoding)
        try:
            played.inbox["client"].put(wrong)
            with pytest.raises(SessionLost) as lost:
                link.recv(10)
            assert lost.value.reason == "relay_lost" and "no frame" in str(lost.value)
        finally:
            link.close()


def test_an_older_peer_is_taken_as_it_comes_and_neither_acked_nor_held_back() -> None:
    """A peer whose HELLO has no ``seen`` numbers its HELLO too and takes no ACK (an ACK would be
    no frame to it): its frames are handed on as they come, and DATA to it never waits for acks."""
    with relay(encoding=BINARY) as played:
        link = Link(played.connect("client"), encoding=BINARY)
        old = played.connect("worker")
        try:
            link.send(json_frame(FrameType.HELLO, {"side": "client"}))
            old.send(json_frame(FrameType.HELLO, {"v": 1, "side": "worker"}, seq=1).encode())
            old.send(Frame(FrameType.DATA, STDOUT, 2, b"hi").encode())
            hello, data = link.recv(10), link.recv(10)
            assert hello is not None and hello.type == FrameType.HELLO and hello.seq == 1
            assert data is not None and data.payload == b"hi"
            link.send(Frame(FrameType.DATA, STDIN, 0, b"x" * (3 * WINDOW)))  # no ack will come: it goes all the same
            link.send(Frame(FrameType.EOF, STDIN))
            time.sleep(0.3)  # what an idle reader owes, were the peer to take acks
            sent = [f for side, f in played.log if side == "client"]
            assert FrameType.ACK not in {f.type for f in sent}
            assert sent[-1].type == FrameType.EOF
        finally:
            link.close()
            old.close()


def test_the_workers_link_says_a_lost_connection_its_own_way() -> None:
    with relay() as played:
        link = WorkerLink(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        played.connect("client").close()
        assert link.recv() is None
        with pytest.raises(ConnectionClosed):
            link.send(Frame(FrameType.DATA, STDOUT, 0, b"late"))
        link.close()


def test_base64_messages_carry_frames_both_ways() -> None:
    frame = Frame(FrameType.DATA, STDOUT, 9, bytes(range(256)))
    text = message(frame, BASE64)
    assert isinstance(text, str) and base64.b64decode(text) == frame.encode()
    assert decode(frame_bytes(text, BASE64)) == frame
    assert len(frame_bytes(message(frame, BINARY), BINARY)) == HEADER.size + 256


def test_the_client_reads_the_relays_encoding_and_frame_size_from_the_api() -> None:
    answer = {"id": "s", "relay": {"url": "wss://x/", "headers": {}, "max_frame": GATEWAY_FRAME, "encoding": BASE64}}
    access = Access.read(answer)
    assert (access.encoding, access.max_frame) == (BASE64, GATEWAY_FRAME)
    assert Access.read({"id": "s", "relay": {"url": "ws://x/", "headers": {}, "max_frame": 1 << 30}}).encoding == BINARY
    assert Access.read({"id": "s", "relay": {"url": "ws://x/", "headers": {}, "max_frame": 1 << 30}}).max_frame == 65536


def peer_hello(played: Relay, to: str = "client") -> None:
    """A peer of this release says HELLO straight into ``to``'s inbox: it has had ``to``'s, it acks."""
    hello = json_frame(FrameType.HELLO, {"v": 1, "side": "worker", "seen": True, "acks": True})
    played.inbox[to].put(message(hello, played.encoding))


def test_a_gap_is_timed_from_when_its_frame_became_the_next_one_not_from_the_first_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each frame comes two places late (2, 4, 1, 6, 3, 8, 5, ...): some frame is always held, but
    every gap closes within a pair of frames; the clock moves 10 s per pair, past GAP_SECONDS in all."""
    monkeypatch.setattr(_link, "LINGER_SECONDS", 0.2)
    moved = [0.0]
    with relay(encoding=BINARY) as played:
        played.connect("worker")
        link = Link(played.connect("client"), clock=lambda: time.monotonic() + moved[0])
        try:
            peer_hello(played)
            hello = link.recv(10)
            assert hello is not None and hello.type == FrameType.HELLO
            bursts = [[2, 4, 1]] + [[2 * k + 6, 2 * k + 3] for k in range(5)]
            taken: list[int] = []
            for burst in bursts:
                for seq in burst:
                    played.inbox["client"].put(message(Frame(FrameType.DATA, STDOUT, seq, b"x"), BINARY))
                for _ in range(2):  # each burst lets two more go on
                    frame = link.recv(10)
                    assert frame is not None, taken
                    taken.append(frame.seq)
                moved[0] += 10.0
                time.sleep(_link.TICK_SECONDS + 0.05)  # the link looks at its timers
            assert taken == list(range(1, 13))
            assert 10.0 * len(bursts) >= 2 * _link.GAP_SECONDS
        finally:
            link.close()


def test_line_at_a_time_output_past_a_late_frame_waits_for_it_instead_of_overflowing_the_receiver() -> None:
    """2,000 one-line frames (far fewer bytes than the window): the relay holds the first back for a
    moment, and the sender stops at what the receiver may hold, by frames as well as bytes."""
    lines = [b"line %d of output\n" % i for i in range(2000)]

    def late(side: str, frame: Frame) -> float:
        return 0.5 if frame.type == FrameType.DATA and frame.payload == lines[0] else 0.0

    with relay(late=late) as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            meet(client, worker)
            thread = threading.Thread(target=lambda: [worker.send(Frame(FrameType.DATA, STDOUT, 0, x)) for x in lines])
            thread.start()
            assert drain(client, sum(map(len, lines)), STDOUT) == b"".join(lines)
            thread.join(10)
        finally:
            client.close()
            worker.close()


def test_a_send_refused_because_the_link_is_closing_leaves_nothing_for_close_to_wait_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_link, "LINGER_SECONDS", 30.0)  # close waits for acks of all it sent
    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            meet(client, worker)
            worker.send(Frame(FrameType.DATA, STDOUT, 0, b"output"))
            closing = threading.Thread(target=worker.close, daemon=True)
            closing.start()
            sent = 1
            with pytest.raises(SessionLost):
                while True:  # until close() began
                    worker.send(Frame(FrameType.DATA, STDOUT, 0, b"late"))
                    sent += 1
            assert drain(client, len(b"output") + 4 * (sent - 1), STDOUT) == b"output" + b"late" * (sent - 1)
            closing.join(10)  # the client acked all it was sent: nothing else is waited for
            assert not closing.is_alive()
        finally:
            client.close()
            worker.close()


def test_senders_at_once_never_take_the_link_past_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a PING is being written, eight threads send a frame each: the window (two frames)
    is counted for each of them as it decides to go, not after."""
    monkeypatch.setattr(_link, "LINGER_SECONDS", 0.2)  # the client never acks: hang up soon
    window = 2 * GATEWAY_FRAME
    ended: list[SessionLost] = []

    def send() -> None:
        try:
            worker.send(Frame(FrameType.DATA, STDOUT, 0, os.urandom(GATEWAY_FRAME)))
        except SessionLost as e:
            ended.append(e)

    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        end = played.connect("worker")
        carry = end.send

        def slow(data: bytes | str) -> None:
            if decode(frame_bytes(data, BASE64)).type == FrameType.PING:
                time.sleep(0.5)
            carry(data)

        end.send = slow  # type: ignore[method-assign]
        worker = Link(end, GATEWAY_FRAME, encoding=BASE64, window=window)
        try:
            meet(client, worker)
            pinging = threading.Thread(target=worker.send, args=(ping(1),), daemon=True)
            pinging.start()
            time.sleep(0.1)
            senders = [threading.Thread(target=send, daemon=True) for _ in range(8)]
            for thread in senders:
                thread.start()
            pinging.join(10)
            time.sleep(0.5)  # the client takes nothing: no ack comes
            assert 0 < worker.bytes_out <= window + GATEWAY_FRAME
            worker.close()
            for thread in senders:
                thread.join(10)
            assert len(ended) == 8 - worker.bytes_out // GATEWAY_FRAME  # the others were held back until then
        finally:
            client.close()
            worker.close()


def test_frames_past_the_last_seq_go_on_from_1_in_order_and_acked(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if 2**32 - 6 frames had gone before: 600 more (past what the window lets go unacked)
    cross the wrap of the numbering."""
    monkeypatch.setattr(_link, "LINGER_SECONDS", 30.0)
    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)
        try:
            worker._seq = Sequencer(SEQ_SPAN - 6)
            client._expected = SEQ_SPAN - 5
            meet(client, worker)
            lines = [b"%d," % i for i in range(600)]
            thread = threading.Thread(target=lambda: [worker.send(Frame(FrameType.DATA, STDOUT, 0, x)) for x in lines])
            thread.start()
            assert drain(client, sum(map(len, lines)), STDOUT) == b"".join(lines)
            thread.join(10)
            closing = threading.Thread(target=worker.close, daemon=True)
            closing.start()
            closing.join(10)  # every frame acked, the last ones by seqs from 1
            assert not closing.is_alive()
        finally:
            client.close()
            worker.close()


@pytest.mark.parametrize(
    "frame",
    [
        Frame(FrameType.DATA, STDIN, 0, b"injected\n"),
        Frame(FrameType.EOF, STDIN),
        json_frame(FrameType.EXIT, {"code": 0}),
        Frame(FrameType.SIGNAL, 0, 0, b"\x09"),
    ],
)
def test_a_numbered_type_outside_the_numbering_ends_the_link(frame: Frame) -> None:
    with relay(encoding=BINARY) as played:
        link = Link(played.connect("client"), encoding=BINARY)
        try:
            peer_hello(played)
            played.inbox["client"].put(message(frame, BINARY))
            hello = link.recv(10)
            assert hello is not None and hello.type == FrameType.HELLO
            with pytest.raises(SessionLost) as lost:
                link.recv(10)
            assert lost.value.reason == "relay_lost" and f"a {frame.type.name} frame outside" in str(lost.value)
        finally:
            link.close()


def test_a_relays_gone_outside_the_numbering_is_handed_on() -> None:
    with relay(encoding=BINARY) as played:
        link = Link(played.connect("client"), encoding=BINARY)
        try:
            peer_hello(played)
            played.inbox["client"].put(message(json_frame(FrameType.GONE, {"reason": "run_ended"}), BINARY))
            kinds = [frame.type if (frame := link.recv(10)) else None for _ in range(2)]
            assert kinds == [FrameType.HELLO, FrameType.GONE]
        finally:
            link.close()


def test_copies_of_a_held_frame_are_held_once() -> None:
    """Thirty copies of frame 2 (60 KB each) while 1 is missing: what is held is one of them, well
    within what a receiver holds, and 1 then lets both go on."""
    with relay(encoding=BINARY) as played:
        link = Link(played.connect("client"), encoding=BINARY)
        try:
            peer_hello(played)
            for _ in range(30):
                played.inbox["client"].put(message(Frame(FrameType.DATA, STDOUT, 2, b"2" * 60_000), BINARY))
            played.inbox["client"].put(message(Frame(FrameType.DATA, STDOUT, 1, b"1"), BINARY))
            frames = [link.recv(10) for _ in range(3)]
            assert [(f.type, f.seq) for f in frames if f is not None] == [
                (FrameType.HELLO, 0),
                (FrameType.DATA, 1),
                (FrameType.DATA, 2),
            ]
            assert link.recv(0.3) is None  # no copy
        finally:
            link.close()


def test_a_gateways_error_text_instead_of_a_frame_is_quoted_when_the_link_ends() -> None:
    with relay() as played:
        link = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64)
        try:
            said = '{"message": "Internal server error", "connectionId": "x\x1b[2J", "pad": "' + "p" * 500 + '"}'
            played.inbox["client"].put(said)
            with pytest.raises(SessionLost) as lost:
                link.recv(10)
            text = str(lost.value)
            assert lost.value.reason == "relay_lost" and '{"message": "Internal server error"' in text
            assert "\x1b" not in text and text.endswith("...") and len(text) < 300
        finally:
            link.close()


def test_an_unanswered_opening_is_logged_without_the_urls_query(caplog: pytest.LogCaptureFixture) -> None:
    """A relay's URL may carry an access token in its query: the retry's log line leaves it out."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # takes the connection, never answers the opening
        where = f"127.0.0.1:{server.getsockname()[1]}/client/hub"
        with caplog.at_level("INFO", logger=_link_dial.__name__), pytest.raises(TimeoutError):
            _link_dial.connect(f"ws://{where}?access_token=secret-token", {}, BASE64, open_timeout=0.3, env_proxy=False)
    assert "did not answer" in caplog.text and where in caplog.text
    assert "secret-token" not in caplog.text


def cut(played: Relay, side: str, gone: bool = True) -> None:
    """The relay drops ``side``'s connection and what it was carrying: its peer gets GONE
    ``<side>_gone`` (``gone``; else nothing) and is closed too."""
    peer = "worker" if side == "client" else "client"
    with played._lock:
        for each in (side, peer):
            played.pending[each].clear()
            with contextlib.suppress(queue.Empty):
                while True:  # what was on its way is lost
                    played.inbox[each].get_nowait()
        played.later.clear()
        played.inbox[side].put(_CLOSED)
        if gone:
            played.inbox[peer].put(message(json_frame(FrameType.GONE, {"reason": f"{side}_gone"}), played.encoding))
        played.inbox[peer].put(_CLOSED)


def resuming_pair(played: Relay) -> tuple[Link, Link]:
    return (
        Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64, redial=lambda: played.connect("client")),
        Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64, redial=lambda: played.connect("worker")),
    )


@pytest.mark.parametrize(
    "drops", [["client"], ["both"], ["worker", "worker"]], ids=["one-side", "both-sides", "twice-in-a-row"]
)
def test_links_that_resume_carry_every_byte_once_and_in_order_through_dropped_connections(drops: list[str]) -> None:
    up, down = os.urandom(2 << 20), os.urandom(2 << 20)
    with relay(late=lambda side, frame: 0.02) as played:  # frames always on their way: a cut loses some
        client, worker = resuming_pair(played)
        try:
            meet(client, worker)
            threads = [sender(client, STDIN, up), sender(worker, STDOUT, down)]
            got: dict[str, bytes] = {}
            reader = threading.Thread(target=lambda: got.setdefault("up", drain(worker, len(up), STDIN)))
            reader.start()
            downstream = threading.Thread(target=lambda: got.setdefault("down", drain(client, len(down), STDOUT)))
            downstream.start()
            for n, side in enumerate(drops, 1):
                deadline = time.monotonic() + 20
                while worker.bytes_out < n * len(down) // (len(drops) + 1):  # mid-transfer
                    assert time.monotonic() < deadline and downstream.is_alive(), worker.bytes_out
                    time.sleep(0.005)
                cut(played, "client" if side == "both" else side, gone=side != "both")  # both: no GONE
            downstream.join(60)
            reader.join(60)
            for thread in threads:
                thread.join(10)
            assert got == {"up": up, "down": down}  # once each, in order: a copy or a gap would show
        finally:
            client.close()
            worker.close()
    hellos = [f.json() for _, f in played.log if f.type == FrameType.HELLO]
    assert any("resume" in hello for hello in hellos)  # the connections did drop and resume


def test_a_gone_closed_is_final_for_a_link_that_resumes() -> None:
    with relay() as played:
        client, worker = resuming_pair(played)
        try:
            meet(client, worker)
            with played._lock:
                played.inbox["client"].put(message(json_frame(FrameType.GONE, {"reason": "closed"}), BASE64))
                played.inbox["client"].put(_CLOSED)
            gone = client.recv(10)
            assert gone is not None and gone.type == FrameType.GONE
            with pytest.raises(SessionLost):
                client.recv(10)
            assert client.closed.is_set()
        finally:
            client.close()
            worker.close()
    assert not any("resume" in f.json() for _, f in played.log if f.type == FrameType.HELLO)


def test_a_peer_that_does_not_resume_makes_a_drop_final() -> None:
    dialled: list[str] = []
    with relay() as played:
        client = Link(
            played.connect("client"),
            GATEWAY_FRAME,
            encoding=BASE64,
            redial=lambda: dialled.append("x"),  # type: ignore[func-returns-value]
        )
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64)  # an older side: no redial
        try:
            meet(client, worker)
            played.hang_up("client")
            with pytest.raises(SessionLost, match="lost"):
                client.recv(10)
        finally:
            client.close()
            worker.close()
    assert dialled == []


@pytest.mark.parametrize("refused", [False, True], ids=["unreachable", "session-over"])
def test_a_link_that_cannot_dial_again_is_lost_after_its_grace_or_at_once_when_refused(refused: bool) -> None:
    tries: list[float] = []

    def redial() -> object:
        tries.append(time.monotonic())
        if refused:
            raise Refused("the session is over")
        raise OSError("connection refused")

    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64, redial=redial, grace=1.5)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64, redial=redial, grace=1.5)
        try:
            meet(client, worker)
            began = time.monotonic()
            played.hang_up("client")
            with pytest.raises(SessionLost) as lost:
                client.recv(10)
            took = time.monotonic() - began
        finally:
            client.close()
            worker.close()
    if refused:
        assert "the session is over" in str(lost.value) and took < 1.5
    else:
        assert "reconnecting for 2 s failed: connection refused" in str(lost.value) and took >= 1.5
        assert len(tries) >= 4  # each side: at once, then after 0.5 and 1 s


def test_a_link_whose_connection_alone_dropped_resumes_with_a_peer_that_stayed_connected() -> None:
    with relay() as played:
        client, worker = resuming_pair(played)
        client.grace = worker.grace = 3
        try:
            meet(client, worker)
            client.send(Frame(FrameType.DATA, STDIN, 0, b"a"))
            assert drain(worker, 1, STDIN) == b"a"
            with played._lock:  # the client's connection drops; the worker's stays (its $disconnect was lost)
                played.inbox["client"].put(_CLOSED)
            client.send(Frame(FrameType.DATA, STDIN, 0, b"b"))
            worker.send(Frame(FrameType.DATA, STDOUT, 0, b"c"))
            assert drain(worker, 1, STDIN) == b"b"
            assert drain(client, 1, STDOUT) == b"c"
            time.sleep(3.5)  # past the grace: the client resumed, so it is not lost
            client.send(Frame(FrameType.DATA, STDIN, 0, b"d"))
            assert drain(worker, 1, STDIN) == b"d"
        finally:
            client.close()
            worker.close()


def test_the_sessions_end_during_a_redial_is_not_held_behind_it() -> None:
    def unreachable() -> object:
        raise OSError("connection refused")

    with relay() as played:
        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64, redial=unreachable, grace=60)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64, redial=unreachable, grace=60)
        try:
            meet(client, worker)
            cut(played, "client")
            deadline = time.monotonic() + 10
            while not worker._resuming:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            ending = threading.Thread(
                target=lambda: (worker.send(json_frame(FrameType.GONE, {"reason": "run_ended"})), worker.close())
            )
            ending.start()
            ending.join(10)  # well within the grace the redial would otherwise run to
            assert not ending.is_alive()
            assert worker.closed.is_set() and not worker._reader.is_alive()
        finally:
            client.close()
            worker.close()


def test_hanging_up_while_a_redial_is_under_way_closes_the_connection_it_makes() -> None:
    made: list[object] = []
    dialling, go_on = threading.Event(), threading.Event()
    with relay() as played:

        def slow() -> object:
            dialling.set()
            go_on.wait(10)
            made.append(played.connect("client"))
            return made[-1]

        client = Link(played.connect("client"), GATEWAY_FRAME, encoding=BASE64, redial=slow)
        worker = Link(played.connect("worker"), GATEWAY_FRAME, encoding=BASE64, redial=lambda: played.connect("worker"))
        try:
            meet(client, worker)
            cut(played, "client")
            assert dialling.wait(10)
            client.close()  # it gives the redial a few seconds, then leaves it
            go_on.set()
            client._reader.join(10)
            assert not client._reader.is_alive()
            assert len(made) == 1 and made[0].over  # type: ignore[attr-defined]
        finally:
            go_on.set()
            client.close()
            worker.close()
