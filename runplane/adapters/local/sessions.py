"""SQLite sessions: one row per slot of a run, the session as JSON."""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from runplane.adapters.local.db import Database
from runplane.adapters.records import jsonable, record, written_json
from runplane.adapters.session_records import check_session_changes, readable, session_slot
from runplane.domain.errors import ConditionFailed, Conflict, NotFound
from runplane.domain.sessions import Session, SessionState

DDL = """
CREATE TABLE IF NOT EXISTS sessions (
    run_id TEXT NOT NULL,
    slot INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (run_id, slot)
)
"""


class SqliteSessionStore:
    """Sessions in the ``sessions`` table keyed by (``run_id``, ``slot``): a new session of a slot
    replaces one that is over. Each call that writes is one write transaction (read, check, write),
    so two callers never both take a slot, nor both move a session out of a state."""

    def __init__(self, db: Database) -> None:
        self.db = db
        db.ensure(DDL)

    @staticmethod
    def _read(c: sqlite3.Connection, run_id: str, slot: int) -> tuple[Session | None, str] | None:
        """The stored session of a slot (None: one this release cannot read) and its text; None: no row."""
        found = c.execute("SELECT data FROM sessions WHERE run_id = ? AND slot = ?", (run_id, slot)).fetchone()
        return (readable(found[0], f"slot {slot} of run {run_id}"), found[0]) if found is not None else None

    def create(self, session: Session) -> Session:
        with self.db.errors("store session"), self.db.write() as c:
            existing = self._read(c, session.run_id, session.slot)
            if existing is not None:
                held = existing[0]
                if held is None:
                    raise Conflict(f"slot {session.slot} of run {session.run_id} holds a session")
                if not held.state.over:
                    raise Conflict(f"slot {held.slot} of run {held.run_id} holds session {held.id}", session=held)
            c.execute(
                "INSERT OR REPLACE INTO sessions (run_id, slot, data) VALUES (?, ?, ?)",
                (session.run_id, session.slot, written_json(session)),
            )
        return session

    def get(self, session_id: str) -> Session:
        run_id, slot = session_slot(session_id)
        with self.db.errors("read session"):
            found = self._read(self.db.connection(), run_id, slot)
        if found is None or found[0] is None or found[0].id != session_id:
            raise NotFound(f"session {session_id} not found")
        return found[0]

    def update(self, session: Session, states: frozenset[SessionState], changes: Mapping[str, Any]) -> Session:
        check_session_changes(changes)
        with self.db.errors("update session"), self.db.write() as c:
            found = self._read(c, session.run_id, session.slot)
            current, text = found if found is not None else (None, "")
            if current is None or current.id != session.id:
                raise NotFound(f"session {session.id} not found")
            if current.state not in states:
                raise ConditionFailed(f"session {session.id} is {current.state}", session=current)
            data = json.loads(text)  # as stored: fields this release does not know are written back
            data.update({field: jsonable(value) for field, value in changes.items()})
            new = record(Session, data)
            c.execute(
                "UPDATE sessions SET data = ? WHERE run_id = ? AND slot = ?",
                (written_json(new), session.run_id, session.slot),
            )
        return new

    def forget(self, run_id: str) -> int:
        with self.db.errors("delete sessions"), self.db.write() as c:
            return c.execute("DELETE FROM sessions WHERE run_id = ?", (run_id,)).rowcount

    def for_run(self, run_id: str) -> builtins.list[Session]:
        with self.db.errors("list sessions"):
            query = "SELECT data FROM sessions WHERE run_id = ? ORDER BY slot"
            found = self.db.connection().execute(query, (run_id,)).fetchall()
        sessions = (readable(data, f"run {run_id}") for (data,) in found)
        return [s for s in sessions if s is not None]
