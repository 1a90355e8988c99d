"""Table storage pool records: the dispatcher's state of each pool."""

from __future__ import annotations

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError
from azure.data.tables import TableClient, UpdateMode

from runplane.adapters.azure.tables import failure, get_entity, key, pack, unpack
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
        return PoolRecord.model_validate(unpack(entity)), str(entity.metadata["etag"])

    def get(self, pool: str) -> PoolRecord:
        return self._read(pool)[0] or PoolRecord(pool=pool)

    def save(self, record: PoolRecord) -> PoolRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        entity = {
            "PartitionKey": self.PARTITION,
            "RowKey": key(record.pool),
            "version": stored.version,
            **pack(stored.model_dump(mode="json"), f"pool record {record.pool}"),
        }
        changed = ConditionFailed(
            f"pool {record.pool}: record changed since version {record.version}", pool=record.pool
        )
        current, etag = self._read(record.pool)
        if current is not None and current.version != record.version:
            raise changed
        try:
            if current is None:
                self.table.create_entity(entity)
            else:
                self.table.update_entity(
                    entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
                )
        except (ResourceExistsError, ResourceModifiedError) as e:
            # written since our read: every write bumps the version, so ours is stale
            raise changed from e
        except AzureError as e:
            raise failure(e, "write pool record") from e
        return stored
