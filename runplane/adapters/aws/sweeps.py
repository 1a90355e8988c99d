"""Sweep records in the runs table, out of the way of runs.

A sweep is one item keyed by its id (``s-…``: never a run's) with ``kind`` = ``sweep`` and its
record as JSON in ``data``. Two of the runs table's indexes serve it under keys no run can have:
``by_owner`` under ``sweeps#{owner}`` (a user's sweeps, newest first) and ``by_queue_state``
under ``sweeps#open`` while it has not finished (the sweeps the dispatcher moves on). It has no
``rank``, so it is never in a pool's line.
"""

from __future__ import annotations

import builtins
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.dynamodb import BY_OWNER, BY_QUEUE_STATE, document, key_cursor, start_key, translate
from runplane.adapters.records import written_json
from runplane.domain.errors import AlreadyExists, ConditionFailed, NotFound, PayloadTooLarge
from runplane.domain.sweeps import Sweep

KIND = "sweep"
OPEN = "sweeps#open"
MAX_SWEEP_BYTES = 350 * 1024
"""The largest sweep record (DynamoDB holds 400 KB an item)."""


def owner_key(owner: str) -> str:
    return f"sweeps#{owner}"


class DynamoSweepStore:
    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    def _item(self, sweep: Sweep) -> dict[str, Any]:
        data = written_json(sweep)
        if len(data.encode()) > MAX_SWEEP_BYTES:
            raise PayloadTooLarge(f"the sweep's record would be {len(data.encode())} bytes; at most {MAX_SWEEP_BYTES}")
        item = {
            "id": {"S": sweep.id},
            "kind": {"S": KIND},
            "owner": {"S": owner_key(sweep.owner)},
            "created_at": {"N": repr(sweep.created_at)},
            "version": {"N": str(sweep.version)},
            "data": {"S": data},
        }
        if sweep.finished_at is None:
            item["qs"] = {"S": OPEN}
        return item

    @staticmethod
    def _sweep(item: dict[str, Any]) -> Sweep:
        return document(Sweep, item, "data")

    def create(self, sweep: Sweep) -> Sweep:
        stored = sweep.model_copy(update={"version": 1})
        try:
            self.client.put_item(
                TableName=self.table, Item=self._item(stored), ConditionExpression="attribute_not_exists(id)"
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                raise AlreadyExists(f"sweep {sweep.id} exists", sweep=self.get(sweep.id)) from e
            raise translate(e, "store sweep") from e
        except BotoCoreError as e:
            raise translate(e, "store sweep") from e
        return stored

    def get(self, sweep_id: str) -> Sweep:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"id": {"S": sweep_id}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read sweep") from e
        item = resp.get("Item")
        if item is None or item.get("kind", {}).get("S") != KIND:
            raise NotFound(f"sweep {sweep_id} not found")
        return self._sweep(item)

    def save(self, sweep: Sweep) -> Sweep:
        stored = sweep.model_copy(update={"version": sweep.version + 1})
        try:
            self.client.put_item(
                TableName=self.table,
                Item=self._item(stored),
                ConditionExpression="#k = :k AND #v = :v",
                ExpressionAttributeNames={"#k": "kind", "#v": "version"},
                ExpressionAttributeValues={":k": {"S": KIND}, ":v": {"N": str(sweep.version)}},
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                current = self.get(sweep.id)
                raise ConditionFailed(f"sweep {sweep.id} changed (version {current.version})", sweep=current) from e
            raise translate(e, "save sweep") from e
        except BotoCoreError as e:
            raise translate(e, "save sweep") from e
        return stored

    def list(self, owner: str, limit: int = 50, cursor: str | None = None) -> tuple[builtins.list[Sweep], str | None]:
        key = owner_key(owner)
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": BY_OWNER,
            "KeyConditionExpression": "#k = :k",
            "ExpressionAttributeNames": {"#k": "owner"},
            "ExpressionAttributeValues": {":k": {"S": key}},
            "ScanIndexForward": False,
            "Limit": max(1, limit),
        }
        if cursor:
            kwargs["ExclusiveStartKey"] = start_key(cursor, "owner", key)
        try:
            resp = self.client.query(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "list sweeps") from e
        sweeps = [self._sweep(item) for item in resp.get("Items", [])]
        last = resp.get("LastEvaluatedKey")
        if not last or not sweeps:
            return sweeps, None
        return sweeps, key_cursor({"id": last["id"], "owner": last["owner"], "created_at": last["created_at"]})

    def cursor_after(self, sweep: Sweep) -> str:
        key = {
            "id": {"S": sweep.id},
            "owner": {"S": owner_key(sweep.owner)},
            "created_at": {"N": repr(sweep.created_at)},
        }
        return key_cursor(key)

    def unfinished(self, limit: int = 100, after: tuple[float, str] | None = None) -> builtins.list[Sweep]:
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": BY_QUEUE_STATE,
            "KeyConditionExpression": "qs = :k",
            "ExpressionAttributeValues": {":k": {"S": OPEN}},
            "ScanIndexForward": True,
            "Limit": max(1, limit),
        }
        if after is not None:  # a position in the index: the sweep there may have finished since
            created_at, sweep_id = after
            kwargs["ExclusiveStartKey"] = {
                "id": {"S": sweep_id},
                "qs": {"S": OPEN},
                "created_at": {"N": repr(created_at)},
            }
        try:
            resp = self.client.query(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "list unfinished sweeps") from e
        # the index may lag a moment: a sweep just finished may still show (moving it on is a no-op)
        return [self._sweep(item) for item in resp.get("Items", [])]


def is_sweep(item: dict[str, Any]) -> bool:
    """Whether a runs-table item is a sweep's (a run read must never take it for a run)."""
    return bool(item.get("kind", {}).get("S") == KIND)


__all__ = ["DynamoSweepStore", "is_sweep"]
