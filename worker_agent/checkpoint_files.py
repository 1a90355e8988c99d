"""The file system side of a run's checkpoints: its checkpoint directory read as it is while the run may
still write to it (walked, each file hashed into a copy of its own), and a checkpoint written into an
empty directory without ever leaving it.

The run is hostile and the agent is root, as for outputs (``trees``): the walk never follows a
symlink nor enters another file system, each file is opened beneath the directory (``open_beneath``)
and read through its descriptor, and a restore opens every directory relative to its parent with
``O_NOFOLLOW``, so nothing a manifest names, nor a symlink met on the way, can make it write elsewhere.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from runplane.domain.checkpoints import (
    PERMISSION_BITS,
    CheckpointCancelled,
    CheckpointDir,
    CheckpointFile,
    CheckpointTooLarge,
    CheckpointUnusable,
    Manifest,
    path_refusal,
)
from worker_agent.trees import Unwalkable, remove_tree, scan

STAGE_IN_MEMORY = 4 * 1024**2
"""A file up to this size is copied into memory as it is hashed; a larger one into a scratch file."""
SCRATCH_MARGIN = 256 * 1024**2
"""What a sync leaves free on the worker's disk when it stages a file there."""
MAX_NAMED = 20
"""What a sync names of what it left out (the rest are counted)."""
_CHUNK = 1024**2
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PART = ".rp-restore-"

Owner = tuple[int, int]
"""The uid and gid a restore gives what it writes."""


