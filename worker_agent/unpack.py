"""Unpacking an uploaded archive (a gzip'd tar) into a directory the agent owns, safely.

Member by member, each checked before anything of it is written, and written by this module
itself (``tarfile``'s own extraction, filters included, is not used):

- a name is relative, with no ``..`` component; ``./`` prefixes are dropped;
- only regular files, directories, symbolic links and hard links; devices, fifos and any other
  kind refuse the archive;
- a symbolic link is relative and, resolved from where it stands, stays in the tree; a hard link
  names a regular file the archive held before it;
- nothing is written through a link: each member's parent directory, resolved, is in the tree,
  and files are created exclusively without following a link (a second member of one name
  refuses the archive), so a link cannot make a later member land outside;
- at most ``max_files`` members and ``max_bytes`` bytes, counted from the headers before a byte
  is written (the bytes of files and ``ENTRY_BYTES`` for each member, as a file system spends
  at least a block on each, so many empty files count too), and the decompressed stream itself
  stops past what that allows (a decompression bomb stops there, whatever its headers say);
- the headers of a member (a GNU long name or link, pax headers, which ``tarfile`` reads whole
  into memory) are at most ``MAX_HEADER_BYTES`` in all: the stream stops past them too;
- files are 0644 (0755 if the archive made them executable), directories 0755: no set-id bits,
  no owner from the archive.

Once all is unpacked, every link is resolved again (a chain of links is checked as a whole).
Anything refused raises ``UnsafeArchive``; the caller removes the partial directory."""

from __future__ import annotations

import gzip
import os
import posixpath
import stat
import tarfile
import zlib
from pathlib import Path

from runplane.domain.errors import RunplaneError

_BLOCK = 1024 * 1024
_HEADER_ALLOWANCE = 1536
"""Stream bytes per member beyond its content: its header block and padding (pax headers aside)."""
_STREAM_SLACK = 1024 * 1024
ENTRY_BYTES = 4096
"""The bytes each member counts for beyond its content (a file system block, an inode)."""
MAX_HEADER_BYTES = 1024 * 1024
"""The stream bytes a member's headers (long names and links, pax headers) may take in all."""
_READ_AHEAD = tarfile.RECORDSIZE
"""How far ``tarfile``'s stream reads past where it stands."""


class UnsafeArchive(RunplaneError):
    code = "unsafe_archive"


class _Capped:
    """A read-only stream that refuses to give more than ``limit`` bytes in all, nor past
    ``header_end`` (where the next member's headers must have ended) until it is moved on."""

    def __init__(self, raw: gzip.GzipFile, limit: int) -> None:
        self.raw = raw
        self.limit = limit
        self.header_end = MAX_HEADER_BYTES + _READ_AHEAD
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        allowed = min(self.limit, self.header_end) - self.read_bytes + 1
        data = self.raw.read(allowed if size < 0 else min(size, allowed))
        self.read_bytes += len(data)
        if self.read_bytes > self.limit:
            raise UnsafeArchive(f"the archive unpacks to more than {self.limit} bytes")
        if self.read_bytes > self.header_end:
            raise UnsafeArchive(f"the archive has a header of more than {MAX_HEADER_BYTES} bytes")
        return data


