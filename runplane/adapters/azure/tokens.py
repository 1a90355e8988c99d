"""Table storage API tokens, users' records and the stack's own secret."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any

from azure.core.exceptions import AzureError, ResourceExistsError
from azure.data.tables import TableClient, UpdateMode

from runplane.adapters.azure.tables import failure, get_entity, key, select
from runplane.adapters.records import record_or_none, written_json
from runplane.domain.errors import BackendError
from runplane.domain.tenancy import ApiToken, UserRecord


class TableTokenStore:
    """API tokens, one entity per token: PartitionKey the SHA-256 of its secret, the document as
    JSON. The stack's own secret is one more entity, under a key no hash can take."""

    SECRET_KEY = "stack-secret"  # noqa: S105 - a key name, not a secret
    USER_ROW = "user"
    """Users' records (``UserRecord``) are entities under (the user's name, ``user``): tokens' rows are ``""``."""

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def lookup(self, token_hash: str) -> ApiToken | None:
        if token_hash == self.SECRET_KEY:
            return None
        return _token(get_entity(self.table, key(token_hash), "", "read token"))

    def put(self, token_hash: str, token: ApiToken) -> None:
        entity = {"PartitionKey": key(token_hash), "RowKey": "", "id": token.id, "doc": written_json(token)}
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise failure(e, "store token") from e

    def _query(self, query: str, parameters: dict[str, str]) -> list[Any]:
        return select(self.table, query, parameters, "list tokens")

    def list(self) -> list[ApiToken]:
        query = "PartitionKey ne @secret and RowKey eq ''"
        found = [_token(e) for e in self._query(query, {"secret": self.SECRET_KEY})]
        return sorted((t for t in found if t is not None), key=lambda t: (t.created_at, t.id))

    def delete(self, token_id: str) -> bool:
        found = self._query("id eq @id", {"id": token_id})
        for entity in found:
            try:
                self.table.delete_entity(entity["PartitionKey"], entity["RowKey"])
            except AzureError as e:
                raise failure(e, "delete token") from e
        return bool(found)

    def user(self, name: str) -> UserRecord | None:
        entity = get_entity(self.table, key(name), self.USER_ROW, "read user")
        return UserRecord.read(str(entity["user_doc"]) if entity and "user_doc" in entity else None)

    def put_user(self, record: UserRecord) -> None:
        # "user_doc", not "doc": a release that lists tokens reads no token in it
        entity = {"PartitionKey": key(record.user), "RowKey": self.USER_ROW, "user_doc": written_json(record)}
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise failure(e, "store user") from e

    def secret(self) -> bytes:
        for _ in range(2):
            entity = get_entity(self.table, self.SECRET_KEY, "", "read the stack secret")
            if entity is not None:
                return base64.b64decode(entity["secret"])
            made = base64.b64encode(secrets.token_bytes(32)).decode()
            try:
                self.table.create_entity({"PartitionKey": self.SECRET_KEY, "RowKey": "", "secret": made})
            except ResourceExistsError:
                continue  # another instance made it first: read that one
            except AzureError as e:
                raise failure(e, "store the stack secret") from e
        raise BackendError("the stack secret could not be read or made; retry")


def _token(entity: Mapping[str, Any] | None) -> ApiToken | None:
    """The token of an entity; None for none, or for one that does not hold a valid token."""
    return record_or_none(ApiToken, str(entity["doc"]) if entity and "doc" in entity else None)
