"""SQLite queues: each pool's run hints and the dispatcher's events, as rows of one table.

A message is a row (``queue``, ``visible_at``, ``receive_count``, ``receipt``, ``body``) numbered in
send order (``seq``). A receive is one write transaction over the index on (queue, visible_at,
seq): it takes the first visible rows, makes them invisible for the visibility timeout under a new
random receipt and counts the receive; its cost grows with the log of the backlog, never with the
backlog. A receive that finds nothing waits for a commit (``Database.wait_for_change``: at once for
one of this process, within a few milliseconds for one of another) or for the earliest invisible
message to become visible, and looks again.

Like SQS's redrive and the Storage Queue's poison queue, a message received more than
``MAX_RECEIVES`` times moves to its queue's dead-letter queue (same table, queue ``<queue>:dead``)
instead of being delivered again; so does a run hint that is no ``RunMessage``, logged.

Times are the wall clock's (every process of the stack reads the same one). When it steps back, a
message sent before the step would stay invisible until the clock is back where it was: a message
whose ``sent_at`` is in the future is visible, and taking it brings its ``sent_at`` back to now. (A
step forward shows in-flight messages again early: a second delivery, as any queue may make.)
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from runplane.adapters.local.db import Database
from runplane.adapters.records import record, written_json
from runplane.domain.errors import NotFound
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.ports import Delivery

__all__ = ["EVENTS_QUEUE", "MAX_RECEIVES", "EventDelivery", "SqliteRunQueue", "dead_letter_queue", "pool_queue"]

log = logging.getLogger(__name__)

MAX_RECEIVES = 5
"""Receives of one message before it moves to its dead-letter queue (SQS's redrive count here)."""
MAX_VISIBILITY = 12 * 3600
"""The longest visibility timeout (SQS's)."""
MAX_BATCH = 100
"""The most messages one receive takes."""
EVENTS_QUEUE = "events"
_VISIBLE = "queue = ? AND visible_at <= ?"

DDL = """
CREATE TABLE IF NOT EXISTS queue_messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    visible_at REAL NOT NULL,
    receive_count INTEGER NOT NULL DEFAULT 0,
    receipt TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL,
    sent_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_messages_visible ON queue_messages (queue, visible_at, seq);
CREATE INDEX IF NOT EXISTS queue_messages_sent ON queue_messages (queue, sent_at)
"""


def pool_queue(pool: str) -> str:
    """The queue of ``pool``'s run hints."""
    return f"pool:{pool}"


def dead_letter_queue(queue: str) -> str:
    """Where the messages of ``queue`` go after MAX_RECEIVES receives, or when unreadable."""
    return f"{queue}:dead"


@dataclass(frozen=True)
class EventDelivery:
    """A message received from the events queue, as sent (the dispatcher reads it tolerantly, as it
    reads an SQS record's body); ``receipt`` deletes it."""

    body: str
    receipt: str
    receive_count: int = 1


@dataclass(frozen=True)
class _Row:
    value: Any
    """The body as ``readable`` read it."""
    receipt: str
    receive_count: int


class SqliteRunQueue:
    """The run queue of a stack on one machine. ``pools``: the names of the pools whose queues
    exist (a send to or receive from another raises NotFound, as on a provisioned cloud); None:
    every name.

    Besides the ``RunQueue`` port, the events queue is read with ``receive_events`` (the same
    long poll, visibility and redrive as ``receive``; bodies as sent) and emptied with
    ``delete_events``: what an event source mapping does on a cloud, the local cloud does with these.
    A message whose visibility ends comes back; one received MAX_RECEIVES times is set aside
    (``dead_letters``)."""

    def __init__(self, db: Database, *, pools: Iterable[str] | None = None) -> None:
        self.db = db
        self.pools = frozenset(pools) if pools is not None else None
        db.ensure(DDL)

    def _pool_queue(self, pool: str) -> str:
        if self.pools is not None and pool not in self.pools:
            raise NotFound(f"queue of pool {pool!r} does not exist: it is in no pools file of this stack")
        return pool_queue(pool)

    def _send(self, queue: str, body: str, delay_seconds: int = 0) -> None:
        now = time.time()
        with self.db.errors(f"send to {queue}"), self.db.write() as c:
            c.execute(
                "INSERT INTO queue_messages (queue, visible_at, body, sent_at) VALUES (?, ?, ?, ?)",
                (queue, now + max(0, min(MAX_VISIBILITY, delay_seconds)), body, now),
            )

    def send(self, pool: str, message: RunMessage) -> None:
        self._send(self._pool_queue(pool), written_json(message))

    def notify(self, event: DispatchEvent, delay_seconds: int = 0) -> None:
        self._send(EVENTS_QUEUE, written_json(event), delay_seconds)

    def receive(self, pool: str, max_messages: int, wait_seconds: float, visibility_seconds: int) -> list[Delivery]:
        rows = self._receive(self._pool_queue(pool), max_messages, wait_seconds, visibility_seconds, _run_message)
        return [Delivery(row.value, row.receipt, row.receive_count) for row in rows]

    def delete(self, pool: str, delivery: Delivery) -> None:
        self._delete(self._pool_queue(pool), delivery.receipt)

    def release(self, pool: str, delivery: Delivery, delay_seconds: int) -> None:
        queue = self._pool_queue(pool)
        seq = _seq(delivery.receipt)
        if seq is None:
            return
        visible_at = time.time() + max(0, min(MAX_VISIBILITY, delay_seconds))
        with self.db.errors(f"release a message of {queue}"), self.db.write() as c:
            c.execute(
                "UPDATE queue_messages SET visible_at = ? WHERE seq = ? AND receipt = ? AND queue = ?",
                (visible_at, seq, delivery.receipt, queue),
            )

    def receive_events(self, max_messages: int, wait_seconds: float, visibility_seconds: int) -> list[EventDelivery]:
        """Up to ``max_messages`` events (long-polled for at most ``wait_seconds``), invisible to
        other receivers for ``visibility_seconds``; delete each once handled."""
        rows = self._receive(EVENTS_QUEUE, max_messages, wait_seconds, visibility_seconds, str)
        return [EventDelivery(row.value, row.receipt, row.receive_count) for row in rows]

    def delete_events(self, receipts: Iterable[str]) -> None:
        """Delete received events, in one transaction. Quiet for one that is gone already, or was
        received again since."""
        self._delete(EVENTS_QUEUE, *receipts)

    def dead_letters(self, queue: str, limit: int = 100) -> list[str]:
        """The bodies (as sent) of up to ``limit`` messages ``queue`` (``pool_queue(pool)`` or
        ``EVENTS_QUEUE``) set aside, oldest first."""
        with self.db.errors(f"read the dead letters of {queue}"), self.db.read() as c:
            found = c.execute(
                "SELECT body FROM queue_messages WHERE queue = ? ORDER BY visible_at, seq LIMIT ?",
                (dead_letter_queue(queue), limit),
            ).fetchall()
        return [str(body) for (body,) in found]

    def _delete(self, queue: str, *receipts: str) -> None:
        """Delete the messages of ``receipts`` in one transaction (none of ours: nothing to delete)."""
        named = [(seq, receipt, queue) for receipt in receipts if (seq := _seq(receipt)) is not None]
        if not named:
            return
        with self.db.errors(f"delete a message of {queue}"), self.db.write() as c:
            c.executemany("DELETE FROM queue_messages WHERE seq = ? AND receipt = ? AND queue = ?", named)

    def _receive(
        self,
        queue: str,
        max_messages: int,
        wait_seconds: float,
        visibility_seconds: int,
        readable: Callable[[str], object | None],
    ) -> list[_Row]:
        """Take up to ``max_messages`` visible messages of ``queue``, waiting up to ``wait_seconds``
        for one. ``readable`` (a body -> a value, or None when it is not one) sets aside what it
        cannot read (the value is what a delivery carries)."""
        count = max(1, min(MAX_BATCH, max_messages))
        visibility = max(0, min(MAX_VISIBILITY, visibility_seconds))
        deadline = time.monotonic() + max(0.0, wait_seconds)
        with self.db.errors(f"receive from {queue}"):
            while True:
                mark = self.db.mark()  # before the look: a send between the look and the wait wakes it
                first = (
                    self.db.connection()
                    .execute(
                        "SELECT visible_at FROM queue_messages WHERE queue = ? ORDER BY visible_at, seq LIMIT 1",
                        (queue,),
                    )
                    .fetchone()
                )
                now = time.time()
                if first is not None and (first[0] <= now or self._sent_later(queue, now)):
                    taken = self._take(queue, count, visibility, readable)
                    if taken:
                        return taken
                    continue  # another receiver was first, or all it found was set aside: look again
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                if first is not None:
                    left = min(left, max(0.0, first[0] - now))
                self.db.wait_for_change(left, since=mark)

    def _sent_later(self, queue: str, now: float) -> bool:
        """Whether a message of ``queue`` was sent after ``now``: the clock stepped back since."""
        later = self.db.connection().execute(
            "SELECT 1 FROM queue_messages WHERE queue = ? AND sent_at > ? LIMIT 1", (queue, now)
        )
        return later.fetchone() is not None

    def _take(self, queue: str, count: int, visibility: int, readable: Callable[[str], object | None]) -> list[_Row]:
        """One transaction: the first visible messages, invisible from now on under new receipts."""
        taken: list[_Row] = []
        seqs: list[int] = []  # those taken (a visibility of 0 leaves them visible): not taken twice
        with self.db.write() as c:
            now = time.time()
            while len(taken) < count:
                marks = ", ".join("?" * len(seqs))
                query = (
                    f"SELECT seq, body, receive_count FROM queue_messages WHERE {_VISIBLE} AND seq NOT IN ({marks}) "  # noqa: S608
                )
                query += "ORDER BY visible_at, seq LIMIT ?"
                found = c.execute(query, (queue, now, *seqs, count - len(taken))).fetchall()
                if not found:  # those sent after now, when the clock stepped back
                    later = "SELECT seq, body, receive_count FROM queue_messages WHERE queue = ? AND sent_at > ? "
                    later += f"AND seq NOT IN ({marks}) ORDER BY sent_at LIMIT ?"
                    found = c.execute(later, (queue, now, *seqs, count - len(taken))).fetchall()
                if not found:
                    break
                for seq, body, receive_count in found:
                    value = readable(body) if receive_count < MAX_RECEIVES else None
                    if value is None:
                        _set_aside(c, queue, seq, body, receive_count, now)
                        continue
                    receipt = f"{seq}.{secrets.token_urlsafe(12)}"
                    c.execute(
                        "UPDATE queue_messages SET visible_at = ?, receipt = ?, receive_count = ?, "
                        "sent_at = MIN(sent_at, ?) WHERE seq = ?",
                        (now + visibility, receipt, receive_count + 1, now, seq),
                    )
                    taken.append(_Row(value, receipt, receive_count + 1))
                    seqs.append(seq)
        return taken


def _set_aside(c: sqlite3.Connection, queue: str, seq: int, body: str, receive_count: int, now: float) -> None:
    why = f"received {receive_count} times" if receive_count >= MAX_RECEIVES else "unreadable"
    log.warning("moving message %d of %s to its dead-letter queue (%s): %.200s", seq, queue, why, body)
    c.execute(
        "UPDATE queue_messages SET queue = ?, visible_at = ?, receipt = '' WHERE seq = ?",
        (dead_letter_queue(queue), now, seq),
    )


def _run_message(body: str) -> RunMessage | None:
    try:
        return record(RunMessage, body)
    except (ValueError, ValidationError):
        return None


def _seq(receipt: str) -> int | None:
    """The message a receipt names; None for what no receive of ours made."""
    seq, dot, _ = receipt.partition(".")
    return int(seq) if dot and seq.isdigit() else None
