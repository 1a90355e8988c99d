"""The SessionRelay contract, run against every relay (relay_stacks.py): the two sides of a session
meet and every byte value crosses both ways in the relay's own encoding; a ticket that does not
open the session is refused before any frame, as is a second connection of a side, and a worker's
ticket never joins as the client (nor a client's as the worker); nothing crosses between sessions;
a side that goes leaves its peer GONE; ``close`` hangs up both; an oversize frame ends its sender;
a client cannot forge GONE to its worker (where the relay reads the frames' types); a worker's GONE
reaches its client."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from runplane.domain import session_wire
from runplane.domain.session_wire import Frame, FrameType
from runplane.domain.sessions import BASE64, LIVE, SessionState, ticket
from tests.integration.contracts.relay_stacks import FIXTURES, STACKS, RelayStack, Side


@pytest.fixture(params=sorted(STACKS))
def relay(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RelayStack]:
    fixtures = {name: request.getfixturevalue(name) for name in FIXTURES.get(request.param, ())}
    with STACKS[request.param](tmp_path, **fixtures) as stack:
        yield stack


def _gone(side: Side) -> str:
    """The reason of the GONE frame ``side`` gets next, once it is closed after it."""
    frame = session_wire.decode(side.recv())
    assert frame.type == FrameType.GONE, frame
    reason = str(frame.json()["reason"])
    with pytest.raises(ConnectionClosed):
        side.recv()
    return reason


def _refused(relay: RelayStack, session: object, text: str | None) -> int:
    with pytest.raises(InvalidStatus) as caught:
        relay.dial(session, text)  # type: ignore[arg-type]
    return caught.value.response.status_code


def _wait(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _data(channel: int, seq: int, payload: bytes) -> bytes:
    return Frame(FrameType.DATA, channel, seq, payload).encode()


def test_the_endpoint_is_the_relays_with_the_ticket_as_bearer(relay: RelayStack) -> None:
    session, client_ticket, _ = relay.session()
    endpoint = relay.relay.endpoint(session, client_ticket)
    assert endpoint.url.partition("?")[0] == relay.url
    assert endpoint.encoding == relay.encoding
    assert endpoint.max_frame == relay.max_frame <= session_wire.MAX_PAYLOAD
    assert endpoint.headers == {relay.ticket_header: f"Bearer {client_ticket}"}


def test_the_sides_meet_and_every_byte_value_crosses_both_ways(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    every_byte = _data(session_wire.STDIN, 1, bytes(range(256)))
    largest = _data(session_wire.STDIN, 2, bytes(range(256)) * (relay.max_frame // 256))
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        _wait(lambda: relay.held(session.id) == ["client", "worker"])
        client.send(every_byte)
        client.send(largest)
        # a gateway may deliver two messages of one side in either order: the frames' seq put them right
        assert sorted([worker.recv(), worker.recv()]) == sorted([every_byte, largest])
        back = [_data(session_wire.STDOUT, n + 1, bytes([255 - n]) * (n + 1)) for n in range(3)]
        for frame in back:
            worker.send(frame)
        assert sorted(client.recv() for _ in back) == sorted(back)


def test_tickets_that_do_not_open_the_session_are_refused_before_any_frame(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    other, other_client, _ = relay.session(slot=1, run_id=session.run_id)
    _, ended_client, _ = relay.session(slot=2, run_id=session.run_id, state=SessionState.ENDED)
    secret = client_ticket.rsplit(".", 1)[1]
    refused = [
        "not-a-ticket",
        ticket(session.id.replace(session.run_id, "r-other"), secret),  # no such session
        ticket(session.id, other_client.rsplit(".", 1)[1]),  # another session's secret
        ticket(other.id, secret),  # this secret on another session
        ended_client,  # a session over
    ]
    assert _refused(relay, session, None) == 401  # no ticket at all
    for text in refused:
        assert _refused(relay, session, text) == 401, text
    relay.now[0] = session.expires_at + 1  # the client's ticket is taken until expires_at, the worker's later
    assert _refused(relay, session, client_ticket) == 401
    with relay.dial(session, worker_ticket):
        assert _refused(relay, session, worker_ticket) == 409  # one connection per side
        assert relay.held(session.id) == ["worker"]
    assert relay.held(other.id) == []


@pytest.mark.parametrize("first", ["client", "worker"])
def test_a_second_connection_of_a_side_is_refused_and_never_joins_as_the_other(relay: RelayStack, first: str) -> None:
    session, client_ticket, worker_ticket = relay.session()
    mine, theirs = (client_ticket, worker_ticket) if first == "client" else (worker_ticket, client_ticket)
    with relay.dial(session, mine) as side:
        assert _refused(relay, session, mine) == 409
        assert relay.held(session.id) == [first]
        with relay.dial(session, theirs) as peer:  # the other place is still free, for its own ticket
            _wait(lambda: relay.held(session.id) == ["client", "worker"])
            side.send(_data(session_wire.STDIN, 1, b"to the other side"))
            assert session_wire.decode(peer.recv()).payload == b"to the other side"


def test_nothing_crosses_to_another_session(relay: RelayStack) -> None:
    a, a_client, a_worker = relay.session()
    b, b_client, b_worker = relay.session()
    with (
        relay.dial(a, a_client) as ac,
        relay.dial(a, a_worker) as aw,
        relay.dial(b, b_client) as bc,
        relay.dial(b, b_worker) as bw,
    ):
        ac.send(_data(1, 1, b"for a's worker"))
        bw.send(_data(2, 1, b"for b's client"))
        assert session_wire.decode(aw.recv()).payload == b"for a's worker"
        assert session_wire.decode(bc.recv()).payload == b"for b's client"
        for side in (ac, bw):
            with pytest.raises(TimeoutError):
                side.recv(timeout=0.5)


@pytest.mark.parametrize("leaver", ["client", "worker"])
def test_a_side_that_goes_leaves_its_peer_a_gone_frame(relay: RelayStack, leaver: str) -> None:
    session, client_ticket, worker_ticket = relay.session()
    client, worker = relay.dial(session, client_ticket), relay.dial(session, worker_ticket)
    client.send(_data(1, 1, b"x" * 8))
    assert session_wire.decode(worker.recv()).payload == b"x" * 8
    going, staying = (client, worker) if leaver == "client" else (worker, client)
    going.close()
    assert _gone(staying) == f"{leaver}_gone"
    _wait(lambda: relay.held(session.id) == [])


def test_close_hangs_up_both_sides(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        worker.send(_data(2, 1, b"hi"))
        assert session_wire.decode(client.recv()).payload == b"hi"
        ended = {"state": SessionState.ENDED, "end_reason": "closed", "ended_at": relay.now[0]}
        relay.store.update(session, LIVE, ended)  # the API ends a session before it has the relay close it
        relay.relay.close(session.id, "closed")
        assert _gone(client) == "closed"
        assert _gone(worker) == "closed"
    _wait(lambda: relay.held(session.id) == [])
    relay.relay.close(session.id, "closed")  # quiet when nothing is held


def test_an_oversize_frame_ends_the_sending_side(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        largest = relay.largest_message or relay.max_frame + session_wire.HEADER.size
        client.send(b"\x02\x00\x01\x00\x00\x00\x01" + b"z" * (largest + 1 - session_wire.HEADER.size))
        with pytest.raises(ConnectionClosed):
            client.recv()
        assert _gone(worker) == "client_gone"


def test_a_message_of_the_other_kind_ends_the_sending_side(relay: RelayStack) -> None:
    if not relay.other_kind_ends:
        pytest.skip(f"the {relay.name} relay carries both kinds of message")
    session, client_ticket, worker_ticket = relay.session()
    frame = _data(1, 1, b"x")
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        client.send_raw(frame if relay.encoding == BASE64 else frame.hex())
        with pytest.raises(ConnectionClosed):
            client.recv()
        assert _gone(worker) == "client_gone"


def test_a_client_cannot_forge_gone_to_its_worker(relay: RelayStack) -> None:
    if not relay.filters_gone:
        pytest.skip(f"the {relay.name} relay passes every frame on unread")
    session, client_ticket, worker_ticket = relay.session()
    forged = session_wire.json_frame(FrameType.GONE, {"reason": "closed"}).encode()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        with contextlib.suppress(ConnectionClosed):  # a relay may hang such a client up
            client.send(forged)
        try:  # nothing, or the relay's own word that the client went
            frame = session_wire.decode(worker.recv(timeout=0.5))
        except (TimeoutError, ConnectionClosed):
            return
        assert frame.type == FrameType.GONE and frame.json()["reason"] == "client_gone", frame


def test_a_workers_gone_reaches_its_client(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    ended = session_wire.json_frame(FrameType.GONE, {"reason": "run_ended"}).encode()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        worker.send(ended)
        frame = session_wire.decode(client.recv(timeout=5))
        assert frame.type == FrameType.GONE and frame.json()["reason"] == "run_ended", frame
