"""SQLite runs: one row a run, every change one write transaction (read, check, write).

======================  =========================================================================
column                  what it holds
======================  =========================================================================
``id``                  the run's id (the primary key)
``owner``               never changes once stored
``queue``               the pool the run is filed under: changed only by ``move``
``state``               the run's state (an owner's listing filters on it)
``listed``              ``listed_state``: its state, or ``waiting`` for a queued run that still
                        waits for other runs (filed apart from its pool's line)
``created_at``          the run's creation time (listings are newest first, then by id)
``rank``                ``run_rank``: the order a pool's queued runs start in; NULL for a row
                        written without one, which gets it when the run is next written
``data``                the record, as ``written_json`` makes it (read with ``record``)
======================  =========================================================================

``run_purges`` holds a row for each run the retention sweep must look at some time (``purge_due``
not None: finished, not kept): ``run_id``, its ``queue`` and that time, ``due``. Every write of a
run writes its row (or deletes it) in the same transaction, so the row is always the run's
``purge_due``. The table is made, when a stack of an earlier release first opens its database,
together with the rows of the finished runs already stored (due from their end), in one
transaction: the runs of before the upgrade are swept as well, once a retention is set. Agents of
the release before write runs during an upgrade, and write no row: the trigger ``run_purges_at_end``
gives a run that ends its row (due from its end) when it has none, which the write of this
release that made it end replaces with its own in the same transaction.

Runs have a table of their own, apart from sweeps: SQLite charges nothing for a table, and so no
run query needs to tell a sweep's row from a run's (DynamoDB shares one table to share its
indexes). Three indexes make every query a range of one index: ``runs_by_owner`` (covering
what an owner's filtered listing checks), ``runs_by_listing`` (a queue's runs of one listed
state, newest first; ``count``) and ``runs_by_rank`` (a queue's line, in order: ``head``);
``run_purges_by_due`` is a queue's runs due for the sweep, soonest first (``due``).

A write is ``Database.write``: ``BEGIN IMMEDIATE``, so the read of the stored run, the check of
``Expect`` against it and the write are one transaction no other process's write comes between,
with no lock of ours. A timeline is kept as ``add_event`` keeps it (its first event and the
latest, ``MAX_RUN_EVENTS`` in all).
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from runplane.adapters.local.db import Database
from runplane.adapters.records import check_changes, jsonable, record, written_json
from runplane.domain.cursors import listing_cursor, listing_position
from runplane.domain.errors import AlreadyExists, ConditionFailed, Conflict, NotFound
from runplane.domain.expect import Expect
from runplane.domain.ranks import rank_prefix
from runplane.domain.records import add_event, bound_changes
from runplane.domain.retention import purge_due
from runplane.domain.runs import MAX_DEPENDENTS, WAITING, Event, Run, listed_state, run_rank
from runplane.domain.states import RunState
from runplane.ports import LIST_BUDGET, Page

__all__ = ["DDL", "PURGES_DDL", "PURGES_TRIGGER", "SqliteRunStore"]

DDL = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    listed TEXT NOT NULL,
    created_at REAL NOT NULL,
    rank TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_owner ON runs (owner, created_at, id, state, queue);
CREATE INDEX IF NOT EXISTS runs_by_listing ON runs (queue, listed, created_at, id);
CREATE INDEX IF NOT EXISTS runs_by_rank ON runs (queue, listed, rank);
"""

PURGES_DDL = """
CREATE TABLE run_purges (
    run_id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    due REAL NOT NULL
);
CREATE INDEX run_purges_by_due ON run_purges (queue, due, run_id);
INSERT INTO run_purges (run_id, queue, due)
    SELECT id, queue, coalesce(json_extract(data, '$.finished_at'), created_at) FROM runs
    WHERE state IN ('succeeded', 'failed', 'killed', 'timed_out') AND NOT coalesce(json_extract(data, '$.kept'), 0)
    AND json_extract(data, '$.retention') IS NULL
"""
"""The sweep's index of runs, made with the rows of the finished runs already stored (a database of
an earlier release: none kept, none dated by the sweep, so each is due from its end). The states named
are ``TERMINAL_STATES``."""

PURGES_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS run_purges_at_end AFTER UPDATE OF state ON runs
WHEN new.state != old.state AND new.state IN ('succeeded', 'failed', 'killed', 'timed_out')
    AND NOT coalesce(json_extract(new.data, '$.kept'), 0)
BEGIN
    INSERT OR IGNORE INTO run_purges (run_id, queue, due)
    VALUES (new.id, new.queue, coalesce(json_extract(new.data, '$.finished_at'), new.created_at));
END
"""
"""A run that an agent of the release before ends (it writes no row of its own) is due from its end."""


def _qs(queue: str, listed: str) -> str:
    return f"{queue}#{listed}"


_FAR = (1e11, "")
"""A position past every row's: a listing with no cursor starts there (newest first)."""


