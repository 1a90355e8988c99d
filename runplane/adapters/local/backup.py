"""A consistent copy of a stack's state directory, taken while the stack runs (``runplane serve backup``).

The database is copied first, by SQLite's online backup API: one read transaction, so the copy is
one snapshot of every store, whatever the stack's processes write meanwhile (WAL: they do not wait).
The objects are copied after it. An object is written whole under a new name and renamed into
place, never changed afterwards, so every object the copied database refers to is already there
when the tree is copied; objects written later are copied too or not, and nothing refers to them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from runplane.adapters.local.db import BUSY_SECONDS, DB_FILE, OBJECTS_DIR, state_path

__all__ = ["BackupError", "Copied", "backup"]


class BackupError(Exception):
    """A backup that cannot be made: its message is one line for the operator."""


@dataclass(frozen=True)
class Copied:
    """What ``backup`` copied."""

    database_bytes: int
    objects: int
    object_bytes: int


def backup(state_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Copied:
    """Copy the stack of ``state_dir`` into ``dest``: ``dest/state.db`` and ``dest/objects/``,
    ``dest`` made 0700 and every file 0600 (the copy holds the stack's users' data and tokens'
    hashes). ``dest`` must be new or an empty directory, outside ``state_dir``.

    Raises BackupError (no stack there, a bad ``dest``, a failed copy: a half-made copy is left
    for the operator to remove, never mistaken for a whole one as ``dest`` was not empty before)."""
    root = state_path(state_dir)
    target = state_path(dest)
    database = root / DB_FILE
    if not database.is_file():
        raise BackupError(f"no stack state in {root}: {DB_FILE} is missing (is --state-dir right?)")
    if target == root or root in target.parents:
        raise BackupError(f"{target} is inside the state directory {root}: back it up somewhere else")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BackupError(f"{target} is not an empty directory: a backup goes into a new one")
    try:
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
        target.chmod(0o700)
        database_bytes = _copy_database(database, target / DB_FILE)
        objects, object_bytes = _copy_objects(root / OBJECTS_DIR, target / OBJECTS_DIR)
    except (OSError, sqlite3.Error) as e:
        raise BackupError(f"the backup into {target} failed: {e}") from e
    return Copied(database_bytes, objects, object_bytes)


def _copy_database(source: Path, copy: Path) -> int:
    """SQLite's online backup of ``source`` into ``copy`` (made 0600), left as one file (no WAL)."""
    os.close(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, timeout=BUSY_SECONDS)
    try:
        dst = sqlite3.connect(copy, isolation_level=None)
        try:
            src.backup(dst)  # all pages in one step: one read transaction, one snapshot
            dst.execute("PRAGMA journal_mode=DELETE")
            (check,) = dst.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"the copied database does not check: {check}")
        finally:
            dst.close()
    finally:
        src.close()
    return copy.stat().st_size


def _copy_objects(source: Path, copy: Path) -> tuple[int, int]:
    """Copy the objects tree (directories 0700, files 0600); a file that goes away meanwhile (a
    temporary one renamed into place, an object deleted) is skipped. Returns (files, bytes)."""
    copy.mkdir(mode=0o700)
    files = size = 0
    if not source.is_dir():
        return files, size
    for folder, dirs, names in os.walk(source):
        here = copy / Path(folder).relative_to(source)
        for name in dirs:
            (here / name).mkdir(mode=0o700)
        for name in names:
            src = Path(folder) / name
            if src.is_symlink():
                continue  # the store writes none; one put there by hand is not followed
            with contextlib.suppress(FileNotFoundError):
                with src.open("rb") as reader:
                    fd = os.open(here / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as writer:
                        shutil.copyfileobj(reader, writer, 1 << 20)
                        size += writer.tell()
                files += 1
    return files, size
