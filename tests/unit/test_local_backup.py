"""``runplane serve backup``: a copy of a state directory, taken while a writer holds it open in WAL
mode, holds every committed row and object, is private (0700/0600), and is refused where it would
be lost or would overwrite something."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from runplane.adapters.local.backup import BackupError, backup


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def state(tmp_path: Path):
    """A state directory whose database is open in WAL mode, its last rows still in the WAL."""
    root = tmp_path / "state"
    (root / "objects" / "data" / "runs" / "r1").mkdir(parents=True)
    (root / "objects" / "data" / "runs" / "r1" / "stdout").write_bytes(b"hello\n")
    db = sqlite3.connect(root / "state.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")  # the rows stay in state.db-wal, not in state.db
    db.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, data TEXT)")
    db.executemany("INSERT INTO runs VALUES (?, ?)", [(f"r{i}", "{}") for i in range(100)])
    yield root
    db.close()


def test_the_copy_holds_the_committed_rows_and_the_objects_and_is_private(state, tmp_path):
    dest = tmp_path / "backups" / "one"

    copied = backup(state, dest)

    assert (state / "state.db-wal").stat().st_size > 0  # what was copied was in the WAL too
    copy = sqlite3.connect(dest / "state.db")
    assert copy.execute("SELECT count(*) FROM runs").fetchone() == (100,)
    assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # one file, nothing beside it
    copy.close()
    assert (dest / "objects" / "data" / "runs" / "r1" / "stdout").read_bytes() == b"hello\n"
    assert (copied.objects, copied.object_bytes) == (1, 6)
    assert _mode(dest) == 0o700
    assert _mode(dest / "objects" / "data" / "runs") == 0o700
    assert _mode(dest / "state.db") == 0o600
    assert _mode(dest / "objects" / "data" / "runs" / "r1" / "stdout") == 0o600


def test_an_empty_existing_directory_takes_a_copy(state, tmp_path):
    dest = tmp_path / "empty"
    dest.mkdir(mode=0o755)
    backup(state, dest)
    assert _mode(dest) == 0o700
    assert (dest / "state.db").is_file()


@pytest.mark.parametrize("where", ["inside", "itself", "not-empty", "a-file"])
def test_a_destination_that_would_lose_or_overwrite_something_is_refused(state, tmp_path, where):
    dest = {
        "inside": state / "backup",
        "itself": state,
        "not-empty": tmp_path / "full",
        "a-file": tmp_path / "file",
    }[where]
    if where == "not-empty":
        dest.mkdir()
        (dest / "keep").write_text("mine")
    if where == "a-file":
        dest.write_text("mine")

    with pytest.raises(BackupError) as caught:
        backup(state, dest)

    assert "inside the state directory" in str(caught.value) or "not an empty directory" in str(caught.value)
    assert not (state / "backup").exists()
    if where == "not-empty":
        assert sorted(p.name for p in dest.iterdir()) == ["keep"]
