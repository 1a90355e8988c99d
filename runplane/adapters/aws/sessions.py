"""DynamoDB sessions: one item per slot of a run (``PREFIX-sessions``, HASH ``run_id``, RANGE ``slot``)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.dynamodb import translate
from runplane.adapters.records import jsonable, record
from runplane.adapters.session_records import check_session_changes, readable, session_slot
from runplane.domain.errors import ConditionFailed, Conflict, NotFound
from runplane.domain.sessions import OVER, Session, SessionState

__all__ = ["RUN_ID", "SLOT", "DynamoSessionStore"]

RUN_ID = "run_id"
SLOT = "slot"
"""The table's keys: the run (HASH) and the slot (RANGE, a number)."""

_LOST_RACES = 32
"""How often ``update`` reads again when another writer changed the session but left it in one of
the states asked for (a bounded loop: each retry follows a write that succeeded)."""


class DynamoSessionStore:
    """Sessions, one item per slot: the keys, ``id``, ``state`` and ``version`` (what the
    conditions test), the session's command as JSON in ``command`` and the rest of it as JSON in
    ``doc``: the command, the one large field, never changes, so an update re-sends only the small
    rest (DynamoDB's 400 KB holds the largest command, not two copies of it in one request). A new
    session of a slot is a put on the
    condition that no item is there or that its state is over; every later write is a put on the
    condition that the item is still that session, in one of the states asked for, at the version
    read (an UpdateItem: whoever may change sessions need not be allowed to make them). Reads are
    strongly consistent."""

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    @staticmethod
    def _key(run_id: str, slot: int) -> dict[str, Any]:
        return {RUN_ID: {"S": run_id}, SLOT: {"N": str(slot)}}

    def _item(self, session: Session, version: int) -> dict[str, Any]:
        return {
            **self._key(session.run_id, session.slot),
            "id": {"S": session.id},
            "state": {"S": str(session.state)},
            "version": {"N": str(version)},
            **_halves(session),
        }

    def _read(self, run_id: str, slot: int, what: str) -> dict[str, Any] | None:
        try:
            found = self.client.get_item(TableName=self.table, Key=self._key(run_id, slot), ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, what) from e
        item: dict[str, Any] | None = found.get("Item")
        return item

    def create(self, session: Session) -> Session:
        over = {f":o{i}": {"S": str(state)} for i, state in enumerate(sorted(OVER))}
        try:
            self.client.put_item(
                TableName=self.table,
                Item=self._item(session, 1),
                ConditionExpression=f"attribute_not_exists(#r) OR #st IN ({', '.join(over)})",
                ExpressionAttributeNames={"#r": RUN_ID, "#st": "state"},
                ExpressionAttributeValues=over,
            )
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise translate(e, "store session") from e
            held = _session(self._read(session.run_id, session.slot, "read session"), session.run_id)
            what = f"slot {session.slot} of run {session.run_id} holds "
            if held is None:
                raise Conflict(what + "a session") from e
            raise Conflict(what + f"session {held.id}", session=held) from e
        except BotoCoreError as e:
            raise translate(e, "store session") from e
        return session

    def get(self, session_id: str) -> Session:
        run_id, slot = session_slot(session_id)
        found = _session(self._read(run_id, slot, "read session"), run_id)
        if found is None or found.id != session_id:
            raise NotFound(f"session {session_id} not found")
        return found

    def update(self, session: Session, states: frozenset[SessionState], changes: Mapping[str, Any]) -> Session:
        check_session_changes(changes)
        for _ in range(_LOST_RACES):
            item = self._read(session.run_id, session.slot, "read session")
            current = _session(item, session.run_id)
            if item is None or current is None or current.id != session.id:
                raise NotFound(f"session {session.id} not found")
            if current.state not in states:
                raise ConditionFailed(f"session {session.id} is {current.state}", session=current)
            version = _version(item)
            data = _data(item)  # as stored: fields this release does not know are written back
            data.update({field: jsonable(value) for field, value in changes.items()})
            new = record(Session, data)
            doc = _halves(new)["doc"]
            try:
                # an update, never a put: the workers may change a session, not make one (template.yaml)
                self.client.update_item(
                    TableName=self.table,
                    Key=self._key(session.run_id, session.slot),
                    UpdateExpression="SET #st = :new, #v = :next, #doc = :doc",
                    ConditionExpression="#id = :id AND #st = :st AND "
                    + ("attribute_not_exists(#v)" if version == 0 else "#v = :v"),
                    ExpressionAttributeNames={"#id": "id", "#st": "state", "#v": "version", "#doc": "doc"},
                    ExpressionAttributeValues={
                        ":id": {"S": session.id},
                        ":st": {"S": str(current.state)},
                        ":new": {"S": str(new.state)},
                        ":next": {"N": str(version + 1)},
                        ":doc": doc,
                        **({} if version == 0 else {":v": {"N": str(version)}}),
                    },
                )
            except ClientError as e:
                if error_code(e) != "ConditionalCheckFailedException":
                    raise translate(e, "update session") from e
                continue  # written meanwhile: read it again and decide on what is there now
            except BotoCoreError as e:
                raise translate(e, "update session") from e
            return new
        raise ConditionFailed(f"session {session.id} kept changing; try again")

    def forget(self, run_id: str) -> int:
        """The run's items by their keys alone (a Query of the partition), each deleted."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#r = :r",
            "ProjectionExpression": "#r, #s",
            "ExpressionAttributeNames": {"#r": RUN_ID, "#s": SLOT},
            "ExpressionAttributeValues": {":r": {"S": run_id}},
            "ConsistentRead": True,
        }
        keys: builtins.list[dict[str, Any]] = []
        try:
            while True:
                page = self.client.query(**kwargs)
                keys.extend(page.get("Items", []))
                if "LastEvaluatedKey" not in page:
                    break
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            for item in keys:
                self.client.delete_item(TableName=self.table, Key={RUN_ID: item[RUN_ID], SLOT: item[SLOT]})
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "delete sessions") from e
        return len(keys)

    def for_run(self, run_id: str) -> builtins.list[Session]:
        """One Query of the run's partition (DynamoDB keeps it sorted by slot), page by page."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#r = :r",
            "ExpressionAttributeNames": {"#r": RUN_ID},
            "ExpressionAttributeValues": {":r": {"S": run_id}},
            "ConsistentRead": True,
        }
        found: builtins.list[Session] = []
        while True:
            try:
                page = self.client.query(**kwargs)
            except (ClientError, BotoCoreError) as e:
                raise translate(e, "list sessions") from e
            found.extend(s for s in (_session(item, run_id) for item in page.get("Items", [])) if s is not None)
            if "LastEvaluatedKey" not in page:
                return found
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _halves(session: Session) -> dict[str, Any]:
    """The ``doc`` and ``command`` attributes of ``session`` (as ``written``)."""
    data = jsonable(session)
    command = data.pop("command", None)
    halves = {"doc": {"S": _json(data)}}
    return halves if command is None else {**halves, "command": {"S": _json(command)}}


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _data(item: Mapping[str, Any]) -> dict[str, Any]:
    """The session's fields an item holds (``_halves`` put together again). Raises KeyError,
    ValueError or TypeError when it holds none."""
    data = json.loads(item["doc"]["S"])
    if not isinstance(data, dict):
        raise TypeError("not a session")
    if "command" in item:
        data["command"] = json.loads(item["command"]["S"])
    return data


def _session(item: Mapping[str, Any] | None, run_id: str) -> Session | None:
    if item is None:
        return None
    try:
        data: dict[str, Any] | str = _data(item)
    except (KeyError, ValueError, TypeError):
        data = "not a session"
    return readable(data, f"a slot of run {run_id}")


def _version(item: Mapping[str, Any]) -> int:
    try:
        return int(item["version"]["N"])
    except (KeyError, ValueError, TypeError):
        return 0
