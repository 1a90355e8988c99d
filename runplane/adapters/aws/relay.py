"""The AWS relay: an API Gateway WebSocket API whose one function (functions/aws/relay.py, its logic in
relay_routes.py) pairs a session's two sides. Here: the port the API holds (``AwsSessionRelay``:
where a side dials, and hanging a session up), the connections table both write
(``RelayConnections``) and the gateway's ``@connections`` API (``GatewayConnections``).

API Gateway refuses binary messages from clients (close 1003) and caps a frame at 32 KB, so a frame
travels as a text message of its base64 (``encoding: base64``) and carries at most 16 KiB of payload
(its base64 is under 22 KB). A connection lives at most 2 hours and 10 idle minutes; its
``$disconnect`` is best effort, so every record here has a TTL past a connection's longest life.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.dynamodb import translate
from runplane.adapters.aws.resources import RELAY_TTL_ATTRIBUTE
from runplane.domain import session_wire
from runplane.domain.errors import BackendError
from runplane.domain.session_wire import FrameType
from runplane.domain.sessions import BASE64, RelayEndpoint, Session, Side

__all__ = [
    "MESSAGE_RATE",
    "RELAY_FRAME",
    "AwsSessionRelay",
    "GatewayConnections",
    "RelayConnections",
    "gone_message",
    "manage_url",
]

log = logging.getLogger(__name__)

RELAY_FRAME = 16 * 1024
"""The most payload bytes of a frame through API Gateway (its base64 and header: under its 32 KB)."""
CONNECTION_SECONDS = 2 * 3600
"""API Gateway closes a WebSocket connection after 2 hours, whatever it does."""
RECORD_SECONDS = CONNECTION_SECONDS + 3600
"""How long a connection's records live (their TTL, and past it they are taken for stale): longer
than any connection, for a ``$disconnect`` that never came."""
MESSAGE_RATE = 250
"""The most messages one connection may send in a second unless set (``RUNPLANE_RELAY_MESSAGE_RATE``):
4 MiB of frames' payload; one more ends it with GONE ``too_fast``, so that no connection takes more
than a quarter of the stage's throttle."""
KEY = "id"
TTL_ATTRIBUTE = RELAY_TTL_ATTRIBUTE
SIDES: tuple[Side, Side] = ("client", "worker")


def manage_url(relay_url: str) -> str:
    """The ``@connections`` endpoint of the WebSocket API stage at ``relay_url`` (``wss://`` ->
    ``https://``, the same host and stage). Raises ValueError for a URL that is not ws(s)://."""
    parts = urlsplit(relay_url.rstrip("/"))
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"the relay URL must be a ws:// or wss:// URL, not {relay_url[:200]!r}")
    return urlunsplit(("https" if parts.scheme == "wss" else "http", parts.netloc, parts.path, "", ""))


def gone_message(reason: str) -> bytes:
    """A GONE frame ``{"reason"}`` as the relay's message (base64 text)."""
    return base64.b64encode(session_wire.json_frame(FrameType.GONE, {"reason": reason}).encode())


def other(side: Side) -> Side:
    return "worker" if side == "client" else "client"


class GatewayConnections:
    """The ``@connections`` API of one WebSocket API stage (boto3 ``apigatewaymanagementapi`` with
    its endpoint). A connection that is not there (closed, or never was) answers GoneException."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def post(self, connection_id: str, data: bytes) -> bool:
        """Send ``data`` as one message to ``connection_id``; False when it is gone. Raises BackendError."""
        return self._call(self.client.post_to_connection, "send to a relay connection", connection_id, Data=data)

    def alive(self, connection_id: str) -> bool:
        """Whether ``connection_id`` is still connected. Raises BackendError."""
        return self._call(self.client.get_connection, "look a relay connection up", connection_id)

    def delete(self, connection_id: str) -> None:
        """Close ``connection_id``; quiet when it is gone. Raises BackendError."""
        self._call(self.client.delete_connection, "close a relay connection", connection_id)

    @staticmethod
    def _call(operation: Any, what: str, connection_id: str, **fields: Any) -> bool:
        """``operation`` on ``connection_id``; False when the connection is gone. Raises BackendError."""
        try:
            operation(ConnectionId=connection_id, **fields)
        except ClientError as e:
            if error_code(e) == "GoneException":
                return False
            raise _failed(e, what) from e
        except BotoCoreError as e:
            raise _failed(e, what) from e
        return True


def _failed(e: Exception, what: str) -> BackendError:
    code = error_code(e) if isinstance(e, ClientError) else e.__class__.__name__
    log.warning("%s: API Gateway answered %s: %s", what, code, e)
    return BackendError(f"{what} failed: {code}")


@dataclass(frozen=True)
class Held:
    """A side's connection, as the table holds it."""

    session_id: str
    side: Side
    connection_id: str
    connected_at: float


