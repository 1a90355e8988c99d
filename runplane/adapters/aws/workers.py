"""DynamoDB worker heartbeats: stale records expire through the table's TTL attribute. The table
holds workers alone: 0.1's functions scan it whole and refuse an item that is no worker, so the
control plane's record for its agents is kept in the object store (``runplane.services.skew``)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.dynamodb import BY_POOL, document, fields, translate
from runplane.adapters.records import written_json
from runplane.domain.errors import NotFound
from runplane.domain.workers import Worker


class DynamoWorkerRegistry:
    """Worker heartbeats; stale records expire through the table's TTL attribute. An item holds
    the keys (``id``, and ``pool`` for the index), ``expires_at`` and the record as one JSON
    document, which a listing reads back in one piece."""

    def __init__(self, table: str, client: Any, ttl_seconds: int = 3600) -> None:
        self.table = table
        self.client = client
        self.ttl_seconds = ttl_seconds

    def put(self, worker: Worker) -> None:
        item = {
            "id": {"S": worker.id},
            "pool": {"S": worker.pool},
            "expires_at": {"N": str(int(time.time()) + self.ttl_seconds)},
            "doc": {"S": written_json(worker)},
        }
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "record worker") from e

    def get(self, worker_id: str) -> Worker:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"id": {"S": worker_id}})
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read worker") from e
        if "pool" not in resp.get("Item", {}):  # none, or no worker (an earlier build's stack record)
            raise NotFound(f"worker {worker_id} not found")
        return _worker(resp["Item"])

    def list(self, pool: str | None = None) -> list[Worker]:
        """Every worker (a scan), or a pool's (one query of the ``by_pool`` index: its cost does not
        grow with the workers of other pools)."""
        kwargs: dict[str, Any] = {"TableName": self.table}
        operation = "scan"
        if pool is not None:
            operation = "query"
            kwargs["IndexName"] = BY_POOL
            kwargs["KeyConditionExpression"] = "#p = :p"
            kwargs["ExpressionAttributeNames"] = {"#p": "pool"}
            kwargs["ExpressionAttributeValues"] = {":p": {"S": pool}}
        workers: list[Worker] = []
        try:
            for page in self.client.get_paginator(operation).paginate(**kwargs):
                workers.extend(_worker(item) for item in page.get("Items", []) if "pool" in item)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "list workers") from e
        return sorted(workers, key=lambda w: w.id)

    def page(self, pool: str | None, limit: int, after: str | None = None) -> tuple[builtins.list[Worker], str | None]:
        """A scan (or, for a pool, a query of ``by_pool``: in id order) that stops at ``limit``."""
        kwargs: dict[str, Any] = {"TableName": self.table, "Limit": limit}
        operation = self.client.scan
        if pool is not None:
            operation = self.client.query
            kwargs["IndexName"] = BY_POOL
            kwargs["KeyConditionExpression"] = "#p = :p"
            kwargs["ExpressionAttributeNames"] = {"#p": "pool"}
            kwargs["ExpressionAttributeValues"] = {":p": {"S": pool}}
        if after is not None:
            kwargs["ExclusiveStartKey"] = {"id": {"S": after}, **({"pool": {"S": pool}} if pool is not None else {})}
        workers: builtins.list[Worker] = []
        try:
            while len(workers) < limit:  # a page may stop short of Limit at 1 MB
                kwargs["Limit"] = limit - len(workers)
                resp = operation(**kwargs)
                workers.extend(_worker(item) for item in resp.get("Items", []) if "pool" in item)
                if "LastEvaluatedKey" not in resp:
                    return workers, None
                kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "list workers") from e
        return workers, workers[-1].id if workers else None

    def delete(self, worker_id: str) -> None:
        try:
            self.client.delete_item(TableName=self.table, Key={"id": {"S": worker_id}})
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "delete worker") from e


def _worker(item: Mapping[str, Any]) -> Worker:
    if "doc" in item:
        return document(Worker, item)
    return fields(Worker, item, "expires_at")  # written with one attribute a field, before the document
