"""SQLite quotas, usage records and fair-share lanes."""

from __future__ import annotations

import builtins

from runplane.adapters.local.db import Database
from runplane.adapters.local.versioned import put_versioned, read_versioned
from runplane.adapters.records import record_or_none, subject_order, versioned, written_json
from runplane.domain.errors import ConditionFailed
from runplane.domain.quotas import Lane, Quota, QuotaKind, UsageRecord, quota_key

DDL = """
CREATE TABLE IF NOT EXISTS quotas (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    version INTEGER,
    data TEXT NOT NULL,
    PRIMARY KEY (kind, key)
)
"""


class SqliteQuotaStore:
    """Quotas, usage records and lanes in one table keyed by (``kind``, ``key``): (``quota``,
    ``user:alice``) holds alice's quota, (``usage``, ``user:alice``) what she holds and has used,
    (``lane``, ``gpu#50#alice``) her place in the fair share of pool gpu at priority 50; each record
    as JSON. Usage records and lanes are written only while their stored ``version`` is the one the
    writer read."""

    QUOTA, USAGE, LANE = "quota", "usage", "lane"

    def __init__(self, db: Database) -> None:
        self.db = db
        db.ensure(DDL)

    def _read(self, kind: str, key: str, what: str) -> tuple[int | None, str]:
        with self.db.errors(what):
            return read_versioned(self.db, "quotas", "kind = ? AND key = ?", (kind, key))

    def _all(self, kind: str, what: str) -> builtins.list[tuple[str, int | None, str]]:
        with self.db.errors(what):
            query = "SELECT key, version, data FROM quotas WHERE kind = ?"
            found = self.db.connection().execute(query, (kind,)).fetchall()
        return [(key, version if isinstance(version, int) else None, data) for key, version, data in found]

    def get(self, kind: QuotaKind, name: str) -> Quota | None:
        key = quota_key(kind, name)
        return _quota(self._read(self.QUOTA, key, "read quota")[1], key)

    def put(self, quota: Quota) -> None:
        with self.db.errors("store quota"), self.db.write() as c:
            c.execute(
                "INSERT OR REPLACE INTO quotas (kind, key, version, data) VALUES (?, ?, NULL, ?)",
                (self.QUOTA, quota.key, written_json(quota)),
            )

    def delete(self, kind: QuotaKind, name: str) -> bool:
        with self.db.errors("delete quota"), self.db.write() as c:
            gone = c.execute("DELETE FROM quotas WHERE kind = ? AND key = ?", (self.QUOTA, quota_key(kind, name)))
            return gone.rowcount > 0

    def list(self) -> builtins.list[Quota]:
        found = (_quota(data, key) for key, _, data in self._all(self.QUOTA, "list quotas"))
        return sorted((q for q in found if q is not None), key=subject_order)

    def usage(self, kind: QuotaKind, name: str) -> UsageRecord:
        version, data = self._read(self.USAGE, quota_key(kind, name), "read usage")
        return _usage(version, data, kind, name)

    def save_usage(self, record: UsageRecord) -> UsageRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        self._put_versioned(self.USAGE, record.key, record.version, written_json(stored), f"usage of {record.key}")
        return stored

    def lane(self, pool: str, user: str, priority: int) -> Lane:
        version, data = self._read(self.LANE, f"{pool}#{priority}#{user}", "read lane")
        fresh = Lane(pool=pool, user=user, priority=priority)
        return versioned(fresh, version, lambda: data, lambda lane: (lane.pool, lane.user, lane.priority))

    def save_lane(self, lane: Lane) -> Lane:
        stored = lane.model_copy(update={"version": lane.version + 1})
        what = f"lane {lane.pool}/{lane.priority}/{lane.user}"
        self._put_versioned(
            self.LANE, f"{lane.pool}#{lane.priority}#{lane.user}", lane.version, written_json(stored), what
        )
        return stored

    def _put_versioned(self, kind: str, key: str, version: int, data: str, what: str) -> None:
        changed = ConditionFailed(f"{what}: changed since version {version}", key=key)
        with self.db.errors(f"write {what}"):
            put_versioned(self.db, "quotas", {"kind": kind, "key": key}, version, data, changed)

    def list_usage(self) -> builtins.list[UsageRecord]:  # ``list`` here is the method above
        records = []
        for key, version, data in self._all(self.USAGE, "list usage"):
            kind, _, name = key.partition(":")
            if kind in ("user", "group"):
                records.append(_usage(version, data, kind, name))  # type: ignore[arg-type]
        return sorted(records, key=subject_order)


def _quota(data: str | None, key: str) -> Quota | None:
    """The quota ``data`` holds; None for none, or for data that is not a valid quota of ``key``."""
    quota = record_or_none(Quota, data or None)
    return quota if quota is not None and quota.key == key else None


def _usage(version: int | None, data: str, kind: QuotaKind, name: str) -> UsageRecord:
    """The usage record stored at ``version``. None, or data that is not a valid record of ``kind``
    ``name``, reads as a fresh record at the stored version, so the next write replaces it."""
    return versioned(UsageRecord(kind=kind, name=name), version, lambda: data, lambda usage: usage.key)