class RelayConnections:
    """The relay's connections table (``PREFIX-relay``, HASH ``id``): for each connection
    ``c#<connection id>`` -> its session and side, and for each side of a session held
    ``s#<session id>#<side>`` -> its connection; each with ``expires_at`` (the table's TTL) past
    the longest a connection lives. A side's record is the place only one connection may hold."""

    def __init__(self, table: str, client: Any) -> None:
        self.table, self.client = table, client

    @staticmethod
    def _side_key(session_id: str, side: Side) -> dict[str, Any]:
        return {KEY: {"S": f"s#{session_id}#{side}"}}

    @staticmethod
    def _conn_key(connection_id: str) -> dict[str, Any]:
        return {KEY: {"S": f"c#{connection_id}"}}

    def _fields(self, held: Held) -> dict[str, Any]:
        return {
            "session_id": {"S": held.session_id},
            "side": {"S": held.side},
            "connection_id": {"S": held.connection_id},
            "connected_at": {"N": repr(held.connected_at)},
            TTL_ATTRIBUTE: {"N": str(int(held.connected_at + RECORD_SECONDS))},
        }

    def claim(self, held: Held, replacing: str | None = None) -> bool:
        """Take ``held``'s side of its session for its connection: when no connection holds it, or one
        whose records are past their life, or (``replacing``) that very connection. False when another
        holds it. Raises BackendError."""
        condition = "attribute_not_exists(#k) OR #e < :now"
        names = {"#k": KEY, "#e": TTL_ATTRIBUTE}
        values: dict[str, Any] = {":now": {"N": str(int(held.connected_at))}}
        if replacing is not None:
            condition += " OR #c = :old"
            names["#c"] = "connection_id"
            values[":old"] = {"S": replacing}
        try:
            self.client.put_item(
                TableName=self.table,
                Item={**self._side_key(held.session_id, held.side), **self._fields(held)},
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise translate(e, "claim a relay side") from e
            return False
        except BotoCoreError as e:
            raise translate(e, "claim a relay side") from e
        return True

    def record(self, held: Held) -> None:
        """Write ``held``'s connection record (what its messages are read by)."""
        try:
            self.client.put_item(
                TableName=self.table, Item={**self._conn_key(held.connection_id), **self._fields(held)}
            )
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "record a relay connection") from e

    def spend(self, connection_id: str, window: int) -> tuple[Held, int] | None:
        """Count one message of ``connection_id`` in the second ``window``: what it holds and how many
        messages it has sent in that second, this one included; None when it holds nothing (any
        more). One conditional update (two at the first message of a second). Raises BackendError."""
        names = {"#k": KEY, "#w": "window", "#n": "sent"}
        for _ in range(3):  # a racing message of the same connection may start the second meanwhile
            for update, condition in (
                ("ADD #n :one", "attribute_exists(#k) AND #w = :w"),
                ("SET #w = :w, #n = :one", "attribute_exists(#k) AND (attribute_not_exists(#w) OR #w <> :w)"),
            ):
                try:
                    item = self.client.update_item(
                        TableName=self.table,
                        Key=self._conn_key(connection_id),
                        UpdateExpression=update,
                        ConditionExpression=condition,
                        ExpressionAttributeNames=names,
                        ExpressionAttributeValues={":w": {"N": str(window)}, ":one": {"N": "1"}},
                        ReturnValues="ALL_NEW",
                    ).get("Attributes")
                except ClientError as e:
                    if error_code(e) != "ConditionalCheckFailedException":
                        raise translate(e, "count a relay message") from e
                    continue
                except BotoCoreError as e:
                    raise translate(e, "count a relay message") from e
                held = _held(item)
                if held is None:
                    return None
                try:
                    return held, int((item or {})["sent"]["N"])
                except (KeyError, TypeError, ValueError):
                    return held, 1
            if self.of(connection_id) is None:
                return None
        held = self.of(connection_id)
        return None if held is None else (held, 1)

    def sides(self, session_id: str) -> dict[Side, Held]:
        """The connections that hold the sides of ``session_id`` (one strongly consistent batch read)."""
        keys = [self._side_key(session_id, side) for side in SIDES]
        try:
            answer = self.client.batch_get_item(RequestItems={self.table: {"Keys": keys, "ConsistentRead": True}})
            items = list(answer.get("Responses", {}).get(self.table, []))
            if answer.get("UnprocessedKeys"):  # throttled: the rest one by one
                items = [
                    item
                    for key in keys
                    if (item := self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item"))
                ]
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read a session's relay sides") from e
        return {held.side: held for item in items if (held := _held(item)) is not None}

    def release(self, session_id: str, side: Side) -> Held | None:
        """Free ``side`` of ``session_id`` whoever holds it, and drop its holder's connection record;
        returns the holder (None when none held it). Raises BackendError."""
        try:
            old = self.client.delete_item(
                TableName=self.table, Key=self._side_key(session_id, side), ReturnValues="ALL_OLD"
            ).get("Attributes")
            held = _held(old)
            if held is not None:
                self.client.delete_item(TableName=self.table, Key=self._conn_key(held.connection_id))
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "release a relay side") from e
        return held

    def _get(self, key: dict[str, Any], what: str) -> Held | None:
        try:
            item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        except (ClientError, BotoCoreError) as e:
            raise translate(e, what) from e
        return _held(item)

    def of(self, connection_id: str) -> Held | None:
        """The session and side ``connection_id`` holds; None when it holds none (any more)."""
        return self._get(self._conn_key(connection_id), "read a relay connection")

    def side(self, session_id: str, side: Side) -> Held | None:
        """The connection that holds ``side`` of ``session_id``; None when none does."""
        return self._get(self._side_key(session_id, side), "read a relay side")

    def drop(self, connection_id: str) -> Held | None:
        """Remove ``connection_id``'s records; returns what it held when this call removed them (so
        that of callers racing to end a connection, one alone goes on), else None."""
        try:
            old = self.client.delete_item(
                TableName=self.table, Key=self._conn_key(connection_id), ReturnValues="ALL_OLD"
            ).get("Attributes")
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "drop a relay connection") from e
        held = _held(old)
        if held is not None:
            try:
                self.client.delete_item(
                    TableName=self.table,
                    Key=self._side_key(held.session_id, held.side),
                    ConditionExpression="#c = :c",
                    ExpressionAttributeNames={"#c": "connection_id"},
                    ExpressionAttributeValues={":c": {"S": connection_id}},
                )
            except ClientError as e:  # the side is another connection's already
                if error_code(e) != "ConditionalCheckFailedException":
                    raise translate(e, "drop a relay side") from e
            except BotoCoreError as e:
                raise translate(e, "drop a relay side") from e
        return held


