"""The client's side of a session against a relay played here: a real WebSocket server on
loopback whose handler is the worker's side of each test (the frames of session_wire)."""

from __future__ import annotations

import os
import pty
import signal
import socket
import termios
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from runplane.cli.common import CliError
from runplane.cli.sessions import command_words, parse_ports
from runplane.client._forward import Forward, PortForward, loopback_listener
from runplane.client._terminal import Detached, forwarded_signals, raw_mode
from runplane.client.sessions import (
    Access,
    Escapes,
    Feeder,
    Link,
    NotJoined,
    SessionLost,
    dial,
    exec_captured,
    gone,
    meet,
    open_link,
    pump_exec,
)
from runplane.domain.session_wire import (
    STDERR,
    STDIN,
    STDOUT,
    Frame,
    FrameType,
    decode,
    json_frame,
    read_resize,
)

Worker = Callable[["Peer"], None]


class Peer:
    """The worker's end of the fake relay."""

    def __init__(self, connection: ServerConnection) -> None:
        self.connection = connection
        self.seen: list[Frame] = []

    def frame(self) -> Frame:
        while True:
            frame = decode(self.connection.recv(timeout=10))  # type: ignore[arg-type]
            if frame.type not in (FrameType.PING, FrameType.PONG):
                self.seen.append(frame)
                return frame

    def send(self, frame: Frame) -> None:
        self.connection.send(frame.encode())

    def hello(self) -> dict[str, object]:
        first = self.frame()
        assert first.type == FrameType.HELLO
        self.send(json_frame(FrameType.HELLO, {"v": 1, "side": "worker"}))
        return first.json()


@contextmanager
def relay(worker: Worker) -> Iterator[tuple[Access, list[BaseException]]]:
    errors: list[BaseException] = []
    headers: list[str | None] = []

    def handler(connection: ServerConnection) -> None:
        headers.append(connection.request.headers.get("Authorization") if connection.request else None)
        try:
            worker(Peer(connection))
        except BaseException as e:  # reported by the test, not lost in the server's thread
            errors.append(e)

    with serve(handler, "127.0.0.1", 0, compression=None) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.socket.getsockname()[1]
        access = Access(
            "r-" + "0" * 24 + ".0.0123abcd", f"ws://127.0.0.1:{port}/v1/relay", {"Authorization": "Bearer t"}, 1024
        )
        try:
            yield access, errors
        finally:
            server.shutdown()
            thread.join(timeout=5)
    assert headers and all(h == "Bearer t" for h in headers)


def test_exec_sends_stdin_in_frames_and_returns_output_and_exit_code() -> None:
    stdin = bytes(range(256)) * 10  # every byte value, more than one frame (max_frame 1024)

    def worker(peer: Peer) -> None:
        peer.hello()
        got = b""
        while (frame := peer.frame()).type == FrameType.DATA:
            assert frame.channel == STDIN and len(frame.payload) <= 1024
            got += frame.payload
        assert frame.type == FrameType.EOF and frame.channel == STDIN
        for i in range(0, len(got), 1024):  # the relay carries at most max_frame bytes a frame
            peer.send(Frame(FrameType.DATA, STDOUT, 1, got[i : i + 1024]))
        peer.send(Frame(FrameType.DATA, STDERR, 2, b"err\n"))
        peer.send(json_frame(FrameType.EXIT, {"code": 3}, seq=3))
        assert peer.seen[0].seq == 0  # HELLO is outside the numbering
        seqs = [f.seq for f in peer.seen[1:]]
        assert seqs == list(range(1, len(seqs) + 1))  # every other frame numbered, in order

    with relay(worker) as (access, errors):
        result = exec_captured(access, stdin)
    assert not errors, errors
    assert (result.exit_code, result.stdout, result.stderr) == (3, stdin, b"err\n")


def test_exec_exit_by_signal_is_128_plus_it() -> None:
    def worker(peer: Peer) -> None:
        peer.hello()
        peer.send(json_frame(FrameType.EXIT, {"code": None, "signal": 9}))

    with relay(worker) as (access, errors):
        assert exec_captured(access).exit_code == 137
    assert not errors


