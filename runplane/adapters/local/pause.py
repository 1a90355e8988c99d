"""A pause that ends at a commit: how a service that waits for a record to change (the long-poll
of ``runplane.services.watch``) lets time pass on one machine (``Ports.sleep``), instead of
re-reading the record every few milliseconds."""

from __future__ import annotations

import threading
import time

from runplane.adapters.local.db import Database

__all__ = ["CommitPause"]


class CommitPause:
    """``pause(seconds)``: at most ``seconds``, ending when a write commits to ``db``, in this
    process or any other. One pausing thread at a time waits for the commit
    (``Database.wait_for_change``: at once, by the watch of the log, or by looking where there is
    none) and wakes the others when it sees one: many idle waiters cost one wait, and each re-reads
    its record only after a commit (or when its own interval is up)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._cond = threading.Condition()
        self._commits = 0  # commits the lookers have seen
        self._looking = False

    def __call__(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        with self._cond:
            seen = self._commits
            while self._commits == seen and (left := end - time.monotonic()) > 0:
                if self._looking:
                    self._cond.wait(left)  # woken by a commit seen, or by the looker leaving
                    continue
                self._looking = True
                try:
                    self._cond.release()
                    try:
                        self._look(end)
                    finally:
                        self._cond.acquire()
                finally:
                    self._looking = False
                    self._cond.notify_all()

    def _look(self, end: float) -> None:
        """Wait for a commit (counted in ``_commits``) until ``end``."""
        if self.db.wait_for_change(max(0.0, end - time.monotonic())):
            with self._cond:
                self._commits += 1