def _held(item: dict[str, Any] | None) -> Held | None:
    """A record read tolerantly: None when it is not one this release can use."""
    if not item:
        return None
    try:
        side = item["side"]["S"]
        if side not in SIDES:
            return None
        return Held(item["session_id"]["S"], side, item["connection_id"]["S"], float(item["connected_at"]["N"]))
    except (KeyError, TypeError, ValueError):
        return None


class AwsSessionRelay:
    """Sessions meet at the WebSocket API at ``url`` (its stage's ``wss://`` URL), each side with its
    ticket as a bearer token; frames are base64 text of at most ``max_frame`` payload bytes."""

    def __init__(
        self,
        url: str,
        connections: RelayConnections,
        gateway: GatewayConnections,
        max_frame: int = RELAY_FRAME,
        message_rate: int = MESSAGE_RATE,
    ) -> None:
        manage_url(url)  # a URL that is not ws(s):// is refused here, not at the first session
        self.url = url.rstrip("/")
        self.connections, self.gateway, self.max_frame = connections, gateway, max_frame
        self.message_rate = message_rate

    def endpoint(self, session: Session, ticket: str) -> RelayEndpoint:
        return RelayEndpoint(
            url=self.url, headers={"Authorization": f"Bearer {ticket}"}, max_frame=self.max_frame, encoding=BASE64
        )

    def close(self, session_id: str, reason: str) -> None:
        """Each side held gets GONE ``{"reason"}`` and is hung up; its records go first, so its
        ``$disconnect`` finds nothing left to tell its peer. A side still in its ``$connect`` (its
        place claimed, its connection record maybe not yet written) loses its place all the same:
        its first message finds it holds none and closes it."""
        held = [h for side in SIDES if (h := self.connections.release(session_id, side)) is not None]
        for side in held:
            self.hang_up(side.connection_id, reason)

    def hang_up(self, connection_id: str, reason: str) -> None:
        """GONE ``{"reason"}`` to ``connection_id``, then close it (quiet when it is gone)."""
        if self.gateway.post(connection_id, gone_message(reason)):
            self.gateway.delete(connection_id)
