"""The objects directory of a stack on one machine (``<state dir>/objects/<bucket>/<key>``),
walked one name at a time, each directory opened with ``O_NOFOLLOW``: a link planted anywhere in
the tree is never followed, and a key cannot name ``..``, ``.`` or an empty segment, so nothing
outside the objects directory is ever read or written through a key."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from runplane.adapters.local.db import OBJECTS_DIR
from runplane.domain.errors import BadRequest

PARTIAL_DIR = ".partial"
"""Where objects are written before they are renamed into place (no bucket name starts with a dot)."""
NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
"""The errors of a name that is missing, or is a link or a file where a folder was expected."""
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO planted there: no wait
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+")


def check_bucket(bucket: str) -> str:
    """``bucket`` when it is a name S3 would take (3-63 characters of lowercase letters, digits,
    dots and hyphens, starting and ending with a letter or digit, no ``..``, not an IP address);
    else BadRequest."""
    if not _BUCKET.fullmatch(bucket) or ".." in bucket or _IP_ADDRESS.fullmatch(bucket):
        raise BadRequest(f"bucket name {bucket[:70]!r} is not valid: 3-63 lowercase letters, digits, dots or hyphens")
    return bucket


def valid_segment(name: str) -> bool:
    """Whether ``name`` can be one '/'-separated part of a key."""
    if name in ("", ".", "..") or "\x00" in name or "/" in name:
        return False
    try:
        return len(name.encode()) <= 255
    except UnicodeEncodeError:  # a file name that is not UTF-8 (surrogate escapes) is no key
        return False


def key_segments(key: str) -> list[str]:
    """The names of the path of ``key``; BadRequest for a key that is empty, absolute, longer than
    1,024 bytes, or has an empty, ``.`` or ``..`` segment or a NUL."""
    parts = key.split("/")
    if not key or len(key) > 1024 or not all(valid_segment(p) for p in parts) or len(key.encode()) > 1024:
        raise BadRequest(f"object key {key[:100]!r} is not valid: '/'-separated names, none empty, '.' or '..'")
    return parts


def reason(e: OSError) -> str:
    """The error's errno name (its text names paths of this machine)."""
    return errno.errorcode.get(e.errno or 0, e.__class__.__name__)


def open_dir(parent: int, name: str, create: bool = False) -> int:
    """The directory ``name`` of ``parent``, opened without following a link; made (0700) when
    ``create`` and missing. Raises OSError (ELOOP or ENOTDIR for a link or a file)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # another writer made it first
        os.mkdir(name, 0o700, dir_fd=parent)
    return os.open(name, DIR_FLAGS, dir_fd=parent)


@contextlib.contextmanager
def descend(top: int, names: list[str], create: bool = False) -> Iterator[int]:
    """The directory at ``names`` under ``top`` (which stays open), each step taken without
    following a link."""
    fd = top
    try:
        for name in names:
            inner = open_dir(fd, name, create)
            if fd != top:
                os.close(fd)
            fd = inner
        yield fd
    finally:
        if fd != top:
            os.close(fd)


FOLDER_TRIES = 64
"""How many times a writer makes a folder again when deletes keep removing it under it."""


@contextlib.contextmanager
def make_folder(bucket: int, names: list[str]) -> Iterator[int]:
    """The folder at ``names`` under ``bucket`` (``descend``), made as need be, and made again should
    a delete of the last object in a part of it remove that part between its making and its opening.
    A delete may still remove it once it is open: a writer that then finds it gone (ENOENT moving a
    file into it) makes it again. Raises OSError as ``descend`` does."""
    with contextlib.ExitStack() as on:
        for tries_left in reversed(range(FOLDER_TRIES)):
            try:
                directory = on.enter_context(descend(bucket, names, create=True))
                break
            except FileNotFoundError:
                if not tries_left:
                    raise
        yield directory


def place(
    move: Callable[[int], None],
    on: contextlib.ExitStack,
    bucket: int,
    names: list[str],
    directory: int,
    temp: str,
    partial: int,
) -> int:
    """``move(directory)``: a rename or link of the file ``temp`` of ``partial`` into ``directory``,
    the folder at ``names`` of ``bucket`` (``make_folder``). Should a delete have removed that folder
    meanwhile (ENOENT while ``temp`` is still there), it is made again (kept open by ``on``) and the
    move tried again. Returns the folder moved into."""
    for tries_left in reversed(range(FOLDER_TRIES)):
        try:
            move(directory)
            break
        except FileNotFoundError:
            if not tries_left or not _exists(partial, temp):
                raise
            directory = on.enter_context(make_folder(bucket, names))
    return directory


def _exists(directory: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def open_file(directory: int, name: str) -> BinaryIO:
    """The regular file ``name`` of ``directory``, open for reading; FileNotFoundError for a
    link, a directory or anything else."""
    fd = os.open(name, _FILE_FLAGS, dir_fd=directory)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "not an object", name)
    return os.fdopen(fd, "rb")


@contextlib.contextmanager
def objects_dir(root: Path) -> Iterator[int]:
    """The objects directory of the state directory ``root``, open (not through a link)."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        inner = os.open(OBJECTS_DIR, DIR_FLAGS, dir_fd=top)
    finally:
        os.close(top)
    try:
        yield inner
    finally:
        os.close(inner)


def open_object(root: Path, bucket: str, names: list[str]) -> BinaryIO:
    """The object at ``names`` (``key_segments``) of ``bucket``, open for reading. Raises OSError
    (``NOT_THERE`` or EISDIR) when there is none, or a link is in the way."""
    with objects_dir(root) as top, descend(top, [bucket, *names[:-1]]) as directory:
        return open_file(directory, names[-1])
