"""A consistent copy of a stack's state directory, taken while the stack runs (``runplane serve backup``).

The database is copied first, by SQLite's online backup API: one read transaction, so the copy is
one snapshot of every store, whatever the stack's processes write meanwhile (WAL: they do not wait).
The objects are copied after it. An object is written whole under a new name and renamed into
place, never changed afterwards, so every object the copied database refers to is already there
when the tree is copied; objects written later are copied too or not, and nothing refers to them.
The one exception is what the retention sweep deletes meanwhile (a run's outputs or logs whose date
has passed, then its record): gone from the copy as from the stack, the copied record still lists it
until the copy's own sweep passes; the sweep's index (``run_purges``) is copied with the rest.

The secrets key file is copied last (0600): a secret in the copied database was sealed under a
key made before it, never rewritten since, so the copy holds the key of every secret it holds. A
stack whose ``secrets_key`` names a file outside its directory names it here (``key_file``); the
copy holds it as ``secrets.key`` all the same.

The copy goes into a directory made for it, of this user's alone, written through its open file
descriptor; the objects are read one name at a time, never through a link (paths.py): a link
planted in either tree, or swapped in while it is copied, is not followed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from runplane.adapters.local.db import BUSY_SECONDS, DB_FILE, OBJECTS_DIR, not_private, state_path
from runplane.adapters.local.keyfile import KEY_FILE, KeyFile
from runplane.adapters.local.paths import DIR_FLAGS, NOT_THERE, PARTIAL_DIR, descend, objects_dir, open_file
from runplane.domain.errors import Misconfigured

__all__ = ["BackupError", "Copied", "backup"]


class BackupError(Exception):
    """A backup that cannot be made: its message is one line for the operator."""


@dataclass(frozen=True)
class Copied:
    """What ``backup`` copied."""

    database_bytes: int
    objects: int
    object_bytes: int
    key_file: bool = False
    """Whether the secrets key file was copied (there is none before a stack's first start)."""


def backup(
    state_dir: str | os.PathLike[str], dest: str | os.PathLike[str], key_file: str | os.PathLike[str] | None = None
) -> Copied:
    """Copy the stack of ``state_dir`` into ``dest``: ``dest/state.db``, ``dest/objects/`` and
    ``dest/secrets.key`` (from ``key_file``, by default the one in ``state_dir``), ``dest`` made
    0700 and every file 0600 (the copy holds the stack's users' data, tokens' hashes and the key
    of its secrets). ``dest`` must be new, or an empty directory of this user's that no one else may write
    in, outside ``state_dir``; ``state_dir`` too must be this user's alone.

    Raises BackupError (no stack there, a bad ``dest``, a failed copy: a half-made copy is left
    for the operator to remove, never mistaken for a whole one as ``dest`` was not empty before)."""
    root = state_path(state_dir)
    target = Path(os.fspath(dest)).expanduser().absolute()  # a link in its place is refused, not followed
    database = root / DB_FILE
    if not database.is_file():
        raise BackupError(f"no stack state in {root}: {DB_FILE} is missing (is --state-dir right?)")
    resolved = state_path(dest)
    if resolved == root or root in resolved.parents:
        raise BackupError(f"{target} is inside the state directory {root}: back it up somewhere else")
    why = not_private(root.stat())
    if why is not None:
        raise BackupError(f"the state directory {root} is refused: {why}")
    try:
        into = _new_directory(target)
    except OSError as e:
        raise BackupError(f"cannot make {target}: {e.strerror}") from e
    try:
        database_bytes = _copy_database(database, into)
        objects, object_bytes = _copy_objects(root, into)
        key_path = Path(os.fspath(key_file)).expanduser().absolute() if key_file is not None else root / KEY_FILE
        copied_key = _copy_key(key_path, into)
        if not copied_key and _sealed_secrets(into):
            raise BackupError(
                f"the secrets key file {key_path} is missing: the copy would hold secrets no one can open "
                "(is the key file set elsewhere, RUNPLANE_SECRETS_KEY?)"
            )
    except (OSError, sqlite3.Error) as e:
        raise BackupError(f"the backup into {target} failed: {e}") from e
    finally:
        os.close(into)
    return Copied(database_bytes, objects, object_bytes, copied_key)


def _new_directory(target: Path) -> int:
    """``target``, made 0700 (or found empty), opened not through a link; BackupError when it is
    not a directory, not empty, or not this user's alone."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        target.mkdir(mode=0o700)
    try:
        fd = os.open(target, DIR_FLAGS)
    except OSError as e:
        if e.errno in NOT_THERE:  # a file or a link
            raise BackupError(f"{target} is not an empty directory: a backup goes into a new one") from e
        raise
    try:
        why = not_private(os.fstat(fd))
        if why is not None:
            raise BackupError(f"{target} is refused: {why}; a backup goes into a directory of this user's alone")
        if os.listdir(fd):  # noqa: PTH208 (the directory opened, not its path)
            raise BackupError(f"{target} is not an empty directory: a backup goes into a new one")
        os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _copy_database(source: Path, into: int) -> int:
    """SQLite's online backup of ``source`` into ``state.db`` (made 0600) of the directory ``into``,
    left as one file (no WAL). Returns its size."""
    os.close(os.open(DB_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=into))
    src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, timeout=BUSY_SECONDS)
    try:
        # the directory opened, whatever its path names now (its journal goes beside it there)
        dst = sqlite3.connect(f"/proc/self/fd/{into}/{DB_FILE}", isolation_level=None)
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
    return os.stat(DB_FILE, dir_fd=into).st_size


def _copy_key(path: Path, into: int) -> bool:
    """Copy the secrets key file ``path`` into ``secrets.key`` (0600) of ``into``; False when there
    is none. BackupError for one the stack would refuse (another user's, readable by others)."""
    try:
        key = KeyFile(path).key(make=False)
    except Misconfigured as e:
        if not path.exists() and not path.is_symlink():
            return False
        raise BackupError(str(e)) from e
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(KEY_FILE, flags, 0o600, dir_fd=into), "wb") as writer:
        writer.write(key)
        writer.flush()
        os.fsync(writer.fileno())
    return True


def _sealed_secrets(into: int) -> int:
    """How many secrets the copied database of ``into`` holds."""
    copy = sqlite3.connect(f"file:/proc/self/fd/{into}/{DB_FILE}?mode=ro", uri=True)
    try:
        if not copy.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'secrets'").fetchone():
            return 0
        return int(copy.execute("SELECT count(*) FROM secrets").fetchone()[0])
    finally:
        copy.close()


def _copy_objects(root: Path, into: int) -> tuple[int, int]:
    """Copy the objects tree of the state directory ``root`` into ``objects/`` of ``into``
    (directories 0700, files 0600), skipping objects being written (PARTIAL_DIR), links, anything
    but regular files, and a file that goes away meanwhile (an object deleted). Returns (files, bytes)."""
    os.mkdir(OBJECTS_DIR, 0o700, dir_fd=into)
    files = size = 0
    with contextlib.ExitStack() as held:
        try:
            top = held.enter_context(objects_dir(root))
        except FileNotFoundError:
            return files, size
        copy = held.enter_context(descend(into, [OBJECTS_DIR]))
        # fwalk opens each directory it enters and checks it is the one it listed: no link is followed
        for folder, dirs, names, here in os.fwalk(".", dir_fd=top):
            parts = list(Path(folder).parts)
            if not parts and PARTIAL_DIR in dirs:
                dirs.remove(PARTIAL_DIR)
            with descend(copy, parts, create=True) as there:
                for name in names:
                    try:
                        with open_file(here, name) as reader:
                            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                            with os.fdopen(os.open(name, flags, 0o600, dir_fd=there), "wb") as writer:
                                shutil.copyfileobj(reader, writer, 1 << 20)
                                size += writer.tell()
                    except OSError as e:
                        if e.errno in NOT_THERE:
                            continue  # gone, a link or not a regular file
                        raise
                    files += 1
    return files, size
