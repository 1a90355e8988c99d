"""What is the AWS relay's own, beyond the relay contract (contracts/test_session_relay.py): a side's
place held by a connection that is gone ($disconnect lost) or past its life is taken by the side
that dials again; a message before the peer is there is dropped; a peer the gateway calls gone
just after its $connect (it may still be connecting) is not taken for gone until its grace is
over, nor replaced by a second connection of its side; a sender its side's place does not name
is hung up; closing a session hangs up a side still connecting; a connection past its message
rate is ended ``too_fast``; a message that is not a frame's base64, or from a connection the
relay no longer knows, ends that connection. The relay function behind the WebSocket API fake, DynamoDB on moto."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from functions.aws import relay as relay_function
from runplane import bootstrap
from runplane.adapters.aws.relay import (
    MESSAGE_RATE,
    RECORD_SECONDS,
    AwsSessionRelay,
    Held,
    RelayConnections,
    manage_url,
)
from runplane.adapters.aws.relay_routes import CONNECT_GRACE_SECONDS, RelayRoutes
from runplane.client.sessions import gone
from runplane.devstack.apigw_ws import ApiGatewayWebSocket
from runplane.devstack.lambda_shim import LambdaContext
from runplane.domain import session_wire
from runplane.domain.session_wire import Frame, FrameType
from runplane.domain.sessions import Session
from runplane.settings import StackSettings
from tests.integration.contracts.relay_stacks import POOLS, RelayStack, Side, aws_relay


@pytest.fixture
def relay(tmp_path: Path, moto_endpoint: str) -> Iterator[RelayStack]:
    with aws_relay(tmp_path, moto_endpoint) as stack:
        yield stack


def _aws(relay: RelayStack) -> AwsSessionRelay:
    assert isinstance(relay.relay, AwsSessionRelay)
    return relay.relay


def _hold(relay: RelayStack, session: Session, side: str, connection_id: str, at: float) -> None:
    """A place held as a connection that went without its $disconnect leaves it."""
    held = Held(session.id, side, connection_id, at)  # type: ignore[arg-type]
    assert _aws(relay).connections.claim(held)
    _aws(relay).connections.record(held)


def _records(relay: RelayStack, session: Session) -> list[str]:
    """The connection records of ``session``'s sides in the relay's table."""
    connections = _aws(relay).connections
    items = connections.client.scan(TableName=connections.table)["Items"]
    return sorted(i["id"]["S"] for i in items if i["id"]["S"].startswith("c#") and i["session_id"]["S"] == session.id)


def _frame(seq: int, payload: bytes) -> bytes:
    return Frame(FrameType.DATA, session_wire.STDIN, seq, payload).encode()


def _gone(side: Side, says: str = "") -> str:
    """The reason of the GONE ``side`` gets before it is closed (whose words, as the SDK raises it,
    include ``says``)."""
    frame = session_wire.decode(side.recv())
    assert frame.type == FrameType.GONE
    assert says in str(gone(frame))
    with pytest.raises(ConnectionClosed):
        side.recv()
    return str(frame.json()["reason"])


def test_a_place_held_by_a_connection_gone_or_past_its_life_is_taken_again(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    _hold(relay, session, "client", "Z2hvc3QtY2xpZW50PQ==", relay.now[0] - CONNECT_GRACE_SECONDS - 1)  # gone
    _hold(relay, session, "worker", "bGl2ZS1idXQtb2xkPQ==", relay.now[0] - RECORD_SECONDS - 1)
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        assert relay.held(session.id) == ["client", "worker"]
        assert _aws(relay).connections.of("Z2hvc3QtY2xpZW50PQ==") is None  # the old records went
        client.send(_frame(1, b"through"))
        assert session_wire.decode(worker.recv()).payload == b"through"


def test_a_side_whose_holder_may_still_be_connecting_is_refused_until_its_grace_is_over(relay: RelayStack) -> None:
    """The gateway calls a connection still in its $connect gone: a second $connect of that side
    (the same ticket, dialled again) does not take its place from under it."""
    session, client_ticket, _ = relay.session()
    _hold(relay, session, "client", "c3RpbGwtY29ubmVjdGluZz0=", relay.now[0] - 1)
    with pytest.raises(InvalidStatus) as refused:
        relay.dial(session, client_ticket)
    assert refused.value.response.status_code == 409
    assert _records(relay, session) == ["c#c3RpbGwtY29ubmVjdGluZz0="]  # the refused one's record went
    assert _aws(relay).connections.side(session.id, "client").connection_id == "c3RpbGwtY29ubmVjdGluZz0="  # type: ignore[union-attr]
    relay.now[0] += CONNECT_GRACE_SECONDS
    with relay.dial(session, client_ticket):
        assert _aws(relay).connections.of("c3RpbGwtY29ubmVjdGluZz0=") is None


def test_a_sender_that_does_not_hold_its_sides_place_is_hung_up(relay: RelayStack) -> None:
    """Two connections of one side (the place taken by the second while the first was in its
    $connect): only the one the place names is heard; the other is told GONE ``replaced``."""
    session, client_ticket, worker_ticket = relay.session()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        first = _aws(relay).connections.side(session.id, "client")
        assert first is not None
        second = Held(session.id, "client", "c2Vjb25kLWNsaWVudD0=", relay.now[0])
        assert _aws(relay).connections.claim(second, replacing=first.connection_id)
        client.send(_frame(1, b"from the first"))
        assert _gone(client, says="another connection took this side's place") == "replaced"
        with pytest.raises(TimeoutError):
            worker.recv(timeout=0.5)
        assert _aws(relay).connections.side(session.id, "client") == second  # the place stays the second's


def test_closing_a_session_hangs_up_a_side_still_connecting(relay: RelayStack) -> None:
    """A side between its claim and its connection record (its $connect not answered yet) is
    closed with the session all the same, and its place freed."""
    session, client_ticket, _ = relay.session()
    with relay.dial(session, client_ticket) as client:
        aws = _aws(relay)
        held = aws.connections.side(session.id, "client")
        assert held is not None
        aws.connections.client.delete_item(
            TableName=aws.connections.table, Key={"id": {"S": f"c#{held.connection_id}"}}
        )
        aws.close(session.id, "closed")
        assert _gone(client) == "closed"
    assert relay.held(session.id) == []


def test_a_connection_past_its_message_rate_is_ended_too_fast(relay: RelayStack) -> None:
    """A side that sends more than ``message_rate`` messages in a second (one ignoring the ACK
    window) is told GONE ``too_fast`` and hung up, its peer ``client_gone``; the count starts again
    each second."""
    session, client_ticket, worker_ticket = relay.session()
    _aws(relay).message_rate = 3
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        for second in range(2):
            for seq in range(3):
                client.send(_frame(3 * second + seq + 1, b"ok"))
            assert sorted(session_wire.decode(worker.recv()).seq for _ in range(3)) == [
                3 * second + i + 1 for i in range(3)
            ]
            relay.now[0] += 1
        relay.now[0] -= 1  # the second of the last three
        client.send(_frame(7, b"one too many"))
        assert _gone(client, says="more messages a second than the relay takes") == "too_fast"
        assert _gone(worker) == "client_gone"
    assert relay.held(session.id) == []


def test_a_message_the_stage_throttles_reaches_its_sender_as_the_gateways_text(relay: RelayStack) -> None:
    """What a side's link reads when the stage throttles it: not a frame, the gateway's JSON text
    (the message itself goes nowhere)."""
    session, client_ticket, worker_ticket = relay.session()
    gateway = relay.extras["gateway"]
    assert isinstance(gateway, ApiGatewayWebSocket)
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        gateway.throttle(rate=0.001, burst=1)
        client.send(_frame(1, b"through"))
        client.send(_frame(2, b"throttled"))
        assert json.loads(client.ws.recv(timeout=10))["message"] == "Too Many Requests"
        assert session_wire.decode(worker.recv()).payload == b"through"
        with pytest.raises(TimeoutError):
            worker.recv(timeout=0.5)


def test_a_message_before_the_peer_is_there_is_dropped(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    with relay.dial(session, client_ticket) as client:
        held = _aws(relay).connections.side(session.id, "client")
        assert held is not None
        # the message as the gateway hands it over, answered before the worker dials
        early = base64.b64encode(_frame(1, b"early")).decode()
        context = {"routeKey": "$default", "eventType": "MESSAGE", "connectionId": held.connection_id}
        answer = relay_function.lambda_handler({"requestContext": context, "body": early}, LambdaContext())
        assert answer == {"statusCode": 200}
        with relay.dial(session, worker_ticket) as worker:
            client.send(_frame(2, b"met"))
            assert session_wire.decode(worker.recv()).payload == b"met"
            with pytest.raises(TimeoutError):
                worker.recv(timeout=0.5)


def test_a_peer_still_connecting_is_not_taken_for_gone_until_its_grace_is_over(relay: RelayStack) -> None:
    session, client_ticket, _ = relay.session()
    _hold(relay, session, "worker", "c3RpbGwtY29ubmVjdGluZz0=", relay.now[0])  # the gateway knows it not yet
    with relay.dial(session, client_ticket) as client:
        client.send(_frame(1, b"dropped"))
        with pytest.raises(TimeoutError):
            client.recv(timeout=0.5)
        assert relay.held(session.id) == ["client", "worker"]
        relay.now[0] += CONNECT_GRACE_SECONDS + 1
        client.send(_frame(2, b"the peer is gone"))
        assert _gone(client) == "worker_gone"
    assert relay.held(session.id) == []


def test_a_message_that_is_not_a_frames_base64_ends_its_side(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        client.send_raw("not base64!")
        with pytest.raises(ConnectionClosed):
            client.recv()
        assert _gone(worker) == "client_gone"
    session, client_ticket, worker_ticket = relay.session()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket) as worker:
        client.send_raw(base64.b64encode(b"\x02\x00").decode())  # shorter than a frame's header
        with pytest.raises(ConnectionClosed):
            client.recv()
        assert _gone(worker) == "client_gone"


def test_a_connection_the_relay_no_longer_knows_is_closed(relay: RelayStack) -> None:
    session, client_ticket, worker_ticket = relay.session()
    with relay.dial(session, client_ticket) as client, relay.dial(session, worker_ticket):
        held = _aws(relay).connections.side(session.id, "client")
        assert held is not None
        _aws(relay).connections.drop(held.connection_id)  # its records expired
        client.send(_frame(1, b"x"))
        with pytest.raises(ConnectionClosed):
            client.recv()


def test_the_message_rate_is_the_stacks_setting() -> None:
    settings = StackSettings(
        prefix="t", aws_endpoint_url="http://127.0.0.1:9", pools=POOLS, relay_url="ws://127.0.0.1:9/v1"
    )
    assert _aws_of(settings).message_rate == MESSAGE_RATE
    assert _aws_of(settings.model_copy(update={"relay_message_rate": 7})).message_rate == 7


def _aws_of(settings: StackSettings) -> AwsSessionRelay:
    relay = bootstrap.build_stack(settings, bootstrap.aws_clients(settings)).relay
    assert isinstance(relay, AwsSessionRelay)
    return relay


def test_the_manage_url_is_the_stages_own_over_https() -> None:
    assert manage_url("wss://abc.execute-api.eu-west-1.amazonaws.com/v1") == (
        "https://abc.execute-api.eu-west-1.amazonaws.com/v1"
    )
    assert manage_url("ws://127.0.0.1:9000/v1/") == "http://127.0.0.1:9000/v1"
    with pytest.raises(ValueError):
        manage_url("https://abc.execute-api.eu-west-1.amazonaws.com/v1")


def test_a_failing_store_is_answered_never_raised(relay: RelayStack) -> None:
    """A $connect the relay cannot decide is 503 (try again); a message or a $disconnect it cannot
    handle is a 500 answer, not a failed invocation (whose side API Gateway would send a message
    that is no frame)."""
    _, client_ticket, _ = relay.session()
    aws = _aws(relay)
    broken = AwsSessionRelay(relay.url, RelayConnections("no-such-table", aws.connections.client), aws.gateway)
    routes = RelayRoutes(relay.store, broken, lambda: relay.now[0])
    context = {"connectionId": "YnJva2VuPQ=="}
    connect = {
        "requestContext": {**context, "routeKey": "$connect"},
        "headers": {"authorization": f"Bearer {client_ticket}"},
    }
    assert routes.handle(connect)["statusCode"] == 503
    message = {
        "requestContext": {**context, "routeKey": "$default"},
        "body": base64.b64encode(_frame(1, b"x")).decode(),
    }
    assert routes.handle(message)["statusCode"] == 500
    assert routes.handle({"requestContext": {**context, "routeKey": "$disconnect"}})["statusCode"] == 500
    assert RelayRoutes(relay.store, aws, lambda: relay.now[0]).handle(connect)["statusCode"] == 200  # the header's case
