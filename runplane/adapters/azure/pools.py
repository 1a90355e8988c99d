"""Table storage pool records: the dispatcher's state of each pool."""

from __future__ import annotations

from azure.data.tables import TableClient

from runplane.adapters.azure.tables import document, get_entity, key, packed, write_versioned
from runplane.domain.errors import ConditionFailed
from runplane.domain.workers import PoolRecord


class TablePoolStateStore:
    """The dispatcher's per-pool records, one entity per pool: the document as JSON, written
    only while the stored ``version`` is the one the writer read."""

    PARTITION = "p"

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def _read(self, pool: str) -> tuple[PoolRecord | None, str]:
        entity = get_entity(self.table, self.PARTITION, key(pool), "read pool record")
        if entity is None:
            return None, ""
        return document(PoolRecord, entity), str(entity.metadata["etag"])

    def get(self, pool: str) -> PoolRecord:
        return self._read(pool)[0] or PoolRecord(pool=pool)

    def save(self, record: PoolRecord) -> PoolRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        entity = {
            "PartitionKey": self.PARTITION,
            "RowKey": key(record.pool),
            "version": stored.version,
            **packed(stored, f"pool record {record.pool}"),
        }
        changed = ConditionFailed(
            f"pool {record.pool}: record changed since version {record.version}", pool=record.pool
        )
        current, etag = self._read(record.pool)
        if current is not None and current.version != record.version:
            raise changed
        write_versioned(self.table, entity, etag, changed, "write pool record")
        return stored
