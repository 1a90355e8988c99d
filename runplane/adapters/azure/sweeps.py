"""Sweep records in the runs table, in partitions no run uses.

====================  ===============================  ==============================================
PartitionKey          RowKey                           entity
====================  ===============================  ==============================================
``sweeps``            ``sw:{id}``                      the sweep: its record as JSON, replaced with its ETag
``sweeps``            ``open:{created}:{id}``          exists exactly while the sweep has not finished
``so:{owner}``        ``{newest}:{id}``                the owner's index (written before the sweep, never changed)
====================  ===============================  ==============================================

The record and its ``open:`` marker share a partition, so one transaction writes both: the
unfinished sweeps are a range scan that is exact at all times.
"""

from __future__ import annotations

import builtins
import itertools
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError
from azure.data.tables import TableClient, TableErrorCode, TableTransactionError, UpdateMode

from runplane.adapters.azure.errors import error_code
from runplane.adapters.azure.tables import (
    document,
    failure,
    get_entity,
    key,
    newest_first,
    packed,
    row_after,
    row_cursor,
)
from runplane.domain.errors import AlreadyExists, ConditionFailed, NotFound
from runplane.domain.sweeps import Sweep

PARTITION = "sweeps"


def _open_key(sweep: Sweep) -> str:
    return _marker(sweep.created_at, sweep.id)


def _marker(created_at: float, sweep_id: str) -> str:
    return f"open:{created_at:017.6f}:{key(sweep_id)}"


def _owner_cursor(owner: str) -> str:
    return f"sweeps#{owner}"


class TableSweepStore:
    def __init__(self, table: TableClient) -> None:
        self.table = table

    def _entity(self, sweep: Sweep) -> dict[str, Any]:
        return {
            "PartitionKey": PARTITION,
            "RowKey": f"sw:{key(sweep.id)}",
            "owner": sweep.owner,
            **packed(sweep, f"sweep {sweep.id}"),
        }

    def _read(self, sweep_id: str) -> tuple[Sweep, str]:
        entity = get_entity(self.table, PARTITION, f"sw:{key(sweep_id)}", "read sweep")
        if entity is None:
            raise NotFound(f"sweep {sweep_id} not found")
        return document(Sweep, entity), str(entity.metadata["etag"])

    def create(self, sweep: Sweep) -> Sweep:
        stored = sweep.model_copy(update={"version": 1})
        entity = self._entity(stored)  # PayloadTooLarge before anything is written
        marker = {"PartitionKey": PARTITION, "RowKey": _open_key(stored)}
        try:
            self.table.upsert_entity(
                {
                    "PartitionKey": f"so:{key(sweep.owner)}",
                    "RowKey": f"{newest_first(sweep.created_at)}:{key(sweep.id)}",
                }
            )
            operations: list[Any] = [("create", entity)]
            if stored.finished_at is None:
                operations.append(("upsert", marker, {"mode": UpdateMode.REPLACE}))
            self.table.submit_transaction(operations)
        except TableTransactionError as e:
            if error_code(e) == TableErrorCode.ENTITY_ALREADY_EXISTS:
                raise AlreadyExists(f"sweep {sweep.id} exists", sweep=self._read(sweep.id)[0]) from e
            raise failure(e, "store sweep") from e
        except AzureError as e:
            raise failure(e, "store sweep") from e
        return stored

    def get(self, sweep_id: str) -> Sweep:
        return self._read(sweep_id)[0]

    def save(self, sweep: Sweep) -> Sweep:
        current, etag = self._read(sweep.id)
        if current.version != sweep.version:
            raise ConditionFailed(f"sweep {sweep.id} changed (version {current.version})", sweep=current)
        stored = sweep.model_copy(update={"version": sweep.version + 1})
        operations: list[Any] = [
            (
                "update",
                self._entity(stored),
                {"mode": UpdateMode.REPLACE, "etag": etag, "match_condition": MatchConditions.IfNotModified},
            )
        ]
        marker = {"PartitionKey": PARTITION, "RowKey": _open_key(stored)}
        if stored.finished_at is None:
            operations.append(("upsert", marker, {"mode": UpdateMode.REPLACE}))
        elif current.finished_at is None:
            operations.append(("delete", marker))
        try:
            self.table.submit_transaction(operations)
        except TableTransactionError as e:
            if error_code(e) == TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED:
                current = self.get(sweep.id)
                raise ConditionFailed(f"sweep {sweep.id} changed (version {current.version})", sweep=current) from e
            raise failure(e, "save sweep") from e
        except AzureError as e:
            raise failure(e, "save sweep") from e
        return stored

    def list(self, owner: str, limit: int = 50, cursor: str | None = None) -> tuple[builtins.list[Sweep], str | None]:
        after = row_after(cursor, "", _owner_cursor(owner)) if cursor else ""
        pointers = self.table.query_entities(
            "PartitionKey eq @pk and RowKey gt @after",
            parameters={"pk": f"so:{key(owner)}", "after": after},
            results_per_page=min(max(limit, 1), 1000),
            select=["RowKey"],
        )
        sweeps: builtins.list[Sweep] = []
        try:
            for entity in pointers:
                row = str(entity["RowKey"])
                found = get_entity(self.table, PARTITION, f"sw:{row.partition(':')[2]}", "list sweeps")
                if found is not None:  # else the pointer of a create that failed half-way
                    sweep = document(Sweep, found)
                    if sweep.owner == owner:
                        sweeps.append(sweep)
                if len(sweeps) == max(limit, 1):
                    return sweeps, row_cursor(row, _owner_cursor(owner))
        except AzureError as e:
            raise failure(e, "list sweeps") from e
        return sweeps, None

    def cursor_after(self, sweep: Sweep) -> str:
        return row_cursor(f"{newest_first(sweep.created_at)}:{key(sweep.id)}", _owner_cursor(sweep.owner))

    def unfinished(self, limit: int = 100, after: tuple[float, str] | None = None) -> builtins.list[Sweep]:
        start = _marker(*after) if after is not None else "open:"
        markers = self.table.query_entities(
            "PartitionKey eq @pk and RowKey gt @after and RowKey lt @before",
            parameters={"pk": PARTITION, "after": start, "before": "open;"},
            results_per_page=min(max(limit, 1), 1000),
            select=["RowKey"],
        )
        sweeps: builtins.list[Sweep] = []
        try:
            for entity in itertools.islice(markers, max(limit, 1)):
                escaped = str(entity["RowKey"]).rsplit(":", 1)[1]
                found = get_entity(self.table, PARTITION, f"sw:{escaped}", "list unfinished sweeps")
                if found is not None:
                    sweeps.append(document(Sweep, found))
        except AzureError as e:
            raise failure(e, "list unfinished sweeps") from e
        return sweeps
