"""Table storage secrets: sealed values only (the key that opens them is in Key Vault, ``keyvault.py``,
or a key file)."""

from __future__ import annotations

import builtins
import itertools
import logging
from typing import Any

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient, UpdateMode

from runplane.adapters.azure.tables import document, failure, get_entity, key, packed
from runplane.domain.secrets import MAX_SECRETS_PER_SCOPE, SecretRecord

log = logging.getLogger(__name__)


class TableSecretStore:
    """One entity per secret: PartitionKey its scope, RowKey its name (both ``key``-escaped), the
    record (its sealed value, never the value) packed as JSON over properties. A scope's secrets
    are one partition, listed by RowKey, which is by name."""

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def put(self, record: SecretRecord) -> SecretRecord:
        entity = {
            "PartitionKey": key(record.scope),
            "RowKey": key(record.name),
            **packed(record, f"secret {record.name}"),
        }
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise failure(e, "store secret") from e
        return record

    def get(self, scope: str, name: str) -> SecretRecord | None:
        return _secret(get_entity(self.table, key(scope), key(name), "read secret"))

    def list(self, scope: str, limit: int = MAX_SECRETS_PER_SCOPE) -> builtins.list[SecretRecord]:
        if limit <= 0:
            return []
        try:
            pages = self.table.query_entities(
                "PartitionKey eq @scope", parameters={"scope": key(scope)}, results_per_page=min(limit, 1000)
            )
            found = list(itertools.islice(pages, limit))
        except AzureError as e:
            raise failure(e, "list secrets") from e
        records = (_secret(entity) for entity in found)
        return sorted((r for r in records if r is not None), key=lambda r: r.name)

    def delete(self, scope: str, name: str) -> bool:
        # Table storage deletes quietly what is not there: read first to answer whether it was
        if get_entity(self.table, key(scope), key(name), "read secret") is None:
            return False
        try:
            self.table.delete_entity(key(scope), key(name))
        except AzureError as e:
            raise failure(e, "delete secret") from e
        return True


def _secret(entity: Any | None) -> SecretRecord | None:
    """The record an entity holds; None for none, or for one that holds no readable record (the
    next ``put`` replaces it)."""
    if entity is None:
        return None
    try:
        return document(SecretRecord, entity)
    except (KeyError, ValueError, TypeError):
        log.warning("secret entity %s/%s holds no readable record", entity.get("PartitionKey"), entity.get("RowKey"))
        return None
