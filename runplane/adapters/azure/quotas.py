"""Table storage quotas, usage records and fair-share lanes."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient, UpdateMode

from runplane.adapters.azure.tables import (
    failure,
    get_entity,
    key,
    packed,
    select,
    unkey,
    unpack,
    version_of,
    write_versioned,
)
from runplane.adapters.records import record_or_none, subject_order, versioned, written_json
from runplane.domain.errors import ConditionFailed
from runplane.domain.quotas import Lane, Quota, QuotaKind, UsageRecord, quota_key


class TableQuotaStore:
    """Quotas and usage records in one table: PartitionKey ``quota`` or ``usage``, RowKey the
    escaped ``user:alice`` / ``group:vision``, the document as JSON; and lanes, PartitionKey
    ``lane``, RowKey ``{pool}:{priority}:{user}`` (pool and user escaped). Usage records and lanes
    are written only while their stored ``version`` is the one the writer read: created only if
    absent, replaced only with the ETag read along with that version, so of two racing writers one
    fails."""

    QUOTA, USAGE, LANE = "quota", "usage", "lane"

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def _query(self, partition: str, what: str) -> list[Any]:
        return select(self.table, "PartitionKey eq @pk", {"pk": partition}, what)

    def get(self, kind: QuotaKind, name: str) -> Quota | None:
        subject = quota_key(kind, name)
        return _quota(get_entity(self.table, self.QUOTA, key(subject), "read quota"), subject)

    def put(self, quota: Quota) -> None:
        entity = {"PartitionKey": self.QUOTA, "RowKey": key(quota.key), "doc": written_json(quota)}
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise failure(e, "store quota") from e

    def delete(self, kind: QuotaKind, name: str) -> bool:
        row = key(quota_key(kind, name))
        if get_entity(self.table, self.QUOTA, row, "delete quota") is None:
            return False
        try:
            self.table.delete_entity(self.QUOTA, row)  # quiet when another delete came first
        except AzureError as e:
            raise failure(e, "delete quota") from e
        return True

    def list(self) -> list[Quota]:
        found = (_quota(e, unkey(str(e["RowKey"]))) for e in self._query(self.QUOTA, "list quotas"))
        return sorted((q for q in found if q is not None), key=subject_order)

    def _read_usage(self, kind: QuotaKind, name: str) -> tuple[UsageRecord, str]:
        """The record and its ETag ("" when none is stored)."""
        entity = get_entity(self.table, self.USAGE, key(quota_key(kind, name)), "read usage")
        if entity is None:
            return UsageRecord(kind=kind, name=name), ""
        return _usage(entity, kind, name), str(entity.metadata["etag"])

    def usage(self, kind: QuotaKind, name: str) -> UsageRecord:
        return self._read_usage(kind, name)[0]

    def save_usage(self, record: UsageRecord) -> UsageRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        entity = {
            "PartitionKey": self.USAGE,
            "RowKey": key(record.key),
            "version": stored.version,
            **packed(stored, f"usage of {record.key}"),
        }
        changed = ConditionFailed(f"usage of {record.key}: changed since version {record.version}", key=record.key)
        current, etag = self._read_usage(record.kind, record.name)
        if current.version != record.version:
            raise changed
        write_versioned(self.table, entity, etag, changed, "write usage")
        return stored

    def _read_lane(self, pool: str, user: str, priority: int) -> tuple[Lane, str]:
        """The lane and its ETag ("" when none is stored)."""
        entity = get_entity(self.table, self.LANE, _lane_key(pool, user, priority), "read lane")
        if entity is None:
            return Lane(pool=pool, user=user, priority=priority), ""
        return _lane(entity, pool, user, priority), str(entity.metadata["etag"])

    def lane(self, pool: str, user: str, priority: int) -> Lane:
        return self._read_lane(pool, user, priority)[0]

    def save_lane(self, lane: Lane) -> Lane:
        stored = lane.model_copy(update={"version": lane.version + 1})
        what = f"lane {lane.pool}/{lane.priority}/{lane.user}"
        entity = {
            "PartitionKey": self.LANE,
            "RowKey": _lane_key(lane.pool, lane.user, lane.priority),
            "version": stored.version,
            **packed(stored, what),
        }
        subject = f"{lane.pool}:{lane.priority}:{lane.user}"
        changed = ConditionFailed(f"{what}: changed since version {lane.version}", key=subject)
        current, etag = self._read_lane(lane.pool, lane.user, lane.priority)
        if current.version != lane.version:
            raise changed
        write_versioned(self.table, entity, etag, changed, "write lane")
        return stored

    def list_usage(self) -> builtins.list[UsageRecord]:  # ``list`` here is the method above
        records = []
        for entity in self._query(self.USAGE, "list usage"):
            kind, _, name = unkey(str(entity["RowKey"])).partition(":")
            if kind in ("user", "group"):
                records.append(_usage(entity, kind, name))  # type: ignore[arg-type]
        return sorted(records, key=subject_order)


def _lane_key(pool: str, user: str, priority: int) -> str:
    return f"{key(pool)}:{priority}:{key(user)}"


def _quota(entity: Mapping[str, Any] | None, subject: str) -> Quota | None:
    """The quota of an entity; None for none, or for one that does not hold a valid quota of
    ``subject``."""
    quota = record_or_none(Quota, str(entity["doc"]) if entity and "doc" in entity else None)
    return quota if quota is not None and quota.key == subject else None


def _lane(entity: Mapping[str, Any], pool: str, user: str, priority: int) -> Lane:
    """The lane of an entity. One that does not hold a valid lane of ``pool``, ``user`` and
    ``priority`` reads as a fresh lane at the stored version (0 when it has none), so the next
    write replaces it."""
    fresh = Lane(pool=pool, user=user, priority=priority)
    return versioned(
        fresh, version_of(entity), lambda: unpack(entity), lambda lane: (lane.pool, lane.user, lane.priority)
    )


def _usage(entity: Mapping[str, Any], kind: QuotaKind, name: str) -> UsageRecord:
    """The usage record of an entity. One that does not hold a valid record of ``kind`` ``name``
    reads as a fresh record at the stored version (0 when it has none), so the next write
    replaces it."""
    fresh = UsageRecord(kind=kind, name=name)
    return versioned(fresh, version_of(entity), lambda: unpack(entity), lambda usage: usage.key)
