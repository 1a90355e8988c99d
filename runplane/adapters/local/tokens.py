"""SQLite API tokens, users' records and the stack's own secret."""

from __future__ import annotations

import secrets

from runplane.adapters.local.db import Database
from runplane.adapters.records import record_or_none, written_json
from runplane.domain.errors import BackendError
from runplane.domain.tenancy import ApiToken, UserRecord

DDL = """
CREATE TABLE IF NOT EXISTS tokens (
    token_hash TEXT PRIMARY KEY,
    id TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tokens_by_id ON tokens (id);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS stack_secret (
    name TEXT PRIMARY KEY,
    secret BLOB NOT NULL
)
"""


class SqliteTokenStore:
    """API tokens, one row per token under the SHA-256 of its secret, the record as JSON; users'
    records in a table of their own; the stack's secret in another, made once by the first process
    that needs it (an insert that keeps an existing row), the same for every process after."""

    SECRET_KEY = "stack-secret"  # noqa: S105 - a key name, not a secret

    def __init__(self, db: Database) -> None:
        self.db = db
        db.ensure(DDL)

    def lookup(self, token_hash: str) -> ApiToken | None:
        with self.db.errors("read token"):
            found = (
                self.db.connection().execute("SELECT data FROM tokens WHERE token_hash = ?", (token_hash,)).fetchone()
            )
        return record_or_none(ApiToken, found[0] if found else None)

    def put(self, token_hash: str, token: ApiToken) -> None:
        with self.db.errors("store token"), self.db.write() as c:
            c.execute(
                "INSERT OR REPLACE INTO tokens (token_hash, id, data) VALUES (?, ?, ?)",
                (token_hash, token.id, written_json(token)),
            )

    def list(self) -> list[ApiToken]:
        with self.db.errors("list tokens"):
            found = self.db.connection().execute("SELECT data FROM tokens").fetchall()
        tokens = (record_or_none(ApiToken, data) for (data,) in found)
        return sorted((t for t in tokens if t is not None), key=lambda t: (t.created_at, t.id))

    def delete(self, token_id: str) -> bool:
        with self.db.errors("delete token"), self.db.write() as c:
            return c.execute("DELETE FROM tokens WHERE id = ?", (token_id,)).rowcount > 0

    def user(self, name: str) -> UserRecord | None:
        with self.db.errors("read user"):
            found = self.db.connection().execute("SELECT data FROM users WHERE name = ?", (name,)).fetchone()
        return UserRecord.read(found[0] if found else None)

    def put_user(self, record: UserRecord) -> None:
        with self.db.errors("store user"), self.db.write() as c:
            c.execute("INSERT OR REPLACE INTO users (name, data) VALUES (?, ?)", (record.user, written_json(record)))

    def secret(self) -> bytes:
        with self.db.errors("read the stack secret"):
            found = self._secret()
            if found is None:
                with self.db.write() as c:  # the first to commit makes it; the others keep that one
                    c.execute(
                        "INSERT OR IGNORE INTO stack_secret (name, secret) VALUES (?, ?)",
                        (self.SECRET_KEY, secrets.token_bytes(32)),
                    )
                found = self._secret()
        if found is None or len(found) != 32:
            raise BackendError("the stack secret could not be read or made; retry")
        return found

    def _secret(self) -> bytes | None:
        row = (
            self.db.connection()
            .execute("SELECT secret FROM stack_secret WHERE name = ?", (self.SECRET_KEY,))
            .fetchone()
        )
        return bytes(row[0]) if row else None
