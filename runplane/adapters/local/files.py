"""Objects of a stack on one machine: files under ``<state dir>/objects/<bucket>/<key>``, reached
only through ``paths`` (no link followed, no key outside the tree), and URLs signed for the stack's
own front, which answers them with ``object_urls.serve``.

Directories are 0700 and files 0600. An object is written to a file of its own in
``objects/.partial`` and renamed into place, so a reader sees the whole object or none, and a
process killed mid-write leaves nothing under a key. Writes are not synced to disk, as the
database's are not (``synchronous=NORMAL``): after a power loss the latest may be missing.

A delete unlinks an object and removes the folders that leaves empty (``rmdir``: only while empty),
up to its bucket's; a put, here or through a signed URL, that finds the folder it opened removed
meanwhile makes it again (``paths.place``). A touch sets an object's time (``modified``, which
uploads expire from) to now.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from runplane.adapters.local.db import OBJECTS_DIR, state_path
from runplane.adapters.local.object_urls import MAX_URL_SECONDS, MD5_PATTERN, PATH_PREFIX, sign, sign_put, url_key
from runplane.adapters.local.paths import (
    DIR_FLAGS,
    NOT_THERE,
    PARTIAL_DIR,
    check_bucket,
    descend,
    key_segments,
    make_folder,
    objects_dir,
    open_dir,
    open_file,
    place,
    reason,
    valid_segment,
)
from runplane.domain.errors import BackendError, BadRequest, NotFound, PayloadTooLarge
from runplane.domain.uploads import PUT_URL_SECONDS
from runplane.ports import MAX_DELETE, ObjectInfo

__all__ = ["FileObjectStore"]

log = logging.getLogger(__name__)

STALE_PARTIAL_SECONDS = 24 * 3600
_CHUNK = 1024 * 1024
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _etag(st: os.stat_result) -> str:
    # a write renames a new file into place: a new inode, so the tag changes with every write
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(key, st.st_size, _etag(st), st.st_mtime)


class FileObjectStore:
    """Objects of ``bucket`` as files under ``root/objects/<bucket>/`` (``root``: the state
    directory; the bucket's directory is made here, a bucket reached by ``within`` is not).
    ``url`` signs with a key derived from ``secret()`` (the stack's secret) a GET of
    ``{public_url}/objects/{bucket}/{key}``, which the stack's front answers with ``serve``."""

    def __init__(
        self,
        root: Path,
        bucket: str,
        secret: Callable[[], bytes],
        public_url: str,
        *,
        clock: Callable[[], float] = time.time,
        make_bucket: bool = True,
    ) -> None:
        self.root = state_path(root)
        self.bucket = bucket
        self.secret = secret
        self.public_url = public_url.rstrip("/")
        self.clock = clock
        self._url_key: bytes | None = None
        if make_bucket:
            self._make_bucket()

    def _make_bucket(self) -> None:
        check_bucket(self.bucket)
        objects = self.root / OBJECTS_DIR
        try:
            objects.mkdir(parents=True, exist_ok=True, mode=0o700)
            if objects.stat().st_mode & 0o077:
                objects.chmod(0o700)
            with objects_dir(self.root) as top:
                os.close(open_dir(top, self.bucket, create=True))
                partial = open_dir(top, PARTIAL_DIR, create=True)
                try:
                    _clear_stale(partial, self.clock())
                finally:
                    os.close(partial)
        except OSError as e:
            raise BackendError(f"make bucket {self.bucket}: {reason(e)} (under {objects})") from e

    @contextlib.contextmanager
    def _bucket(self, what: str, key: str) -> Iterator[tuple[int, int]]:
        """The objects directory and this store's bucket directory, open; BackendError when the
        bucket does not exist (as S3 answers NoSuchBucket), BadRequest for a bucket name S3 refuses."""
        check_bucket(self.bucket)
        with contextlib.ExitStack() as on:
            try:
                top = on.enter_context(objects_dir(self.root))
                bucket = open_dir(top, self.bucket)
            except OSError as e:
                if e.errno in NOT_THERE:
                    raise BackendError(f"{what} {key}: bucket {self.bucket} does not exist") from e
                raise
            on.callback(os.close, bucket)
            yield top, bucket

    @contextlib.contextmanager
    def _failures(self, what: str, key: str) -> Iterator[None]:
        """OSError as BackendError naming its errno, never its text (a failure's message reaches
        users, and the text names paths of this machine); the whole error goes to our log."""
        try:
            yield
        except OSError as e:
            log.warning("%s %s in bucket %s: %s", what, key, self.bucket, e)
            raise BackendError(f"{what} {key}: {reason(e)}") from e

    # -- writing --------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        self._put(key, lambda f: f.write(data))

    def put_file(self, key: str, path: Path) -> None:
        def copy(f: BinaryIO) -> None:
            with path.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    f.write(chunk)

        self._put(key, copy)

    def _put(self, key: str, write: Callable[[BinaryIO], object]) -> None:
        names = key_segments(key)
        with self._failures("upload", key), self._bucket("upload", key) as (top, bucket), contextlib.ExitStack() as on:
            partial = open_dir(top, PARTIAL_DIR, create=True)
            on.callback(os.close, partial)
            directory = on.enter_context(_folder(bucket, names[:-1], key))
            temp = secrets.token_hex(12)
            fd = os.open(temp, _WRITE_FLAGS, 0o600, dir_fd=partial)
            try:
                with os.fdopen(fd, "wb") as f:
                    write(f)
                    f.flush()
                    os.fsync(f.fileno())  # on disk before it is renamed into place: never an empty object
                directory = place(
                    lambda into: os.replace(temp, names[-1], src_dir_fd=partial, dst_dir_fd=into),
                    on,
                    bucket,
                    names[:-1],
                    directory,
                    temp,
                    partial,
                )
                os.fsync(directory)  # and the rename itself
            except BaseException as e:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=partial)
                if isinstance(e, IsADirectoryError):
                    raise BadRequest(f"upload {key}: objects are stored under it, as in a folder") from e
                raise

    # -- deleting -------------------------------------------------------------------------

    def delete(self, keys: Sequence[str]) -> None:
        """Unlink each object (a key with none is no error) and remove the folders that leaves
        empty, up to the bucket's own; a put into a folder removed meanwhile makes it again."""
        if len(keys) > MAX_DELETE:
            raise ValueError(f"delete takes at most {MAX_DELETE} keys a call, not {len(keys)}")
        paths = [key_segments(key) for key in keys]  # every key checked before anything is deleted
        for key, names in zip(keys, paths, strict=True):
            with self._failures("delete", key), self._bucket("delete", key) as (_, bucket):
                _remove(bucket, names)

    def touch(self, key: str) -> None:
        with self._open("touch", key) as f:
            os.utime(f.fileno())  # the time now; the object, its size and its bytes stay

    # -- reading --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _open(self, what: str, key: str) -> Iterator[BinaryIO]:
        """The object ``key``, open for reading; NotFound when there is none."""
        names = key_segments(key)
        with self._failures(what, key), self._bucket(what, key) as (_, bucket):
            try:
                with descend(bucket, names[:-1]) as directory:
                    f = open_file(directory, names[-1])
            except OSError as e:
                if e.errno in (*NOT_THERE, errno.EISDIR):
                    raise NotFound(f"object {key} not found") from e
                raise
            with f:
                yield f

    def head(self, key: str) -> ObjectInfo | None:
        try:
            with self._open("head", key) as f:
                return _info(key, os.fstat(f.fileno()))
        except NotFound:
            return None

    def get_bytes(self, key: str) -> bytes:
        with self._open("download", key) as f:
            return f.read()

    def download_file(self, key: str, path: Path, max_bytes: int | None = None) -> None:
        with self._open("download", key) as f:
            size = os.fstat(f.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                raise PayloadTooLarge(f"object {key} holds {size} bytes, more than {max_bytes}")
            # into a file beside the target, renamed when complete: a failed download leaves nothing
            part = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
            try:
                received = 0
                with part.open("wb") as out:
                    while chunk := f.read(_CHUNK):
                        received += len(chunk)
                        if max_bytes is not None and received > max_bytes:
                            raise PayloadTooLarge(f"object {key} holds more than {max_bytes} bytes")
                        out.write(chunk)
                part.replace(path)
            finally:
                part.unlink(missing_ok=True)

    # -- listing --------------------------------------------------------------------------

    def list_page(self, prefix: str, cursor: str | None, limit: int) -> tuple[list[ObjectInfo], str | None]:
        # the cursor is the last key of the previous page (S3's StartAfter), inside the prefix
        if cursor and (not cursor.startswith(prefix) or "\x00" in cursor):
            raise BadRequest("cursor is not valid; pass the next_cursor of a previous page")
        if limit < 1:
            return [], None
        with (
            self._failures("list", prefix),
            self._bucket("list", prefix) as (_, bucket),
            contextlib.closing(_under(bucket, prefix, cursor or None)) as listing,
        ):
            found = list(itertools.islice(listing, limit + 1))
        return (found[:limit], found[limit - 1].key) if len(found) > limit else (found, None)

    def list(self, prefix: str) -> list[ObjectInfo]:
        with self._failures("list", prefix), self._bucket("list", prefix) as (_, bucket):
            return list(_under(bucket, prefix, None))

    def within(self, bucket: str) -> FileObjectStore:
        if bucket == self.bucket:
            return self
        store = FileObjectStore(self.root, bucket, self.secret, self.public_url, clock=self.clock, make_bucket=False)
        store._url_key = self._url_key
        return store

    # -- signed URLs ----------------------------------------------------------------------

    def url(self, key: str, expires_seconds: int = 3600) -> str:
        """A URL of the stack's front that GETs the object until ``expires_seconds`` (at most
        seven days) from now, as a download (``Content-Disposition: attachment``)."""
        key_segments(key)
        check_bucket(self.bucket)
        if self._url_key is None:
            self._url_key = url_key(self.secret())
        expires = int(self.clock()) + max(1, min(MAX_URL_SECONDS, expires_seconds))
        signature = sign(self._url_key, self.bucket, key, expires)
        path = f"{PATH_PREFIX}{quote(self.bucket, safe='')}/{quote(key, safe='/')}"
        return f"{self.public_url}{path}?expires={expires}&signature={signature}"

    def put_url(
        self, key: str, size: int, md5: str, expires_seconds: int = PUT_URL_SECONDS
    ) -> tuple[str, dict[str, str]]:
        """A URL of the stack's front that PUTs ``size`` bytes whose MD5 is ``md5`` at ``key``
        until ``expires_seconds`` from now (the front checks both before the object is there),
        and the headers to send with it."""
        key_segments(key)
        check_bucket(self.bucket)
        if size < 0 or not MD5_PATTERN.fullmatch(md5):
            raise BadRequest("an upload needs its size in bytes and the base64 of its MD5")
        if self._url_key is None:
            self._url_key = url_key(self.secret())
        expires = int(self.clock()) + max(1, min(MAX_URL_SECONDS, expires_seconds))
        signature = sign_put(self._url_key, self.bucket, key, expires, size, md5)
        path = f"{PATH_PREFIX}{quote(self.bucket, safe='')}/{quote(key, safe='/')}"
        headers = {"Content-MD5": md5, "Content-Length": str(size), "Content-Type": "application/gzip"}
        return f"{self.public_url}{path}?expires={expires}&signature={signature}", headers


def _under(bucket: int, prefix: str, after: str | None) -> Generator[ObjectInfo, None, None]:
    """The objects of the bucket directory whose keys start with ``prefix`` and come after
    ``after``, in key order."""
    *folders, start = prefix.split("/")
    if not all(valid_segment(n) for n in folders) or "\x00" in start:
        return  # no key has such a prefix
    try:
        with descend(bucket, folders) as directory:
            yield from _scan(directory, "".join(f"{n}/" for n in folders), start, after)
    except OSError as e:
        if e.errno not in NOT_THERE:
            raise


def _scan(directory: int, base: str, start: str, after: str | None) -> Iterator[ObjectInfo]:
    """The objects under ``directory`` (whose keys begin with ``base``) named ``start``..., in key
    order: a folder sorts as its name and a '/', which is where its keys sort. Links, and entries
    that are neither files nor folders, are not objects."""
    entries: list[tuple[str, os.DirEntry[str], bool]] = []
    with os.scandir(directory) as found:
        for entry in found:
            if not entry.name.startswith(start) or not valid_segment(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                entries.append((f"{base}{entry.name}/", entry, True))
            elif entry.is_file(follow_symlinks=False):
                entries.append((base + entry.name, entry, False))
    entries.sort(key=lambda e: e[0])
    for key, entry, folder in entries:
        # a folder is skipped whole when its keys all come before ``after``
        if after is not None and key <= after and not (folder and after.startswith(key)):
            continue
        try:
            if folder:
                inner = os.open(entry.name, DIR_FLAGS, dir_fd=directory)
                try:
                    yield from _scan(inner, key, "", after)
                finally:
                    os.close(inner)
            else:
                st = entry.stat(follow_symlinks=False)
                yield _info(key, st)
        except OSError as e:  # replaced by a link, or gone, since it was listed
            if e.errno not in NOT_THERE:
                raise


@contextlib.contextmanager
def _folder(bucket: int, names: list[str], key: str) -> Iterator[int]:
    """The folder at ``names`` under ``bucket`` (``make_folder``); BadRequest where an object (or a
    link) is in the way."""
    with contextlib.ExitStack() as on:
        try:
            directory = on.enter_context(make_folder(bucket, names))
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP, errno.EEXIST):
                raise BadRequest(f"upload {key}: a part of its path is an object (or a link), not a folder") from e
            raise
        yield directory


def _remove(bucket: int, names: list[str]) -> None:
    """Unlink the object at ``names`` under ``bucket`` (none there: nothing to unlink), then remove
    the folders on its path that are left empty, the deepest first, up to the bucket's own. A folder
    is removed only while empty (``rmdir``): an object another writer put in it meanwhile stays."""
    folders = [bucket]  # folders[i]: the folder at names[:i]
    try:
        for name in names[:-1]:
            try:
                folders.append(open_dir(folders[-1], name))
            except OSError as e:
                if e.errno in NOT_THERE:
                    return
                raise
        try:
            os.unlink(names[-1], dir_fd=folders[-1])
        except OSError as e:
            if e.errno not in (*NOT_THERE, errno.EISDIR):
                raise
        for depth in range(len(names) - 1, 0, -1):
            try:
                os.rmdir(names[depth - 1], dir_fd=folders[depth - 1])
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST, *NOT_THERE, errno.EBUSY):
                    return
                raise
    finally:
        for fd in folders[1:]:
            os.close(fd)


def _clear_stale(partial: int, now: float) -> None:
    """Remove what writers killed mid-write left in ``objects/.partial`` a day ago or more."""
    with os.scandir(partial) as found:
        for entry in found:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < now - STALE_PARTIAL_SECONDS:
                    os.unlink(entry.name, dir_fd=partial)