def test_gone_before_exit_is_session_lost_with_its_reason() -> None:
    def worker(peer: Peer) -> None:
        peer.hello()
        peer.send(Frame(FrameType.DATA, STDOUT, 1, b"partial"))
        peer.send(json_frame(FrameType.GONE, {"reason": "run_ended"}))

    with relay(worker) as (access, errors), pytest.raises(SessionLost) as lost:
        exec_captured(access)
    assert lost.value.reason == "run_ended" and "the run ended" in str(lost.value)
    assert not errors


def test_a_relay_that_hangs_up_is_relay_lost() -> None:
    def worker(peer: Peer) -> None:
        peer.hello()
        peer.connection.close()

    with relay(worker) as (access, _), pytest.raises(SessionLost) as lost:
        exec_captured(access)
    assert lost.value.reason == "relay_lost"


def test_no_worker_within_the_wait_is_expired() -> None:
    def worker(peer: Peer) -> None:
        peer.frame()  # the client's HELLO, never answered
        peer.connection.recv(timeout=5)

    with relay(worker) as (access, _), pytest.raises(SessionLost) as lost:
        exec_captured(access, wait=0.5)
    assert lost.value.reason == "expired"


def test_ping_is_answered_with_its_payload() -> None:
    def worker(peer: Peer) -> None:
        peer.hello()
        peer.send(Frame(FrameType.PING, 0, 0, b"\x00" * 7 + b"\x2a"))
        pong = decode(peer.connection.recv(timeout=5))  # type: ignore[arg-type]
        assert (pong.type, pong.payload) == (FrameType.PONG, b"\x00" * 7 + b"\x2a")
        peer.send(json_frame(FrameType.EXIT, {"code": 0}))

    with relay(worker) as (access, errors):
        assert exec_captured(access).exit_code == 0
    assert not errors


def test_signals_and_resizes_go_as_frames() -> None:
    received: list[Frame] = []

    def worker(peer: Peer) -> None:
        hello = peer.hello()
        assert (hello["rows"], hello["cols"]) == (24, 80)
        received.extend(peer.frame() for _ in range(2))
        peer.send(json_frame(FrameType.EXIT, {"code": 0}))

    control_r, control_w = os.pipe()
    with relay(worker) as (access, errors):
        link = Link(dial(access), access.max_frame)
        meet(link, (24, 80))
        feeder = Feeder(link, None, control_r, lambda: (30, 100)).start()
        os.write(control_w, bytes([signal.SIGINT, signal.SIGWINCH]))
        assert pump_exec(link, lambda *_: None) == 0
        feeder.stop()
        link.close()
    os.close(control_r)
    os.close(control_w)
    assert not errors, errors
    assert not feeder.thread.is_alive()
    assert received[0].type == FrameType.SIGNAL and received[0].payload == bytes([signal.SIGINT])
    assert received[1].type == FrameType.RESIZE and read_resize(received[1]) == (30, 100)


def _echo_upper(peer: Peer, opened: list[tuple[int, object]], refuse: int | None = None) -> None:
    """A worker forwarding to a port that answers each connection's bytes in upper case at its EOF."""
    peer.hello()
    pending: dict[int, bytes] = {}
    while True:
        frame = peer.frame()
        if frame.type == FrameType.OPEN:
            opened.append((frame.channel, frame.json()["port"]))
            if frame.json()["port"] == refuse:
                peer.send(json_frame(FrameType.OPEN_FAIL, {"reason": "connection refused"}, frame.channel))
            else:
                peer.send(Frame(FrameType.OPEN_OK, frame.channel))
                pending[frame.channel] = b""
        elif frame.type == FrameType.DATA:
            pending[frame.channel] += frame.payload
        elif frame.type == FrameType.EOF:
            answer = pending.pop(frame.channel).upper()
            for i in range(0, len(answer), 1024):
                peer.send(Frame(FrameType.DATA, frame.channel, 0, answer[i : i + 1024]))
            peer.send(Frame(FrameType.EOF, frame.channel))
            if len(opened) == 2 and not pending:
                peer.send(json_frame(FrameType.GONE, {"reason": "run_ended"}))
                return


