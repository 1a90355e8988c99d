"""A port-forward's connections never hold the session's reader: what the client sends a connection
goes through that connection's own writer, so a run's side that reads nothing neither keeps the
frames that end the session from being read nor leaves a thread or a socket behind. A socket pair
stands in for the connection into the run; a list of frames for the relay."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from runplane.domain.session_wire import FIRST_PORT_CHANNEL, MAX_PAYLOAD, Frame, FrameType
from runplane.domain.sessions import Session, SessionKind, new_secret, session_id
from worker_agent.sessions import ports
from worker_agent.sessions.ports import PortForward

CHAN = FIRST_PORT_CHANNEL


class Sent:
    """The link to the relay: what the worker's side sends, kept."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def send(self, frame: Frame) -> None:
        self.frames.append(frame)


@pytest.fixture
def deaf():
    """A PortForward whose one connection's far end (the run's listener) never reads; its frames sent."""
    now = time.time()
    session = Session(
        id=session_id("r-ports", 0), run_id="r-ports", slot=0, attempt=1, owner="alice", asked_by="alice",
        kind=SessionKind.PORT_FORWARD, port=8000, relay="ws://127.0.0.1:1/v1/relay",
        client_secret_hash=new_secret()[1], created_at=now, expires_at=now + 60,
    )  # fmt: skip
    ours, run_side = socket.socketpair()
    sent = Sent()
    forward = PortForward(session, sent, lambda port: ours)  # type: ignore[arg-type]
    forward.start(None, None)
    forward.on_frame(Frame(FrameType.OPEN, CHAN, 0, json.dumps({"port": 8000}).encode()))
    assert [f.type for f in sent.frames] == [FrameType.OPEN_OK]
    yield forward, sent, ours
    forward.stop()
    run_side.close()


def _threads(forward):
    return [t for t in threading.enumerate() if forward.session.id in t.name]


def _feed(forward, frames=400):
    """The session's reader handing ``frames`` full DATA frames to the connection (far more than the
    socket's buffers and the connection's queue hold), in a thread of its own; ``reader.fed``: how
    many it handed."""

    def feed():
        for _ in range(frames):
            forward.on_frame(Frame(FrameType.DATA, CHAN, 0, b"x" * MAX_PAYLOAD))
            reader.fed += 1

    reader = threading.Thread(target=feed, daemon=True)
    reader.fed = 0
    reader.start()
    return reader


def test_a_connection_that_reads_nothing_is_closed_and_frees_the_reader(deaf, monkeypatch):
    forward, sent, ours = deaf
    monkeypatch.setattr(ports, "STALL_SECONDS", 0.5, raising=False)
    reader = _feed(forward)
    reader.join(timeout=30)
    assert not reader.is_alive(), "the reader is stuck on a connection that reads nothing"
    assert Frame(FrameType.CLOSE, CHAN) in sent.frames  # the client is told the connection is gone
    forward.stop()
    assert _threads(forward) == [] and ours.fileno() == -1


def test_the_end_of_the_session_frees_a_reader_held_by_a_full_connection(deaf, monkeypatch):
    forward, _, ours = deaf
    monkeypatch.setattr(ports, "STALL_SECONDS", 600.0, raising=False)  # only the end may free it
    reader, fed = _feed(forward), -1
    while reader.fed != fed:  # until the reader waits on the full connection
        fed = reader.fed
        time.sleep(0.3)
    assert reader.is_alive() and fed < 400
    stopper = threading.Thread(target=forward.stop, daemon=True)  # GONE, or the run's end, from another thread
    stopper.start()
    stopper.join(timeout=30)
    reader.join(timeout=30)
    assert not stopper.is_alive() and not reader.is_alive()
    assert _threads(forward) == [] and ours.fileno() == -1
