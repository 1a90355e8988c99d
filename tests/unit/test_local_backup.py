"""``runplane serve backup``: a copy of a state directory, taken while a writer holds it open in WAL
mode, holds every committed row and object, is private (0700/0600), and is refused where it would
be lost or would overwrite something."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from runplane.adapters.local.backup import BackupError, backup
from runplane.adapters.local.db import Database
from runplane.adapters.local.keyfile import KEY_FILE, KeyFileSealer
from runplane.adapters.local.runs import SqliteRunStore
from runplane.bootstrap import build_stack
from runplane.domain.errors import Misconfigured
from runplane.domain.expect import Expect
from runplane.domain.retention import RunRetention, purge_due
from runplane.domain.runs import Run, RunSpec
from runplane.domain.secrets import SecretRecord, context, user_scope
from runplane.domain.states import RunState
from runplane.settings import StackSettings


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


def _foreign(path: Path) -> None:
    """Make ``path`` another user's (nobody's): only root can."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory to another user")
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize("dest_is", ["a link", "another user's", "writable by others"])
def test_a_destination_not_this_users_alone_is_refused(state, tmp_path, dest_is):
    """A link put where the copy goes, a directory of another user's or one others may write in:
    refused, and nothing written there or where the link points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    dest = tmp_path / "dest"
    if dest_is == "a link":
        dest.symlink_to(elsewhere)
    else:
        dest.mkdir()
        if dest_is == "another user's":
            _foreign(dest)
        else:
            dest.chmod(0o777)

    with pytest.raises(BackupError) as caught:
        backup(state, dest)

    said = {
        "a link": "is not an empty directory",
        "another user's": "is owned by another user (uid 65534)",
        "writable by others": "other users may write in it (mode 0777)",
    }[dest_is]
    assert said in str(caught.value)
    assert list(elsewhere.iterdir()) == []
    if dest_is != "a link":
        assert list(dest.iterdir()) == []


def test_a_state_directory_of_another_user_is_neither_copied_nor_opened(state, tmp_path):
    _foreign(state)
    with pytest.raises(BackupError, match="is owned by another user"):
        backup(state, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    with pytest.raises(Misconfigured, match="is owned by another user"):
        Database.at(state)


def test_links_and_other_files_planted_in_the_objects_are_not_followed(state, tmp_path):
    """Only regular files and directories of the objects tree are copied: a link to a file or a
    directory outside it, a FIFO (no reader would come) and objects being written are not."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("outside")
    runs = state / "objects" / "data" / "runs"
    (runs / "r1" / "leak").symlink_to(secret / "key")
    (runs / "r2").symlink_to(secret)
    os.mkfifo(runs / "r1" / "pipe")
    (state / "objects" / ".partial").mkdir()
    (state / "objects" / ".partial" / "tmp-1").write_bytes(b"half")
    dest = tmp_path / "dest"

    copied = backup(state, dest)

    copy = dest / "objects"
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == [
        "data",
        "data/runs",
        "data/runs/r1",
        "data/runs/r1/stdout",
    ]
    assert (copied.objects, copied.object_bytes) == (1, 6)


def test_the_copy_holds_the_secrets_key_file_private(state, tmp_path):
    """Without its key file a restored stack could open none of its secrets."""
    KeyFileSealer(state / KEY_FILE).ready()
    dest = tmp_path / "dest"

    copied = backup(state, dest)

    assert copied.key_file is True
    assert (dest / KEY_FILE).read_bytes() == (state / KEY_FILE).read_bytes()
    assert _mode(dest / KEY_FILE) == 0o600
    elsewhere = tmp_path / "etc" / "runplane.key"
    KeyFileSealer(elsewhere).ready()
    backup(state, tmp_path / "other", key_file=elsewhere)  # a key file set outside the state directory
    assert (tmp_path / "other" / KEY_FILE).read_bytes() == elsewhere.read_bytes()


def test_a_stack_without_a_key_file_is_copied_unless_it_holds_secrets(state, tmp_path):
    copied = backup(state, tmp_path / "first")
    assert copied.key_file is False and not (tmp_path / "first" / KEY_FILE).exists()
    with sqlite3.connect(state / "state.db") as db:
        db.execute("CREATE TABLE secrets (scope TEXT, name TEXT, data TEXT, PRIMARY KEY (scope, name))")
        db.execute("INSERT INTO secrets VALUES ('user:alice', 'wandb', '{}')")
    with pytest.raises(BackupError, match=f"the secrets key file {state / KEY_FILE} is missing"):
        backup(state, tmp_path / "second")


def test_a_key_file_others_may_read_is_not_copied(state, tmp_path):
    KeyFileSealer(state / KEY_FILE).ready()
    (state / KEY_FILE).chmod(0o644)
    with pytest.raises(BackupError, match=r"other users may read or write it \(mode 0644\)"):
        backup(state, tmp_path / "dest")
    assert not (tmp_path / "dest" / KEY_FILE).exists()


def test_a_copy_opens_the_secrets_sealed_before_it(tmp_path):
    settings = StackSettings(cloud="local", state_dir=str(tmp_path / "state"))
    stack = build_stack(settings)
    scope, ctx = user_scope("alice"), context(user_scope("alice"), "wandb")
    sealed = stack.sealer.seal(b"s3cret-value", ctx)
    stack.secrets.put(SecretRecord(scope=scope, name="wandb", sealed=sealed, updated_at=1.0, updated_by="alice"))

    backup(settings.state_dir, tmp_path / "copy")

    copy = build_stack(settings.model_copy(update={"state_dir": str(tmp_path / "copy")}))
    assert copy.opener.open(copy.secrets.get(scope, "wandb").sealed, ctx) == b"s3cret-value"


def test_a_copy_holds_the_runs_due_for_the_retention_sweep(tmp_path):
    """The sweep's index is copied as it is (a dated run is due at its date, which no index made
    afresh from the runs would know)."""
    runs = SqliteRunStore(Database(tmp_path / "state"))
    for i, retention in enumerate([None, RunRetention(checked_at=6000.0, outputs_at=9000.0)]):
        run = runs.create(Run(id=f"r-{i}", owner="alice", queue="q", spec=RunSpec(command="true"), created_at=1.0))
        running = runs.update(run, Expect(), {"state": RunState.RUNNING, "attempt": 1})
        runs.update(running, Expect(), {"state": RunState.SUCCEEDED, "finished_at": 5000.0, "retention": retention})

    backup(tmp_path / "state", tmp_path / "copy")

    copy = SqliteRunStore(Database(tmp_path / "copy"))
    assert [(r.id, purge_due(r)) for r in copy.due("q", 1e10)] == [("r-0", 5000.0), ("r-1", 9000.0)]
    assert [r.id for r in copy.due("q", 8999.0)] == ["r-0"]
