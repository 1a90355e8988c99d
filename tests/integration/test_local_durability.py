"""The one-machine stack's database and files keep what they were given when something goes wrong
around them: the directory emptied under a running process, a database of a newer release, a commit
that fails, a write lock held by someone else, a log that grows, a clock that steps back, a power
loss after an object was written, a table with a column added by another release."""

import itertools
import os
import sqlite3
import threading
import time

import pytest

from runplane.adapters.local import wake
from runplane.adapters.local.db import DB_FILE, JOURNAL_SIZE_LIMIT, SCHEMA_VERSION, Database
from runplane.adapters.local.files import FileObjectStore
from runplane.adapters.local.queues import SqliteRunQueue
from runplane.adapters.local.runs import SqliteRunStore
from runplane.devstack.local import LocalCloud
from runplane.domain.errors import BackendError, Misconfigured
from runplane.domain.messages import RunMessage
from runplane.domain.runs import Run, RunSpec
from runplane.services.reap import reap


def _in_thread(work):
    """What ``work`` returns or raises when run on a new thread (a connection of its own)."""
    result: list[object] = []

    def target():
        try:
            result.append(work())
        except Exception as e:
            result.append(e)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    return result[0]


def test_a_database_removed_under_a_running_process_is_not_made_again_empty(tmp_path):
    db = Database(tmp_path / "state")
    runs = SqliteRunStore(db)
    (tmp_path / "state" / DB_FILE).unlink()  # as an rm -rf of the directory under it would
    failed = _in_thread(
        lambda: runs.create(Run(id="r-1", owner="a", spec=RunSpec(command="true"), queue="q", created_at=1.0))
    )
    assert isinstance(failed, BackendError)
    assert not (tmp_path / "state" / DB_FILE).exists()


def test_a_database_of_a_newer_schema_is_refused_in_one_line(tmp_path):
    Database(tmp_path / "state")
    path = tmp_path / "state" / DB_FILE
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # recorded
        c.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(Misconfigured) as refused:
        Database(tmp_path / "state")
    assert "newer runplane" in str(refused.value) and "\n" not in str(refused.value)


