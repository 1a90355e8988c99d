"""SQLite sweeps: one row a sweep, its record as JSON, every write but the first conditional on its
``version`` (read, check and write in one write transaction).

Sweeps have a table of their own (see runplane/adapters/local/runs.py for why not the runs'). Its
indexes: ``sweeps_by_owner`` (a user's sweeps, newest first) and ``sweeps_open``, a partial index
of the sweeps that have not finished (``open`` = 1) in creation order: the dispatcher's
``unfinished`` reads it, exact at all times since the flag is written with the record.
"""

from __future__ import annotations

import builtins
import sqlite3

from runplane.adapters.local.db import Database
from runplane.adapters.records import record, written_json
from runplane.domain.cursors import listing_cursor, listing_position
from runplane.domain.errors import AlreadyExists, ConditionFailed, NotFound, PayloadTooLarge
from runplane.domain.sweeps import Sweep

__all__ = ["DDL", "MAX_SWEEP_BYTES", "SqliteSweepStore"]

DDL = """
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    version INTEGER NOT NULL,
    open INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sweeps_by_owner ON sweeps (owner, created_at, id);
CREATE INDEX IF NOT EXISTS sweeps_open ON sweeps (created_at, id) WHERE open = 1;
"""

MAX_SWEEP_BYTES = 350 * 1024
"""The largest sweep record: the bound of the DynamoDB store (an item holds 400 KB), so that a sweep
one stack takes every stack takes."""


def _owner_key(owner: str) -> str:
    return f"sweeps#{owner}"


class SqliteSweepStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.ensure(DDL)

    @staticmethod
    def _data(sweep: Sweep) -> str:
        data = written_json(sweep)
        size = len(data.encode())
        if size > MAX_SWEEP_BYTES:
            raise PayloadTooLarge(f"the sweep's record would be {size} bytes; at most {MAX_SWEEP_BYTES}")
        return data

    @staticmethod
    def _read(c: sqlite3.Connection, sweep_id: str) -> Sweep | None:
        found = c.execute("SELECT data FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        return record(Sweep, found[0]) if found is not None else None

    def create(self, sweep: Sweep) -> Sweep:
        stored = sweep.model_copy(update={"version": 1})
        data = self._data(stored)  # PayloadTooLarge before anything is written
        with self.db.errors("store sweep"), self.db.write() as c:
            existing = self._read(c, sweep.id)
            if existing is not None:
                raise AlreadyExists(f"sweep {sweep.id} exists", sweep=existing)
            c.execute(
                "INSERT INTO sweeps (id, owner, created_at, version, open, data) VALUES (?, ?, ?, ?, ?, ?)",
                (stored.id, stored.owner, stored.created_at, 1, int(stored.finished_at is None), data),
            )
        return stored

    def get(self, sweep_id: str) -> Sweep:
        with self.db.errors("read sweep"):
            found = self._read(self.db.connection(), sweep_id)
        if found is None:
            raise NotFound(f"sweep {sweep_id} not found")
        return found

    def save(self, sweep: Sweep) -> Sweep:
        stored = sweep.model_copy(update={"version": sweep.version + 1})
        data = self._data(stored)
        with self.db.errors("save sweep"), self.db.write() as c:
            found = c.execute("SELECT version, data FROM sweeps WHERE id = ?", (sweep.id,)).fetchone()
            if found is None:
                raise NotFound(f"sweep {sweep.id} not found")
            if found[0] != sweep.version:
                current = record(Sweep, found[1])
                raise ConditionFailed(f"sweep {sweep.id} changed (version {current.version})", sweep=current)
            c.execute(
                "UPDATE sweeps SET version = ?, open = ?, data = ? WHERE id = ?",
                (stored.version, int(stored.finished_at is None), data, sweep.id),
            )
        return stored

    def list(self, owner: str, limit: int = 50, cursor: str | None = None) -> tuple[builtins.list[Sweep], str | None]:
        limit = max(1, limit)
        key = _owner_key(owner)
        after = listing_position(cursor, "owner", key) if cursor else (1e11, "")
        with self.db.errors("list sweeps"):
            rows = (
                self.db.connection()
                .execute(
                    "SELECT data FROM sweeps WHERE owner = ? AND (created_at, id) < (?, ?)"
                    " ORDER BY created_at DESC, id DESC LIMIT ?",
                    (owner, *after, limit + 1),
                )
                .fetchall()
            )
        sweeps = [record(Sweep, row[0]) for row in rows[:limit]]
        if len(rows) <= limit:
            return sweeps, None
        return sweeps, self.cursor_after(sweeps[-1])

    def cursor_after(self, sweep: Sweep) -> str:
        return listing_cursor("owner", _owner_key(sweep.owner), sweep.created_at, sweep.id)

    def unfinished(self, limit: int = 100, after: tuple[float, str] | None = None) -> builtins.list[Sweep]:
        start = after if after is not None else (-1.0, "")
        with self.db.errors("list unfinished sweeps"):
            rows = (
                self.db.connection()
                .execute(
                    "SELECT data FROM sweeps WHERE open = 1 AND (created_at, id) > (?, ?)"
                    " ORDER BY created_at, id LIMIT ?",
                    (*start, max(1, limit)),
                )
                .fetchall()
            )
        return [record(Sweep, row[0]) for row in rows]