def _fetch(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := conn.recv(4096):
            got += chunk
        return got


def test_port_forward_carries_two_connections_at_once_then_ends_with_the_run() -> None:
    opened: list[tuple[int, object]] = []
    with relay(lambda peer: _echo_upper(peer, opened)) as (access, errors):
        link = Link(dial(access), access.max_frame)
        meet(link)
        forward = Forward(link, 8000, loopback_listener(0))
        forward.accept()
        answers: dict[int, bytes] = {}
        clients = [
            threading.Thread(target=lambda i=i: answers.__setitem__(i, _fetch(forward.local_port, b"x%d" % i * 900)))
            for i in range(2)
        ]
        for t in clients:
            t.start()
        ended = forward.pump()
        for t in clients:
            t.join(timeout=10)
        forward.close()
        link.close()
    assert not errors, errors
    assert ended is not None and ended.reason == "run_ended"
    assert answers == {0: b"X0" * 900, 1: b"X1" * 900}
    channels = sorted(channel for channel, _ in opened)
    assert all(c >= 16 and c % 2 == 0 for c in channels) and len(set(channels)) == 2
    assert {port for _, port in opened} == {8000}
    with pytest.raises(OSError):  # the listener is gone
        socket.create_connection(("127.0.0.1", forward.local_port), timeout=2)


def test_a_refused_open_closes_the_local_connection() -> None:
    said: list[str] = []

    def worker(peer: Peer) -> None:
        peer.hello()
        frame = peer.frame()
        assert frame.type == FrameType.OPEN
        peer.send(json_frame(FrameType.OPEN_FAIL, {"reason": "connection refused"}, frame.channel))
        peer.frame()  # the client hangs up (its forward is closed)

    with relay(worker) as (access, errors):
        link = Link(dial(access), access.max_frame)
        meet(link)
        forward = Forward(link, 9, loopback_listener(0), say=said.append)
        forward.accept()
        pump = threading.Thread(target=forward.pump)
        pump.start()
        with socket.create_connection(("127.0.0.1", forward.local_port), timeout=10) as conn:
            assert conn.recv(10) == b""  # closed without a byte
        forward.close()
        link.close()
        pump.join(timeout=5)
    assert not pump.is_alive()
    assert said and "connection refused" in said[0]
    assert not [e for e in errors if not isinstance(e, Exception)]


def test_sdk_port_forward_closes_everything_on_exit() -> None:
    opened: list[tuple[int, object]] = []
    before = {t.name for t in threading.enumerate()}
    with relay(lambda peer: _echo_upper(peer, opened)) as (access, _):
        link = Link(dial(access), access.max_frame)
        meet(link)
        with PortForward(link, 8000, loopback_listener(0)).start() as fwd:
            assert _fetch(fwd.local_port, b"hello") == b"HELLO"
    leftover = {t.name for t in threading.enumerate() if t.is_alive()} - before
    assert not {name for name in leftover if name.startswith(("forward", "session"))}


def test_raw_mode_is_undone_when_the_session_fails() -> None:
    main, other = pty.openpty()
    try:
        before = termios.tcgetattr(other)
        with pytest.raises(SessionLost), raw_mode(other):
            assert termios.tcgetattr(other)[3] & termios.ICANON == 0  # raw: no line editing
            raise SessionLost("relay_lost", "lost")
        assert termios.tcgetattr(other) == before
    finally:
        os.close(main)
        os.close(other)


@pytest.mark.parametrize(("text", "ports"), [("18000:8000", (18000, 8000)), ("8000", (0, 8000)), ("0:80", (0, 80))])
def test_port_forward_ports(text: str, ports: tuple[int, int]) -> None:
    assert parse_ports(text) == ports


@pytest.mark.parametrize("text", ["host:80:80", "80:0", "99999", "a:80", ""])
def test_port_forward_refuses_what_is_not_ports(text: str) -> None:
    with pytest.raises(CliError):
        parse_ports(text)


def test_exec_takes_the_double_dash_off_the_command_once() -> None:
    assert command_words(["--", "sh", "-c", "echo --"]) == ["sh", "-c", "echo --"]
    assert command_words(["--", "--"]) == ["--"]
    assert command_words(["ls", "--"]) == ["ls", "--"]


@pytest.mark.parametrize(
    ("typed", "sent", "left"),
    [
        (["~."], b"", True),
        (["ls\r", "~", "."], b"ls\r", True),
        (["a~.b"], b"a~.b", False),  # not at the start of a line
        (["~~.\n"], b"~.\n", False),  # ~~ is one ~
        (["~x"], b"~x", False),
        (["\n~", "~", "\r~.", "after"], b"\n~\r", True),
        (["ls\r", "\x1b[24;1R", "~."], b"ls\r\x1b[24;1R", True),  # the terminal's cursor report after a prompt
        (["\r\x1b[2", "4;80R~.", "after"], b"\r\x1b[24;80R", True),  # a report split across reads
        (["\r\x1b\x1b[9;1R~."], b"\r\x1b\x1b[9;1R~.", False),  # a typed ESC first
        (["\r\x1b[A~."], b"\r\x1b[A~.", False),  # an arrow key is typed
        (["\r\x1b[1;2~."], b"\r\x1b[1;2~.", False),  # a key's sequence, not a report
    ],
)
def test_tilde_dot_at_the_start_of_a_line_leaves(typed: list[str], sent: bytes, left: bool) -> None:
    escapes, out, leave = Escapes(), b"", False
    for part in typed:
        data, leave = escapes.feed(part.encode())
        out += data
        if leave:
            break
    assert (out, leave) == (sent, left)


def test_a_terminal_left_with_tilde_dot_closes_the_link() -> None:
    got: list[Frame] = []

    def worker(peer: Peer) -> None:
        peer.hello()
        while True:
            try:
                got.append(peer.frame())
            except ConnectionClosed:  # the client hung up
                return

    stdin_r, stdin_w = os.pipe()
    with relay(worker) as (access, _):
        link = Link(dial(access), access.max_frame)
        meet(link)
        feeder = Feeder(link, stdin_r, escapes=True).start()
        os.write(stdin_w, b"echo hi\r~.")
        with pytest.raises(SessionLost):
            pump_exec(link, lambda *_: None)
        feeder.stop()
    os.close(stdin_r)
    os.close(stdin_w)
    assert feeder.detached
    assert [(f.type, f.payload) for f in got] == [(FrameType.DATA, b"echo hi\r")]


def test_without_a_terminal_a_first_interrupt_is_forwarded_and_a_second_detaches() -> None:
    control_r, control_w = os.pipe()
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(Detached) as detached, forwarded_signals(control_w, terminal=False):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            assert os.read(control_r, 8) == bytes([signal.SIGTERM, signal.SIGINT])
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # let the handler run
        assert detached.value.status == 130
        assert signal.getsignal(signal.SIGINT) is before  # put back
    finally:
        os.close(control_r)
        os.close(control_w)


def test_waiting_for_the_worker_ends_when_the_run_is_over_and_an_unjoined_session_says_so() -> None:
    said = threading.Event()

    def worker(peer: Peer) -> None:  # a relay whose worker never comes: HELLO unanswered
        assert peer.frame().type == FrameType.HELLO
        said.wait(timeout=30)

    asked: list[int] = []

    def run_over() -> str | None:
        asked.append(1)
        return "failed" if len(asked) >= 2 else None

    with relay(worker) as (access, errors):
        link = open_link(access)
        try:
            with pytest.raises(SessionLost, match="the run is failed") as lost:
                meet(link, wait=30, run_over=run_over)
        finally:
            said.set()
            link.close()
        assert lost.value.reason == "run_ended" and len(asked) == 2
        with pytest.raises(NotJoined, match="cannot reach"):  # nothing listens there any more
            exec_captured(Access(access.session_id, "ws://127.0.0.1:1/v1/relay", access.headers))
    assert not errors, errors
    peer_absent = gone(json_frame(FrameType.GONE, {"reason": "peer_absent"}))
    assert (peer_absent.reason, str(peer_absent)) == (
        "peer_absent",
        "session ended: no worker joined it in time (is the run still running?)",
    )
