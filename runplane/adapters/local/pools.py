"""SQLite pool records: the dispatcher's state of each pool."""

from __future__ import annotations

from runplane.adapters.local.db import Database
from runplane.adapters.local.versioned import put_versioned, read_versioned
from runplane.adapters.records import versioned, written_json
from runplane.domain.errors import ConditionFailed
from runplane.domain.workers import PoolRecord

DDL = """
CREATE TABLE IF NOT EXISTS pool_states (
    pool TEXT PRIMARY KEY,
    version INTEGER,
    data TEXT NOT NULL
)
"""


class SqlitePoolStateStore:
    """The dispatcher's per-pool records: one row per pool, the record as JSON, written only while
    the stored ``version`` is the one the writer read."""

    def __init__(self, db: Database) -> None:
        self.db = db
        db.ensure(DDL)

    def get(self, pool: str) -> PoolRecord:
        with self.db.errors("read pool record"):
            version, data = read_versioned(self.db, "pool_states", "pool = ?", (pool,))
        return versioned(PoolRecord(pool=pool), version, lambda: data, lambda record: record.pool)

    def save(self, record: PoolRecord) -> PoolRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        changed = ConditionFailed(
            f"pool {record.pool}: record changed since version {record.version}", pool=record.pool
        )
        with self.db.errors("write pool record"):
            put_versioned(self.db, "pool_states", {"pool": record.pool}, record.version, written_json(stored), changed)
        return stored