class SqliteRunStore:
    """Runs in the ``runs`` table of the stack's database (see the module docstring)."""

    def __init__(self, db: Database, list_budget: int = LIST_BUDGET) -> None:
        self.db = db
        self.list_budget = list_budget
        db.ensure(DDL)
        db.ensure_table("run_purges", PURGES_DDL)
        db.ensure(PURGES_TRIGGER)

    @staticmethod
    def _row(run: Run) -> tuple[Any, ...]:
        return (
            run.id,
            run.owner,
            run.queue,
            str(run.state),
            listed_state(run),
            run.created_at,
            run_rank(run),
            written_json(run),
        )

    @staticmethod
    def _read(c: sqlite3.Connection, run_id: str) -> Run | None:
        found = c.execute("SELECT data FROM runs WHERE id = ?", (run_id,)).fetchone()
        return record(Run, found[0]) if found is not None else None

    @staticmethod
    def _index(c: sqlite3.Connection, run: Run) -> None:
        """Write ``run``'s row of ``run_purges``, or delete it (a search of the key when there is none)."""
        due = purge_due(run)
        if due is None:
            c.execute("DELETE FROM run_purges WHERE run_id = ?", (run.id,))
        else:
            c.execute(
                "INSERT OR REPLACE INTO run_purges (run_id, queue, due) VALUES (?, ?, ?)", (run.id, run.queue, due)
            )

    def create(self, run: Run) -> Run:
        with self.db.errors("store run"), self.db.write() as c:
            existing = self._read(c, run.id)
            if existing is not None:
                raise AlreadyExists(f"run {run.id} exists", run=existing)
            c.execute(
                "INSERT INTO runs (id, owner, queue, state, listed, created_at, rank, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                self._row(run),
            )
            if purge_due(run) is not None:  # a new run has no row to delete (none is left of one deleted)
                self._index(c, run)
        return run

    def get(self, run_id: str) -> Run:
        with self.db.errors("read run"):
            found = self._read(self.db.connection(), run_id)
        if found is None:
            raise NotFound(f"run {run_id} not found")
        return found

    def update(self, run: Run, expect: Expect, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        check_changes(changes)
        bounded = bound_changes(changes)

        def change(current: Run) -> Mapping[str, Any]:
            if not expect.holds(current):
                raise ConditionFailed(f"run {run.id} is {current.state} at attempt {current.attempt}", run=current)
            return bounded

        return self._rewrite(run.id, change, event, "update run")

    def move(self, run: Run, expect: Expect, queue: str, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        check_changes(changes)
        bounded = {**bound_changes(changes), "queue": queue}  # the row's queue column is rewritten with it

        def change(current: Run) -> Mapping[str, Any]:
            if current.queue != run.queue:
                raise ConditionFailed(f"run {run.id} is on pool {current.queue}, not {run.queue}", run=current)
            if not expect.holds(current):
                raise ConditionFailed(f"run {run.id} is {current.state} at attempt {current.attempt}", run=current)
            return bounded

        return self._rewrite(run.id, change, event, "move run")

    def follow(self, run_id: str, dependent: str) -> Run:
        def change(current: Run) -> Mapping[str, Any] | None:
            if dependent in current.dependents:
                return None
            if current.state.terminal:
                raise ConditionFailed(f"run {run_id} has ended: {current.state}", run=current)
            if len(current.dependents) >= MAX_DEPENDENTS:
                raise Conflict(f"run {run_id} already has {MAX_DEPENDENTS} runs and sweeps waiting for it")
            return {"dependents": [*current.dependents, dependent]}

        return self._rewrite(run_id, change, None, "follow run")

    def _rewrite(
        self, run_id: str, change: Callable[[Run], Mapping[str, Any] | None], event: Event | None, doing: str
    ) -> Run:
        """In one write transaction: read the run, ask ``change`` what to set in it as it is now
        (None: nothing; it raises to refuse), and write it back with ``event`` on its timeline."""
        with self.db.errors(doing), self.db.write() as c:
            found = c.execute("SELECT data FROM runs WHERE id = ?", (run_id,)).fetchone()
            if found is None:
                raise NotFound(f"run {run_id} not found")
            current = record(Run, found[0])
            changes = change(current)
            if changes is None:
                return current
            data = json.loads(found[0])  # as stored: what ``record`` makes of it, the new run is made of too
            data.update({field: jsonable(value) for field, value in changes.items()})
            new = record(Run, data)
            if event is not None:  # the timeline keeps its first event and the latest ones
                new.events = add_event(new.events, event)
            c.execute(
                "UPDATE runs SET queue = ?, state = ?, listed = ?, rank = ?, data = ? WHERE id = ?",
                (new.queue, str(new.state), listed_state(new), run_rank(new), written_json(new), run_id),
            )
            self._index(c, new)
        return new

    def due(self, queue: str, now: float, limit: int = 100) -> builtins.list[Run]:
        if limit <= 0:
            return []
        with self.db.errors("read the runs due for the retention sweep"):
            rows = (
                self.db.connection()
                .execute(
                    "SELECT runs.data FROM run_purges JOIN runs ON runs.id = run_purges.run_id"
                    " WHERE run_purges.queue = ? AND run_purges.due <= ?"
                    " ORDER BY run_purges.due, run_purges.run_id LIMIT ?",
                    (queue, now, limit),
                )
                .fetchall()
            )
        return [record(Run, row[0]) for row in rows]

    def delete(self, run_id: str, now: float) -> None:
        with self.db.errors("delete run"), self.db.write() as c:
            current = self._read(c, run_id)
            if current is None:
                raise NotFound(f"run {run_id} not found")
            due = purge_due(current)
            if due is None or due > now:
                raise ConditionFailed(f"run {run_id} is not due for deletion", run=current)
            c.execute("DELETE FROM run_purges WHERE run_id = ?", (run_id,))
            c.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def waiting(self, queue: str, limit: int = 100, cursor: str | None = None) -> Page:
        return self.list(queue=queue, state=WAITING, limit=limit, cursor=cursor)

    def list(
        self,
        *,
        owner: str | None = None,
        queue: str | None = None,
        state: RunState | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        limit = max(1, limit)
        if owner is not None:
            after = listing_position(cursor, "owner", owner) if cursor else _FAR
            if state is None and queue is None:
                return self._page(
                    "SELECT data FROM runs WHERE owner = ? AND (created_at, id) < (?, ?)"
                    " ORDER BY created_at DESC, id DESC LIMIT ?",
                    (owner, *after, limit + 1),
                    limit,
                    lambda run: listing_cursor("owner", owner, run.created_at, run.id),
                )
            return self._filtered(owner, queue, None if state is None else str(state), limit, after)
        if queue is None or state is None:
            raise ValueError("list needs an owner, or a queue and a state")
        qs = _qs(queue, str(state))
        after = listing_position(cursor, "qs", qs) if cursor else _FAR
        return self._page(
            "SELECT data FROM runs WHERE queue = ? AND listed = ? AND (created_at, id) < (?, ?)"
            " ORDER BY created_at DESC, id DESC LIMIT ?",
            (queue, str(state), *after, limit + 1),
            limit,
            lambda run: listing_cursor("qs", qs, run.created_at, run.id),
        )

    def _page(self, query: str, args: tuple[Any, ...], limit: int, cursor_of: Callable[[Run], str]) -> Page:
        """The runs ``query`` finds (up to ``limit`` + 1: one more tells whether a page follows)."""
        with self.db.errors("list runs"):
            rows = self.db.connection().execute(query, args).fetchall()
        runs = [record(Run, row[0]) for row in rows[:limit]]
        return Page(runs, cursor_of(runs[-1]) if len(rows) > limit else None)

    def _filtered(self, owner: str, queue: str | None, state: str | None, limit: int, after: tuple[float, str]) -> Page:
        """An owner's runs of one state and/or queue: the owner's index is read (it holds both)
        for at most ``list_budget`` runs; a page may come back short, with a cursor to go on."""
        with self.db.errors("list runs"), self.db.read() as c:
            rows = c.execute(
                "SELECT id, created_at, state, queue FROM runs WHERE owner = ? AND (created_at, id) < (?, ?)"
                " ORDER BY created_at DESC, id DESC LIMIT ?",
                (owner, *after, self.list_budget + 1),
            ).fetchall()
            kept: builtins.list[str] = []
            stop: tuple[float, str] | None = None
            for examined, (run_id, created_at, run_state, run_queue) in enumerate(rows, 1):
                if (state is None or run_state == state) and (queue is None or run_queue == queue):
                    kept.append(run_id)
                    if len(kept) == limit:
                        stop = (created_at, run_id)
                        break
                if examined >= self.list_budget:  # a short page; the cursor goes on where the reading stopped
                    stop = (created_at, run_id) if len(rows) > examined else None
                    break
            runs = [found for run_id in kept if (found := self._read(c, run_id)) is not None]
        return Page(runs, listing_cursor("owner", owner, *stop) if stop is not None else None)

    def cursor_after(self, run: Run, owner: str | None = None) -> str:
        if owner is not None:
            return listing_cursor("owner", owner, run.created_at, run.id)
        return listing_cursor("qs", _qs(run.queue, listed_state(run)), run.created_at, run.id)

    def head(self, queue: str, limit: int, priority: int | None = None) -> builtins.list[Run]:
        if limit <= 0:
            return []
        low, high = "", "~"  # every rank (``rank_key`` makes digits, ``#``, ``.`` and the id) sorts between
        if priority is not None:
            low = rank_prefix(priority)
            high = low[:-1] + chr(ord(low[-1]) + 1)  # the first key past every one with the prefix
        with self.db.errors("read the head of the queue"):
            rows = (
                self.db.connection()
                .execute(
                    "SELECT data FROM runs WHERE queue = ? AND listed = ? AND rank >= ? AND rank < ?"
                    " ORDER BY rank LIMIT ?",
                    (queue, str(RunState.QUEUED), low, high, limit),
                )
                .fetchall()
            )
        return [record(Run, row[0]) for row in rows]

    def count(self, queue: str, state: RunState, cap: int = 10000) -> int:
        if cap <= 0:
            return 0
        with self.db.errors("count runs"):
            found = (
                self.db.connection()
                .execute(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM runs WHERE queue = ? AND listed = ? LIMIT ?)",
                    (queue, str(state), cap),
                )
                .fetchone()
            )
        return int(found[0])
