"""The API Gateway WebSocket fake (runplane/devstack/apigw_ws.py) behaves as the service's data plane
does, as far as the relay relies on it: the proxy events of its three routes, an upgrade refused by
$connect's answer, messages handed to the function concurrently, binary and oversize messages
closing the connection, the @connections API as boto3 reaches it (410 for a connection that is not
there, before its $connect answered included; 413; 403 unsigned), the idle and duration limits,
and a throttle that answers the sender of a message past it as the service does."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from runplane.devstack.apigw_ws import MAX_FRAME, ApiGatewayWebSocket


class Function:
    """A relay function of the test's: records each event; $connect answers ``status``; a message
    ``wait:X`` waits (5 s at most) for a message ``X`` to be handled."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.status = 200
        self.seen: dict[str, threading.Event] = {}
        self.posted_in_connect: list[str] = []
        self.api: ApiGatewayWebSocket | None = None
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        with self.lock:
            self.events.append(event)
        route = event["requestContext"]["routeKey"]
        if route == "$connect":
            try:  # the connection takes no message before its $connect answered
                manage(self.api).post_to_connection(ConnectionId=event["requestContext"]["connectionId"], Data=b"x")
            except ClientError as e:
                self.posted_in_connect.append(e.response["Error"]["Code"])
            return {"statusCode": self.status, "body": "refused" if self.status >= 300 else ""}
        body = event.get("body") or ""
        if body.startswith("wait:"):
            waited = self._seen(body[5:]).wait(5)
            self._seen(f"done:{body}:{waited}").set()
        self._seen(body).set()
        return {"statusCode": 200}

    def _seen(self, body: str) -> threading.Event:
        with self.lock:
            return self.seen.setdefault(body, threading.Event())

    def routes(self) -> list[str]:
        with self.lock:
            return [e["requestContext"]["routeKey"] for e in self.events]


def manage(api: ApiGatewayWebSocket | None) -> Any:
    assert api is not None
    return boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1").client(
        "apigatewaymanagementapi", endpoint_url=api.manage_url
    )


@pytest.fixture
def gateway() -> Iterator[tuple[ApiGatewayWebSocket, Function]]:
    function = Function()
    api = ApiGatewayWebSocket(function, idle_seconds=60, max_seconds=60)
    function.api = api
    api.start()
    try:
        yield api, function
    finally:
        api.stop()


def _dial(api: ApiGatewayWebSocket, path: str = "", **headers: str) -> ClientConnection:
    return connect(api.url + path, additional_headers=headers, open_timeout=10, compression=None, max_size=None)


def _closed(ws: ClientConnection) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