@dataclass
class Progress:
    """A sync's or a restore's counts so far (read from another thread while it goes)."""

    files: int = 0
    """Files taken into the checkpoint (a sync) or written (a restore)."""
    bytes: int = 0
    """Their bytes."""
    read_bytes: int = 0
    """Bytes a sync read and hashed (a file unchanged since the checkpoint before is not read)."""
    uploaded: int = 0
    """Blobs a sync uploaded (a content the series holds already is not uploaded again)."""
    uploaded_bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    """The first ``MAX_NAMED`` entries a sync left out, each with why."""
    skipped_count: int = 0

    def skip(self, what: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < MAX_NAMED:
            self.skipped.append(what)


@dataclass
class Found:
    """A checkpoint directory as a walk found it: its regular files' paths and its directories."""

    files: list[str] = field(default_factory=list)
    dirs: list[CheckpointDir] = field(default_factory=list)
    bytes: int = 0
    """The files' sizes when walked."""
    seen: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Each file's size, permission bits and modification time (ns) when walked."""


def walk(root: Path, max_bytes: int | None, max_entries: int, progress: Progress) -> Found:
    """What a checkpoint of ``root`` holds: its regular files and directories, walked by ``trees.scan``
    (no symlink followed, no other file system entered). Symlinks, other kinds of files and paths a
    manifest cannot name (``path_refusal``) are left out, named in ``progress``. Raises
    CheckpointTooLarge once the files' sizes pass ``max_bytes`` or the entries ``max_entries``: the walk
    stops there, before anything is read; CheckpointUnusable when part of it cannot be walked (deeper
    than ``trees.MAX_DEPTH``, a directory that cannot be listed): what it holds is unknown."""
    found = Found()
    # what is beneath a path is taken only when that path was found a directory: the listing's word on
    # what to descend into and the stat's may differ for a path the run swaps meanwhile (a file for a
    # directory), which would give a path as a file and as a directory both
    walked = {""}
    try:
        for prefix, entry in scan(root):
            rel = prefix + entry.name
            if prefix.rstrip("/") not in walked:
                progress.skip(f"{shown(rel)} (its directory changed while walked)")
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:  # gone meanwhile
                continue
            why = path_refusal(rel)
            if why is None and not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                why = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            if why is not None:
                progress.skip(f"{shown(rel)} ({why})")
                continue
            if stat.S_ISDIR(info.st_mode):
                walked.add(rel)
                found.dirs.append(CheckpointDir(path=rel, mode=info.st_mode & PERMISSION_BITS))
            else:
                found.files.append(rel)
                found.bytes += info.st_size
                found.seen[rel] = (info.st_size, info.st_mode & PERMISSION_BITS, info.st_mtime_ns)
            _check_cap(found.bytes, len(found.files) + len(found.dirs), max_bytes, max_entries)
    except Unwalkable as e:  # what it holds is unknown: no checkpoint is made of part of it
        raise CheckpointUnusable(f"the checkpoint directory cannot be read whole: {e}") from e
    found.files.sort()
    found.dirs.sort(key=lambda d: d.path)
    return found


def shown(rel: str) -> str:
    """A path as a message may name it: its start, a name that is not UTF-8 with ``?`` for its bytes."""
    return rel.encode(errors="replace").decode()[:200]


def _check_cap(size: int, entries: int, max_bytes: int | None, max_entries: int) -> None:
    if max_bytes is not None and size > max_bytes:
        raise CheckpointTooLarge(f"the checkpoint directory holds more than {max_bytes} bytes (its cap)")
    if entries > max_entries:
        raise CheckpointTooLarge(f"the checkpoint directory holds more than {max_entries} files and directories")


@dataclass
class Staged:
    """A file's bytes as one read of it found them, with their SHA-256: in ``data``, or in the
    scratch file ``path``."""

    size: int
    sha256: str
    data: bytes | None = None
    path: Path | None = None


@contextmanager
def staged(
    fd: int,
    room: int | None,
    scratch: Path,
    progress: Progress,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[Staged]:
    """Read the open file ``fd`` to its end, hashing it into a copy (memory, or a file in ``scratch``
    removed afterwards), so what is uploaded is what was hashed however the run changes the file
    meanwhile. Raises CheckpointTooLarge once it holds more than ``room`` bytes, and
    CheckpointCancelled once ``cancelled()`` says so (asked before each chunk: a large file's read is
    given up halfway)."""
    digest = hashlib.sha256()
    size = 0
    memory = bytearray()
    spill: Path | None = None
    out = None
    try:
        while not _given_up(cancelled) and (chunk := os.read(fd, _CHUNK)):
            size += len(chunk)
            if room is not None and size > room:
                raise CheckpointTooLarge(f"the checkpoint directory grew past its cap of {room} bytes while read")
            digest.update(chunk)
            progress.read_bytes += len(chunk)
            if out is None and len(memory) + len(chunk) > STAGE_IN_MEMORY:
                _room_on_worker(scratch, os.fstat(fd).st_size)
                spill = scratch / f"stage-{secrets.token_hex(8)}"
                out = spill.open("xb")
                out.write(memory)
                memory = bytearray()
            if out is None:
                memory += chunk
            else:
                if size % (64 * _CHUNK) < len(chunk):  # the file may grow while read: a look every 64 MiB
                    _room_on_worker(scratch, 0)
                out.write(chunk)
        if out is not None:
            out.close()
        yield Staged(size, digest.hexdigest(), None if spill else bytes(memory), spill)
    finally:
        if out is not None:
            out.close()
        if spill is not None:
            spill.unlink(missing_ok=True)


def _room_on_worker(scratch: Path, size: int) -> None:
    """Raise OSError(ENOSPC) unless the worker's disk under ``scratch`` has room for ``size`` more bytes
    with ``SCRATCH_MARGIN`` to spare: a sync never fills the disk the worker's runs share."""
    info = os.statvfs(scratch)
    free = info.f_bavail * info.f_frsize
    if free < size + SCRATCH_MARGIN:
        raise OSError(
            errno.ENOSPC,
            f"the worker's disk has {free // 1024**2} MiB free, too little to stage a file of "
            f"{size // 1024**2} MiB for the checkpoint with {SCRATCH_MARGIN // 1024**2} MiB to spare",
        )


def _given_up(cancelled: Callable[[], bool]) -> bool:
    if cancelled():
        raise CheckpointCancelled("the checkpoint sync was given up while it read a file")
    return False


Fetch = Callable[[CheckpointFile, Path], None]
"""Download a file's blob to a path (of no file yet); raises what the store raises."""


def write_tree(manifest: Manifest, directory: Path, fetch: Fetch, owner: Owner | None, progress: Progress) -> None:
    """Write ``manifest``'s directories and files into ``directory``, which must be an empty directory
    (made if missing; a symlink is refused): each file is fetched into a temporary name beside its
    place, checked against its size and SHA-256, given its mode, time and ``owner``, and renamed into
    place. Raises CheckpointUnusable (a blob that is not what the manifest says, or a directory that
    is not an empty one), or what ``fetch`` raises; then ``directory`` is emptied again."""
    root = _open_root(directory)
    try:
        if _names(root):
            raise CheckpointUnusable(f"{directory} is not empty: a checkpoint is restored only into an empty directory")
        try:
            for d in manifest.dirs:
                os.close(_beneath(root, d.path, owner))
            for f in manifest.files:
                _write_file(root, f, fetch, owner)
                progress.files += 1
                progress.bytes += f.size
            # modes last, deepest first: a directory without write permission is still filled
            for d in sorted(manifest.dirs, key=lambda d: d.path.count("/"), reverse=True):
                fd = _beneath(root, d.path, owner)
                try:
                    os.fchmod(fd, d.mode)
                finally:
                    os.close(fd)
        except BaseException:
            _empty(root, directory)
            raise
    finally:
        os.close(root)


def _open_root(directory: Path) -> int:
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise CheckpointUnusable(f"cannot make {directory}: {e.strerror}") from e
    try:
        return os.open(directory, _DIR)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CheckpointUnusable(f"{directory} is not a directory (a symlink or a file)") from e
        raise CheckpointUnusable(f"cannot open {directory}: {e.strerror}") from e


def _beneath(root: int, rel: str, owner: Owner | None) -> int:
    """The directory at ``rel`` under ``root`` (``""``: ``root`` itself), made where missing (with
    ``owner``), each component opened relative to the one before without following a symlink."""
    fd = os.dup(root)
    try:
        for part in rel.split("/") if rel else []:
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o700, dir_fd=fd)
                child = os.open(part, _DIR, dir_fd=fd)
                if owner is not None:
                    os.fchown(child, *owner)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise CheckpointUnusable(f"{rel[:80]!r}: a symlink or a file stands where a directory goes") from e
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_file(root: int, f: CheckpointFile, fetch: Fetch, owner: Owner | None) -> None:
    parent, _, name = f.path.rpartition("/")
    pfd = _beneath(root, parent, owner)
    part = f"{_PART}{secrets.token_hex(8)}"
    try:
        # /proc/self/fd/N is the directory opened above, whatever the path to it holds meanwhile
        fetch(f, Path(f"/proc/self/fd/{pfd}/{part}"))
        fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        try:
            size, sha256 = _hash(fd)
            if (size, sha256) != (f.size, f.sha256):
                raise CheckpointUnusable(
                    f"the blob of {f.path[:80]!r} holds {size} bytes of SHA-256 {sha256[:12]}..., "
                    f"not the {f.size} of {f.sha256[:12]}... its manifest names"
                )
            os.fchmod(fd, f.mode)
            if owner is not None:
                os.fchown(fd, *owner)
            os.utime(fd, ns=(f.mtime_ns, f.mtime_ns))
        finally:
            os.close(fd)
        try:
            os.rename(part, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except OSError as e:  # a directory of that name: another entry of the manifest's
            raise CheckpointUnusable(f"{f.path[:80]!r} cannot be written: {e.strerror}") from e
    finally:
        with suppress(FileNotFoundError):
            os.unlink(part, dir_fd=pfd)
        os.close(pfd)


def _hash(fd: int) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, _CHUNK):
        size += len(chunk)
        digest.update(chunk)
    return size, digest.hexdigest()


def _empty(root: int, directory: Path) -> None:
    """Remove what a failed restore wrote into ``directory`` (it was empty before)."""
    for name in _names(root):
        remove_tree(directory / name)


def _names(fd: int) -> list[str]:
    with os.scandir(fd) as listing:
        return [entry.name for entry in listing]