def test_a_commit_that_fails_leaves_the_connection_ready_for_the_next_write(tmp_path):
    db = Database(tmp_path / "state")
    db.connection().execute("PRAGMA foreign_keys=ON")
    with db.write() as c:
        c.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        c.execute("CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(sqlite3.IntegrityError), db.write() as c:
        c.execute("INSERT INTO child VALUES (7)")  # checked at COMMIT, which fails
    with db.write() as c:
        c.execute("INSERT INTO parent VALUES (1)")
    assert db.connection().execute("SELECT COUNT(*) FROM child").fetchone()[0] == 0


def test_a_write_lock_held_elsewhere_fails_a_write_soon_instead_of_stalling_it(tmp_path):
    db = Database(tmp_path / "state")
    runs = SqliteRunStore(db)
    holder = sqlite3.connect(tmp_path / "state" / DB_FILE, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a shell left in a transaction
    try:
        began = time.monotonic()
        with pytest.raises(BackendError):
            runs.create(Run(id="r-1", owner="a", spec=RunSpec(command="true"), queue="q", created_at=1.0))
        assert time.monotonic() - began < 20  # the 503 comes well before a client gives up
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_checkpoint_truncates_the_log_a_reader_let_grow(tmp_path):
    db = Database(tmp_path / "state")
    assert db.connection().execute("PRAGMA journal_size_limit").fetchone()[0] == JOURNAL_SIZE_LIMIT
    reader = sqlite3.connect(tmp_path / "state" / DB_FILE, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # a snapshot held: no checkpoint resets the log
    with db.write() as c:
        c.execute("CREATE TABLE filler (data BLOB)")
    for _ in range(40):
        with db.write() as c:
            c.execute("INSERT INTO filler VALUES (zeroblob(100000))")
    wal = tmp_path / "state" / f"{DB_FILE}-wal"
    assert wal.stat().st_size > 4_000_000
    assert not db.checkpoint()  # the reader is in the way
    reader.execute("COMMIT")
    reader.close()
    assert db.checkpoint()
    assert wal.stat().st_size == 0


def test_a_message_sent_before_the_clock_stepped_back_is_received(tmp_path):
    db = Database(tmp_path / "state")
    queue = SqliteRunQueue(db)
    queue.send("default", RunMessage(run_id="r-early", attempt=0))
    with db.write() as c:  # the clock went back an hour since: its times are an hour ahead of now
        c.execute("UPDATE queue_messages SET visible_at = visible_at + 3600, sent_at = sent_at + 3600")
    [got] = queue.receive("default", 1, wait_seconds=0, visibility_seconds=30)
    assert got.message.run_id == "r-early"
    assert queue.receive("default", 1, wait_seconds=0, visibility_seconds=30) == []  # in flight now


def test_the_reaper_rehints_a_run_hinted_in_the_future_of_a_clock_that_stepped_back(local_stack):
    now = local_stack.clock()
    run = Run(id="r-ahead", owner="a", spec=RunSpec(command="true"), queue="default", created_at=now)
    local_stack.store.create(run.model_copy(update={"hinted_at": now + 3600}))
    assert "r-ahead" in reap(local_stack.ports, rehint_after=60).rehinted


def test_an_object_is_on_disk_before_it_is_renamed_into_place_and_so_is_the_rename(tmp_path, monkeypatch):
    objects = FileObjectStore(tmp_path / "state", "data", lambda: b"k" * 32, "http://127.0.0.1:1")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    objects.put_bytes("runs/r-1/out.txt", b"kept")
    bucket = tmp_path / "state" / "objects" / "data"
    assert len(synced) == 2
    assert "/.partial/" in synced[0]  # the file itself, under its temporary name: before the rename
    assert synced[1] == str(bucket / "runs" / "r-1")  # the directory the rename wrote
    assert objects.get_bytes("runs/r-1/out.txt") == b"kept"


def test_a_run_is_stored_in_a_table_another_release_added_a_column_to(tmp_path):
    db = Database(tmp_path / "state")
    runs = SqliteRunStore(db)
    with db.write() as c:
        c.execute("ALTER TABLE runs ADD COLUMN tier TEXT")
    runs.create(Run(id="r-1", owner="a", spec=RunSpec(command="true"), queue="q", created_at=1.0))
    assert runs.get("r-1").owner == "a"


def test_an_idle_wait_looks_for_other_processes_commits_less_often(tmp_path, monkeypatch):
    monkeypatch.setattr(wake, "INOTIFY", False)  # where there is no watch of the log
    db = Database(tmp_path / "state")
    looks: list[float] = []
    began = time.monotonic()
    connection = db.connection()
    connection.set_trace_callback(lambda sql: looks.append(time.monotonic() - began) if "data_version" in sql else None)
    try:
        assert not db.wait_for_change(1.6)
    finally:
        connection.set_trace_callback(None)
    idle = [b - a for a, b in itertools.pairwise(looks[:-1]) if a > 1.05]  # the last look is at the end
    assert len(idle) >= 3
    assert min(idle) >= 0.045


def test_the_schedule_of_the_local_stack_truncates_the_log(local_stack, tmp_path):
    cloud = LocalCloud(tmp_path / "state", "http://127.0.0.1:1")
    cloud.provision(local_stack)
    for i in range(5):
        local_stack.store.create(
            Run(id=f"r-{i}", owner="a", spec=RunSpec(command="true"), queue="parked", created_at=1.0)
        )
    wal = tmp_path / "state" / f"{DB_FILE}-wal"
    assert wal.stat().st_size > 0
    cloud.fire_schedule()
    assert wal.stat().st_size == 0
