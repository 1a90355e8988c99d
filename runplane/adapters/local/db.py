"""The one SQLite database of a stack on one machine (``state.db`` in its state directory).

Every process of the stack (the front, the functions, each agent) opens the same file. The
database is in WAL mode: readers never wait for the writer, and a write transaction starts with
``BEGIN IMMEDIATE``, so a conditional write (read, check, write) is atomic against every other
process without a lock of ours. ``synchronous=NORMAL``: a commit survives the process being
killed (SIGKILL) at any point; after a power loss the last commits may be missing, never half of one.

Each thread of each process has a connection of its own (``connection``). ``wait_for_change``
lets a reader block until a write commits, in this process or in another, and wake at once: a
commit of another process writes ``state.db-wal``, which the process's one inotify watch sees
(``runplane.adapters.local.wake``), confirmed by SQLite's ``data_version``. An idle waiter costs
nothing. Where inotify cannot be had, a waiter looks at ``data_version`` every ``POLL_SECONDS``,
or ``IDLE_POLL_SECONDS`` once it has waited ``IDLE_AFTER_SECONDS``.

The file is made by ``Database`` alone: a connection opens it read-write and never makes it, so a
process whose directory was emptied under it fails (BackendError) instead of starting an empty
database. ``PRAGMA user_version`` is the schema's version (SCHEMA_VERSION): a database of a newer
release is refused. Never open ``state.db`` read-write while its stack runs (a write transaction
held open stalls every write of the stack); ``runplane serve backup`` copies it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from runplane.adapters.local import wake
from runplane.domain.errors import BackendError, Misconfigured

__all__ = ["DB_FILE", "OBJECTS_DIR", "POLL_SECONDS", "SCHEMA_VERSION", "Database", "state_path"]

DB_FILE = "state.db"
WAL_FILE = DB_FILE + "-wal"
OBJECTS_DIR = "objects"
POLL_SECONDS = 0.005
"""How often a waiter looks for a commit made by another process, in the first IDLE_AFTER_SECONDS of its wait."""
IDLE_POLL_SECONDS = 0.05
"""How often it looks after that: an idle agent costs little, and still takes a hint within this."""
IDLE_AFTER_SECONDS = 1.0
SETTLE_SECONDS = 0.1
"""How long after a wake by the log a waiter still looks every POLL_SECONDS: the log is written a
moment before the commit is visible, and a wake may come for no commit (a checkpoint)."""
BUSY_SECONDS = 5.0
"""How long a write waits for another process's write transaction before it fails (BackendError,
answered 503): a lock held too long makes the API answer soon, not hang."""
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
"""Bytes of the write-ahead log kept after a checkpoint resets it (the rest is truncated)."""
SCHEMA_VERSION = 1
"""The version of the tables this release makes and reads (``PRAGMA user_version``)."""


def state_path(state_dir: str | os.PathLike[str]) -> Path:
    """The state directory as a path: ``~`` expanded, made absolute (the agents a stack starts and
    its own processes must name the same file)."""
    return Path(os.fspath(state_dir)).expanduser().resolve()


def not_private(found: os.stat_result) -> str | None:
    """Why a directory of these stats cannot hold a stack's state or a copy of it: another user's, or
    one that group or others may write in (they could put links or files of theirs in it); None when
    it can."""
    if found.st_uid != os.geteuid():
        return f"it is owned by another user (uid {found.st_uid}), not this one (uid {os.geteuid()})"
    if found.st_mode & 0o022:
        return f"other users may write in it (mode {stat.S_IMODE(found.st_mode):04o})"
    return None


def _private_dir(path: Path) -> None:
    """Make ``path`` (and its missing parents) and keep it 0700: the stack's records and objects are
    its users' data. Raises Misconfigured for a directory that is not this user's alone (not_private)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    why = not_private(path.stat())
    if why is not None:
        raise Misconfigured(f"the state directory {path} is refused: {why}")
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)


def _statements(ddl: str) -> Iterator[str]:
    """The statements of ``ddl``, each whole (a trigger's body holds ';' of its own)."""
    statement = ""
    for part in ddl.split(";"):
        statement += part + ";"
        if sqlite3.complete_statement(statement):
            if statement.strip(" \n;"):
                yield statement
            statement = ""


