"""SQLite secrets: sealed values only (the key that opens them is a file, ``keyfile.py``)."""

from __future__ import annotations

import builtins

from runplane.adapters.local.db import Database
from runplane.adapters.records import record_or_none, written_json
from runplane.domain.secrets import MAX_SECRETS_PER_SCOPE, SecretRecord

DDL = """
CREATE TABLE IF NOT EXISTS secrets (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (scope, name)
)
"""


class SqliteSecretStore:
    """One row per secret keyed by (``scope``, ``name``), the record (its sealed value, never the
    value) as JSON; a scope's secrets listed by name from the key's own index."""

    def __init__(self, db: Database) -> None:
        self.db = db
        db.ensure(DDL)

    def put(self, record: SecretRecord) -> SecretRecord:
        with self.db.errors("store secret"), self.db.write() as c:
            c.execute(
                "INSERT OR REPLACE INTO secrets (scope, name, data) VALUES (?, ?, ?)",
                (record.scope, record.name, written_json(record)),
            )
        return record

    def get(self, scope: str, name: str) -> SecretRecord | None:
        with self.db.errors("read secret"):
            query = "SELECT data FROM secrets WHERE scope = ? AND name = ?"
            found = self.db.connection().execute(query, (scope, name)).fetchone()
        return record_or_none(SecretRecord, found[0] if found else None)

    def list(self, scope: str, limit: int = MAX_SECRETS_PER_SCOPE) -> builtins.list[SecretRecord]:
        with self.db.errors("list secrets"):
            query = "SELECT data FROM secrets WHERE scope = ? ORDER BY name LIMIT ?"
            found = self.db.connection().execute(query, (scope, max(limit, 0))).fetchall()
        records = (record_or_none(SecretRecord, data) for (data,) in found)
        return [r for r in records if r is not None]

    def delete(self, scope: str, name: str) -> bool:
        with self.db.errors("delete secret"), self.db.write() as c:
            return c.execute("DELETE FROM secrets WHERE scope = ? AND name = ?", (scope, name)).rowcount > 0
