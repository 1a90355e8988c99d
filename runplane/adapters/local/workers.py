"""SQLite worker heartbeats: one row per worker; a record not renewed for ``ttl_seconds`` is gone."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable

from runplane.adapters.local.db import Database
from runplane.adapters.records import record, written_json
from runplane.domain.errors import NotFound
from runplane.domain.workers import Worker

DDL = """
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    expires_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS workers_by_pool ON workers (pool, id)
"""


class SqliteWorkerRegistry:
    """Worker heartbeats: the keys (``id``, and ``pool`` for its index), ``expires_at`` and the
    record as JSON. A record not renewed for ``ttl_seconds`` is gone: reads skip it and ``list``
    deletes it, as DynamoDB's TTL would."""

    def __init__(self, db: Database, ttl_seconds: int = 3600, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        db.ensure(DDL)

    def put(self, worker: Worker) -> None:
        row = (worker.id, worker.pool, self.clock() + self.ttl_seconds, written_json(worker))
        with self.db.errors("record worker"), self.db.write() as c:
            c.execute("INSERT OR REPLACE INTO workers (id, pool, expires_at, data) VALUES (?, ?, ?, ?)", row)

    def get(self, worker_id: str) -> Worker:
        with self.db.errors("read worker"):
            found = (
                self.db.connection()
                .execute("SELECT data FROM workers WHERE id = ? AND expires_at >= ?", (worker_id, self.clock()))
                .fetchone()
            )
        if found is None:
            raise NotFound(f"worker {worker_id} not found")
        return record(Worker, found[0])

    def list(self, pool: str | None = None) -> list[Worker]:
        """Every worker, or a pool's (one query of its index), in id order; expired records are removed."""
        now = self.clock()
        with self.db.errors("list workers"):
            if pool is None:
                found = self.db.connection().execute("SELECT data, expires_at FROM workers ORDER BY id").fetchall()
            else:
                query = "SELECT data, expires_at FROM workers WHERE pool = ? ORDER BY id"
                found = self.db.connection().execute(query, (pool,)).fetchall()
            if any(expires_at < now for _, expires_at in found):
                with self.db.write() as c:  # unless a heartbeat renewed it since
                    c.execute("DELETE FROM workers WHERE expires_at < ?", (now,))
        return [record(Worker, data) for data, expires_at in found if expires_at >= now]

    def page(self, pool: str | None, limit: int, after: str | None = None) -> tuple[builtins.list[Worker], str | None]:
        """In id order from the one after ``after`` (a pool's: on its index); reads ``limit`` + 1."""
        query = "SELECT data FROM workers WHERE id > ? AND expires_at >= ?"
        parameters: builtins.list[object] = [after or "", self.clock()]
        if pool is not None:
            query += " AND pool = ?"
            parameters.append(pool)
        query += " ORDER BY id LIMIT ?"
        parameters.append(max(0, limit) + 1)
        with self.db.errors("list workers"):
            found = self.db.connection().execute(query, parameters).fetchall()
        workers = [record(Worker, data) for (data,) in found]
        if len(workers) > limit:
            return workers[:limit], workers[limit - 1].id if limit > 0 else after
        return workers, None

    def delete(self, worker_id: str) -> None:
        with self.db.errors("delete worker"), self.db.write() as c:
            c.execute("DELETE FROM workers WHERE id = ?", (worker_id,))
