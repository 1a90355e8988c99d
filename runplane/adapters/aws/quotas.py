"""DynamoDB quotas, usage records and fair-share lanes."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.dynamodb import put_versioned, scan, translate, version_of
from runplane.adapters.records import record_or_none, subject_order, versioned, written_json
from runplane.domain.errors import ConditionFailed
from runplane.domain.quotas import Lane, Quota, QuotaKind, UsageRecord, quota_key


class DynamoQuotaStore:
    """Quotas and usage records in one table keyed by ``id``: ``quota#user:alice`` holds alice's
    quota, ``usage#user:alice`` what she holds and has used, ``lane#gpu#50#alice`` her place in the
    fair share of pool gpu at priority 50; each document as JSON. Usage records and lanes are written only while
    their stored ``version`` is the one the writer read."""

    QUOTA, USAGE, LANE = "quota#", "usage#", "lane#"

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    def _read(self, item_id: str, what: str) -> dict[str, Any] | None:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"id": {"S": item_id}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, what) from e
        item: dict[str, Any] | None = resp.get("Item")
        return item

    def _scan(self, prefix: str, what: str) -> list[dict[str, Any]]:
        return scan(
            self.client,
            self.table,
            what,
            FilterExpression="begins_with(#id, :p)",
            ExpressionAttributeNames={"#id": "id"},
            ExpressionAttributeValues={":p": {"S": prefix}},
        )

    def get(self, kind: QuotaKind, name: str) -> Quota | None:
        key = quota_key(kind, name)
        return _quota(self._read(self.QUOTA + key, "read quota"), key)

    def put(self, quota: Quota) -> None:
        item = {"id": {"S": self.QUOTA + quota.key}, "doc": {"S": written_json(quota)}}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "store quota") from e

    def delete(self, kind: QuotaKind, name: str) -> bool:
        try:
            resp = self.client.delete_item(
                TableName=self.table, Key={"id": {"S": self.QUOTA + quota_key(kind, name)}}, ReturnValues="ALL_OLD"
            )
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "delete quota") from e
        return bool(resp.get("Attributes"))

    def list(self) -> list[Quota]:
        items = self._scan(self.QUOTA, "list quotas")
        found = (_quota(item, item["id"]["S"].removeprefix(self.QUOTA)) for item in items)
        return sorted((q for q in found if q is not None), key=subject_order)

    def usage(self, kind: QuotaKind, name: str) -> UsageRecord:
        key = quota_key(kind, name)
        return _usage(self._read(self.USAGE + key, "read usage"), kind, name)

    def save_usage(self, record: UsageRecord) -> UsageRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        self._put_versioned(self.USAGE + record.key, record.version, written_json(stored), f"usage of {record.key}")
        return stored

    def _put_versioned(self, item_id: str, version: int, doc: str, what: str) -> None:
        """Put ``doc`` at ``version`` + 1 if the stored version is ``version`` (0: none stored, or an
        item without one). Raises ConditionFailed when it is not."""
        item = {"id": {"S": item_id}, "version": {"N": str(version + 1)}, "doc": {"S": doc}}
        changed = ConditionFailed(f"{what}: changed since version {version}", key=item_id.partition("#")[2])
        put_versioned(self.client, self.table, item, version, changed, f"write {what}")

    def lane(self, pool: str, user: str, priority: int) -> Lane:
        item = self._read(f"{self.LANE}{pool}#{priority}#{user}", "read lane")
        return _lane(item, pool, user, priority)

    def save_lane(self, lane: Lane) -> Lane:
        stored = lane.model_copy(update={"version": lane.version + 1})
        item_id = f"{self.LANE}{lane.pool}#{lane.priority}#{lane.user}"
        what = f"lane {lane.pool}/{lane.priority}/{lane.user}"
        self._put_versioned(item_id, lane.version, written_json(stored), what)
        return stored

    def list_usage(self) -> builtins.list[UsageRecord]:  # ``list`` here is the method above
        records = []
        for item in self._scan(self.USAGE, "list usage"):
            kind, _, name = item["id"]["S"].removeprefix(self.USAGE).partition(":")
            if kind in ("user", "group"):
                records.append(_usage(item, kind, name))
        return sorted(records, key=subject_order)


def _quota(item: Mapping[str, Any] | None, key: str) -> Quota | None:
    """The quota of an item; None for none, or for an item that does not hold a valid quota of
    ``key``."""
    quota = record_or_none(Quota, item["doc"]["S"] if item and "doc" in item else None)
    return quota if quota is not None and quota.key == key else None


def _lane(item: Mapping[str, Any] | None, pool: str, user: str, priority: int) -> Lane:
    """The lane of an item. None, or an item that does not hold a valid lane of ``pool``,
    ``user`` and ``priority``, reads as a fresh lane at the stored version, so the next write
    replaces it."""
    fresh = Lane(pool=pool, user=user, priority=priority)
    return versioned(fresh, version_of(item), lambda: _doc(item), lambda lane: (lane.pool, lane.user, lane.priority))


def _usage(item: Mapping[str, Any] | None, kind: QuotaKind, name: str) -> UsageRecord:
    """The usage record of an item. None, or an item that does not hold a valid record of
    ``kind`` ``name``, reads as a fresh record at the stored version, so the next write replaces it."""
    return versioned(UsageRecord(kind=kind, name=name), version_of(item), lambda: _doc(item), lambda usage: usage.key)


def _doc(item: Mapping[str, Any] | None) -> str:
    """The document of an item (KeyError when it has none)."""
    return str(item["doc"]["S"]) if item else ""