class Database:
    """The database of the state directory ``root``; one object per directory and process
    (``Database.at``), shared by the stores of that process."""

    _opened: dict[tuple[int, Path], Database] = {}
    _opened_lock = threading.Lock()

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / DB_FILE
        _private_dir(root)
        if not self.path.exists():
            # made 0600 before SQLite opens it: its -wal and -shm files take the same mode
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._local = threading.local()
        self._ensured: set[str] = set()
        self._changed = threading.Condition()
        self._generation = 0  # commits made by this process, for its own waiters
        self._woken_at = float("-inf")  # when the log was last written, by any process (wake.watch)
        with self.errors("open the database"):
            connection = self.connection()
            connection.execute("PRAGMA journal_mode=WAL")
            with self.write() as c:
                version = int(c.execute("PRAGMA user_version").fetchone()[0])
                if version < SCHEMA_VERSION:
                    c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        if version > SCHEMA_VERSION:
            raise Misconfigured(
                f"the database {self.path} was written by a newer runplane (schema {version}, this release "
                f"knows {SCHEMA_VERSION}): upgrade runplane, or restore a backup made before the upgrade"
            )

    @classmethod
    def at(cls, state_dir: str | os.PathLike[str]) -> Database:
        """The database of ``state_dir`` for this process (made, with its directory, if need be)."""
        root = state_path(state_dir)
        key = (os.getpid(), root)
        with cls._opened_lock:
            found = cls._opened.get(key)
            if found is None:
                found = cls._opened[key] = cls(root)
            return found

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Turn SQLite's errors (a lock held past BUSY_SECONDS, a full disk, a broken file) into
        BackendError saying what was being done."""
        try:
            yield
        except sqlite3.Error as e:
            raise BackendError(f"{doing}: {e} (database {self.path})") from e

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (autocommit: each statement outside ``write``/``read`` is a
        transaction of its own)."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                f"{self.path.as_uri()}?mode=rw",  # never made here: see the module's note
                timeout=BUSY_SECONDS,
                isolation_level=None,
                check_same_thread=False,
                uri=True,
            )
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute(f"PRAGMA busy_timeout={int(BUSY_SECONDS * 1000)}")
            connection.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
            connection.execute("PRAGMA temp_store=MEMORY")
            self._local.connection = connection
        return connection

    def ensure(self, ddl: str) -> None:
        """Run ``ddl`` (``CREATE ... IF NOT EXISTS`` statements) once per process, in one transaction."""
        if ddl in self._ensured:
            return
        with self.errors("create the stores' tables"), self.write() as c:
            for statement in _statements(ddl):
                c.execute(statement)
        self._ensured.add(ddl)

    def ensure_table(self, table: str, ddl: str) -> None:
        """Run ``ddl`` (its statements make ``table`` and may fill it from the other tables) in one
        write transaction when ``table`` does not exist yet; checked once per process."""
        if ddl in self._ensured:
            return
        with self.errors(f"create the table {table}"), self.write() as c:
            if c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is None:
                for statement in _statements(ddl):
                    c.execute(statement)
        self._ensured.add(ddl)

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``: no other writer until it ends): committed
        when the block ends, rolled back when it raises. Not re-entrant."""
        c = self.connection()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        try:
            c.execute("COMMIT")
        except BaseException:  # a commit that fails leaves the transaction open: the next write could not begin
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every statement in the block sees the same snapshot."""
        c = self.connection()
        c.execute("BEGIN")
        try:
            yield c
        finally:
            if c.in_transaction:
                c.execute("COMMIT")

    def checkpoint(self) -> bool:
        """Copy the write-ahead log into the database and truncate it to nothing, when no reader
        and no writer is in the way within a moment; True when it was. SQLite's own checkpoints
        cannot shrink the log, and cannot reset it while readers keep coming: a stack calls this
        now and then (its schedule) so that the log does not grow without bound."""
        with self.errors("checkpoint the database"):
            connection = sqlite3.connect(f"{self.path.as_uri()}?mode=rw", timeout=0.1, isolation_level=None, uri=True)
            try:
                busy = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                connection.close()
        return not busy

    def mark(self) -> tuple[int, int]:
        """Where the database is now, for ``wait_for_change(since=...)``: taken before a read, it
        lets the wait that follows the read wake for a commit made between the two."""
        with self.errors("wait for a change"):
            version = int(self.connection().execute("PRAGMA data_version").fetchone()[0])
        with self._changed:
            return self._generation, version

    def _log_written(self) -> None:
        """The watch's callback (its thread): ``state.db-wal`` was written, by any process."""
        with self._changed:
            self._woken_at = time.monotonic()
            self._changed.notify_all()

    def wait_for_change(self, timeout: float, since: tuple[int, int] | None = None) -> bool:
        """Block until a write commits after this call began (in any process), or after ``since``
        (a ``mark`` of this thread), or ``timeout`` seconds pass; True when one did. A write of this
        process wakes it at once, one of another process too (the watch of the log); without the
        watch, within POLL_SECONDS, or IDLE_POLL_SECONDS once the wait is IDLE_AFTER_SECONDS old."""
        began = time.monotonic()
        deadline = began + timeout
        c = self.connection()
        # watched before the first look: a commit after that look wakes the wait
        watched = timeout > 0 and wake.watch(self.root, WAL_FILE, self._log_written)
        generation, version = since if since is not None else self.mark()
        with self._changed:
            while True:
                if self._generation != generation:
                    return True
                with self.errors("wait for a change"):
                    if c.execute("PRAGMA data_version").fetchone()[0] != version:
                        return True
                at = time.monotonic()
                left = deadline - at
                if left <= 0:
                    return False
                if watched and not wake.broken():
                    pause = POLL_SECONDS if at - self._woken_at < SETTLE_SECONDS else left
                else:
                    pause = POLL_SECONDS if at - began < IDLE_AFTER_SECONDS else IDLE_POLL_SECONDS
                self._changed.wait(min(pause, left))
