"""DynamoDB pool records: the dispatcher's state of each pool."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.dynamodb import document, put_versioned, translate
from runplane.adapters.records import written_json
from runplane.domain.errors import ConditionFailed
from runplane.domain.workers import PoolRecord


class DynamoPoolStateStore:
    """The dispatcher's per-pool records: one item per pool, the document as JSON, written only
    when the stored ``version`` is the one the writer read."""

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    def get(self, pool: str) -> PoolRecord:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"pool": {"S": pool}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read pool record") from e
        item = resp.get("Item")
        if not item:
            return PoolRecord(pool=pool)
        return document(PoolRecord, item)

    def save(self, record: PoolRecord) -> PoolRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        item = {
            "pool": {"S": record.pool},
            "version": {"N": str(stored.version)},
            "doc": {"S": written_json(stored)},
        }
        changed = ConditionFailed(
            f"pool {record.pool}: record changed since version {record.version}", pool=record.pool
        )
        put_versioned(self.client, self.table, item, record.version, changed, "write pool record")
        return stored
