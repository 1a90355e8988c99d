"""Table storage worker heartbeats, in one partition; expired records are skipped and removed."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

from runplane.adapters.azure.tables import document, failure, get_entity, key, packed
from runplane.domain.errors import NotFound
from runplane.domain.workers import Worker


class TableWorkerRegistry:
    """Worker heartbeats in one partition. A record not renewed for ``ttl_seconds`` is gone:
    reads skip it and ``list`` deletes it (Table storage has no TTL of its own)."""

    PARTITION = "w"

    def __init__(self, table: TableClient, ttl_seconds: int = 3600, clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.ttl_seconds = ttl_seconds
        self.clock = clock

    def put(self, worker: Worker) -> None:
        entity = {
            "PartitionKey": self.PARTITION,
            "RowKey": key(worker.id),
            "pool": worker.pool,
            "expires_at": self.clock() + self.ttl_seconds,
            **packed(worker, f"worker {worker.id}"),
        }
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise failure(e, "record worker") from e

    def get(self, worker_id: str) -> Worker:
        entity = get_entity(self.table, self.PARTITION, key(worker_id), "read worker")
        if entity is None:
            raise NotFound(f"worker {worker_id} not found")
        if float(entity["expires_at"]) < self.clock():
            raise NotFound(f"worker {worker_id} not found (its record expired)")
        return document(Worker, entity)

    def list(self, pool: str | None = None) -> list[Worker]:
        query, parameters = "PartitionKey eq @pk", {"pk": self.PARTITION}
        if pool is not None:
            query += " and pool eq @pool"
            parameters["pool"] = pool
        now = self.clock()
        workers, expired = [], []
        try:
            for entity in self.table.query_entities(query, parameters=parameters):
                if float(entity["expires_at"]) < now:
                    expired.append(entity)
                else:
                    workers.append(document(Worker, entity))
        except AzureError as e:
            raise failure(e, "list workers") from e
        for entity in expired:
            try:  # unless a heartbeat renewed it since
                self.table.delete_entity(
                    entity, etag=entity.metadata["etag"], match_condition=MatchConditions.IfNotModified
                )
            except (ResourceModifiedError, ResourceNotFoundError):
                pass
            except AzureError as e:
                raise failure(e, "list workers") from e
        return sorted(workers, key=lambda w: w.id)

    def page(self, pool: str | None, limit: int, after: str | None = None) -> tuple[builtins.list[Worker], str | None]:
        """In id order from the one after ``after``; stops reading once ``limit`` + 1 are found.
        A pool's page skips other pools' records on the way: Table storage has no index on it."""
        query, parameters = "PartitionKey eq @pk", {"pk": self.PARTITION}
        if after is not None:
            query += " and RowKey gt @after"
            parameters["after"] = key(after)
        if pool is not None:
            query += " and pool eq @pool"
            parameters["pool"] = pool
        now = self.clock()
        workers: builtins.list[Worker] = []
        try:
            for entity in self.table.query_entities(query, parameters=parameters, results_per_page=limit + 1):
                if float(entity["expires_at"]) >= now:
                    workers.append(document(Worker, entity))
                    if len(workers) > limit:
                        return workers[:limit], workers[limit - 1].id
        except AzureError as e:
            raise failure(e, "list workers") from e
        return workers, None

    def delete(self, worker_id: str) -> None:
        try:
            self.table.delete_entity(self.PARTITION, key(worker_id))
        except AzureError as e:
            raise failure(e, "delete worker") from e