def _wait(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_connect_is_a_proxy_event_and_its_answer_decides_the_upgrade(
    gateway: tuple[ApiGatewayWebSocket, Function],
) -> None:
    api, function = gateway
    function.status = 401
    with pytest.raises(InvalidStatus) as refused:
        _dial(api, "?ticket=t", Authorization="Bearer xyz")
    assert refused.value.response.status_code == 401
    (event,) = function.events
    context = event["requestContext"]
    assert (context["routeKey"], context["eventType"], context["stage"]) == ("$connect", "CONNECT", "v1")
    assert (context["domainName"], context["apiId"]) == (api.domain, api.api_id)
    assert context["connectionId"] and context["connectedAt"] > 0
    assert event["headers"]["Authorization"] == "Bearer xyz"
    assert event["queryStringParameters"] == {"ticket": "t"}
    assert function.posted_in_connect == ["GoneException"]
    function.status = 200
    with _dial(api):
        _wait(lambda: len(api.connections()) == 1)
    _wait(lambda: function.routes() == ["$connect", "$connect", "$disconnect"])  # none for the refused one
    with pytest.raises(InvalidStatus) as elsewhere:
        connect(api.url.replace("/v1", "/v2"), open_timeout=10)
    assert elsewhere.value.response.status_code == 403


def test_messages_are_handed_over_concurrently_and_binary_or_oversize_ones_close(
    gateway: tuple[ApiGatewayWebSocket, Function],
) -> None:
    api, function = gateway
    with _dial(api) as ws:
        ws.send("wait:second")  # its invocation waits for the next message's: it must run meanwhile
        ws.send("second")
        assert function._seen("done:wait:second:True").wait(10)
        messages = [e for e in function.events if e["requestContext"]["routeKey"] == "$default"]
        assert [e["body"] for e in messages] == ["wait:second", "second"]
        assert all(e["requestContext"]["eventType"] == "MESSAGE" and not e["isBase64Encoded"] for e in messages)
        ws.send(b"binary")
        assert _closed(ws) == 1003
    with _dial(api) as ws:
        ws.send("x" * (MAX_FRAME + 1))
        assert _closed(ws) == 1009
    _wait(lambda: function.routes().count("$disconnect") == 2)
    codes = [
        e["requestContext"]["disconnectStatusCode"]
        for e in function.events
        if "disconnectStatusCode" in e.get("requestContext", {})
    ]
    assert sorted(codes) == [1003, 1009]


def test_a_throttled_message_is_answered_the_services_text_and_goes_no_further(
    gateway: tuple[ApiGatewayWebSocket, Function],
) -> None:
    api, function = gateway
    api.throttle(rate=0.001, burst=2)
    with _dial(api) as ws:
        for body in ("one", "two", "three"):
            ws.send(body)
        answer = json.loads(ws.recv(timeout=10))
        assert answer["message"] == "Too Many Requests"
        assert answer["connectionId"] == api.connections()[0] and answer["requestId"]
        assert function._seen("one").wait(5) and function._seen("two").wait(5)
        api.throttle(None)
        ws.send("four")
        assert function._seen("four").wait(5)
        bodies = [e.get("body") for e in function.events if e["requestContext"]["routeKey"] == "$default"]
        assert sorted(bodies) == ["four", "one", "two"]  # "three" never reached the function
        with pytest.raises(TimeoutError):
            ws.recv(timeout=0.3)


def test_the_connections_api_posts_reads_and_closes_as_boto3_expects(
    gateway: tuple[ApiGatewayWebSocket, Function],
) -> None:
    api, _ = gateway
    client = manage(api)
    with _dial(api, **{"User-Agent": "the-test"}) as ws:
        _wait(lambda: len(api.connections()) == 1)
        (conn,) = api.connections()
        client.post_to_connection(ConnectionId=conn, Data=b"aGk=")
        assert ws.recv(timeout=10) == "aGk="  # a text message
        assert client.get_connection(ConnectionId=conn)["Identity"] == {
            "SourceIp": "127.0.0.1",
            "UserAgent": "the-test",
        }
        with pytest.raises(ClientError) as large:
            client.post_to_connection(ConnectionId=conn, Data=b"x" * (MAX_FRAME + 1))
        assert large.value.response["Error"]["Code"] == "PayloadTooLargeException"
        unsigned = httpx.post(f"{api.manage_url}/@connections/{conn}", content=b"x", timeout=10)
        assert unsigned.status_code == 403
        client.delete_connection(ConnectionId=conn)
        _closed(ws)
    for name, kwargs in (("post_to_connection", {"Data": b"x"}), ("get_connection", {}), ("delete_connection", {})):
        with pytest.raises(ClientError) as gone:
            getattr(client, name)(ConnectionId=conn, **kwargs)
        assert gone.value.response["Error"]["Code"] == "GoneException"
        assert gone.value.response["ResponseMetadata"]["HTTPStatusCode"] == 410


def test_idle_and_long_connections_are_closed() -> None:
    function = Function()
    api = ApiGatewayWebSocket(function, idle_seconds=0.5, max_seconds=1.5)
    function.api = api
    api.start()
    try:
        with _dial(api) as idle:
            assert _closed(idle) == 1001
        with _dial(api) as busy:
            started = time.monotonic()
            with pytest.raises(ConnectionClosed):
                while time.monotonic() - started < 10:
                    busy.send("keep")  # never idle: still closed once its time is up
                    time.sleep(0.1)
            assert time.monotonic() - started >= 1.4
        _wait(lambda: function.routes().count("$disconnect") == 2)
    finally:
        api.stop()