def member_name(name: str) -> str:
    """``name`` as a path relative to the tree ("" for the tree itself); refuses an absolute name
    or one with a ``..`` component."""
    if name.startswith("/") or "\\" in name or "\x00" in name:
        raise UnsafeArchive(f"the archive names {name!r}: not a relative path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"the archive names {name!r}: it leaves the directory")
    return "/".join(parts)


def _inside(root: Path, path: Path) -> bool:
    return path == root or path.is_relative_to(root)


def unpack(archive: Path, dest: Path, *, max_bytes: int, max_files: int) -> int:
    """Unpack the gzip'd tar ``archive`` into ``dest`` (made here; it must not exist); the bytes
    it counts for (its files' and ``ENTRY_BYTES`` a member). Raises UnsafeArchive for an archive
    it will not unpack (see the module)."""
    dest.mkdir(mode=0o755)
    root = dest.resolve()
    files: set[str] = set()
    total = members = 0
    cap = max_bytes + max_files * _HEADER_ALLOWANCE + _STREAM_SLACK
    try:
        with gzip.open(archive, "rb") as raw:
            stream = _Capped(raw, cap)
            with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    stream.header_end = tar.offset + MAX_HEADER_BYTES + _READ_AHEAD  # the next member's
                    members += 1
                    if members > max_files:
                        raise UnsafeArchive(f"the archive holds more than {max_files} entries")
                    total += ENTRY_BYTES
                    if total > max_bytes:
                        raise UnsafeArchive("the archive unpacks to more bytes than its limit allows")
                    try:
                        total += _member(tar, member, root, files, max_bytes - total)
                    except gzip.BadGzipFile:
                        raise
                    except (OSError, RuntimeError) as e:  # RuntimeError: a loop of links (Path.resolve)
                        why = e.strerror if isinstance(e, OSError) and e.strerror else "a loop of links"
                        raise UnsafeArchive(f"the archive's {member.name!r} cannot be unpacked: {why}") from e
        _check_links(root)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UnsafeArchive(f"not a gzip'd tar archive: {e}") from e
    return total


def _member(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path, files: set[str], left: int) -> int:
    name = member_name(member.name)
    if not name:
        if member.isdir():
            return 0
        raise UnsafeArchive(f"the archive names {member.name!r} for something not a directory")
    target = root / name
    if not _inside(root, target.parent.resolve()):
        raise UnsafeArchive(f"the archive puts {member.name!r} behind a link out of the directory")
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if member.isdir():
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise UnsafeArchive(f"the archive names {member.name!r} twice")
        target.mkdir(mode=0o755, exist_ok=True)
        return 0
    if os.path.lexists(target):
        raise UnsafeArchive(f"the archive names {member.name!r} twice")
    if member.isreg():
        _file(tar, member, target, left)
        files.add(name)
        return member.size
    if member.issym():
        _symlink(member, name, target)
        return 0
    if member.islnk():
        _hardlink(member, root, target, files)
        return 0
    kind = "a device" if member.ischr() or member.isblk() else "a fifo" if member.isfifo() else "an entry"
    raise UnsafeArchive(f"the archive's {member.name!r} is {kind}, not a file, directory or link")


def _file(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, left: int) -> None:
    if member.size > left:
        raise UnsafeArchive("the archive unpacks to more bytes than its limit allows")
    source = tar.extractfile(member)
    if source is None:
        raise UnsafeArchive(f"the archive's {member.name!r} cannot be read")
    mode = 0o755 if member.mode & 0o111 else 0o644
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out:
        written = 0
        while block := source.read(_BLOCK):
            written += len(block)
            if written > member.size:
                raise UnsafeArchive(f"the archive's {member.name!r} is longer than it says")
            out.write(block)
    target.chmod(mode)  # whatever the umask


def _symlink(member: tarfile.TarInfo, name: str, target: Path) -> None:
    link = member.linkname
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
    if not link or link.startswith("/") or lexical == ".." or lexical.startswith("../"):
        raise UnsafeArchive(f"the archive's link {member.name!r} points out of the directory")
    target.symlink_to(link)


def _hardlink(member: tarfile.TarInfo, root: Path, target: Path, files: set[str]) -> None:
    linked = member_name(member.linkname)
    if linked not in files:
        raise UnsafeArchive(f"the archive's hard link {member.name!r} names no file before it")
    source = root / linked
    if not _inside(root, source.resolve()):
        raise UnsafeArchive(f"the archive's hard link {member.name!r} points out of the directory")
    os.link(source, target, follow_symlinks=False)


def _check_links(root: Path) -> None:
    """Every link in the tree, resolved as a whole (a chain of them), stays in it."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if not stat.S_ISLNK(path.lstat().st_mode):
                continue
            rel = path.relative_to(root)
            try:
                resolved = path.resolve()
            except (OSError, RuntimeError) as e:  # RuntimeError: a loop of links
                raise UnsafeArchive(f"the archive's link {str(rel)!r} loops or cannot be resolved") from e
            if not _inside(root, resolved):
                raise UnsafeArchive(f"the archive's link {str(rel)!r} points out of the directory")
