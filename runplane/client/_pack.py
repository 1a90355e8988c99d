"""Packing a directory for an upload: one gzip'd tar archive, the same bytes for the same content.

The archive holds the directory's files, directories and symlinks (a symlink only if it points
inside the directory), their names relative to it, in sorted order, each with mtime 0, uid and gid
0, no owner names and mode 0644 (0755 for directories, symlinks and files with an execute bit), so
that the SHA-256 of the archive names the content: packing it again gives the same hash, and the
API answers that the upload is already there.

What ``.gitignore`` and ``.runplaneignore`` at the directory's top name is left out, and ``.git``
always is. The matcher knows the usual patterns: ``name`` (at any depth), ``dir/`` (directories
only), ``/anchored`` and ``a/b`` (from the top), ``*``, ``?``, ``[abc]``, ``**`` (``**/x``,
``x/**``, ``a/**/b``), ``!negation`` (the last pattern that matches wins; a file inside a left-out
directory cannot be brought back) and ``#`` comments. Not supported: ``.gitignore`` files below
the top, git's global and ``info/exclude`` files, and backslash escapes other than ``\\#`` and
``\\!``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from runplane.domain.uploads import DEFAULT_MAX_UPLOAD_BYTES, MAX_UNPACKED_BYTES_FACTOR, MAX_UNPACKED_FILES

IGNORE_FILES = (".gitignore", ".runplaneignore")
"""The files at a directory's top whose patterns leave files out of its archive, read in this order."""
ALWAYS_LEFT_OUT = frozenset({".git"})
"""Names never packed, at any depth."""


class PackError(ValueError):
    """A directory that cannot be packed (a symlink out of it, a device, too large); the message is one line."""


@dataclass(frozen=True)
class Rule:
    """One pattern of an ignore file."""

    regex: re.Pattern[str]
    negated: bool
    dirs_only: bool


def _glob(pattern: str) -> str:
    """The regular expression of a glob over a relative path (``*`` and ``?`` stay within one name)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def rule(line: str) -> Rule | None:
    """The rule of one line of an ignore file; None for a blank line or a comment."""
    line = line.rstrip("\n").rstrip()
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated or line.startswith(("\\#", "\\!")):
        line = line[1:]
    dirs_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    head = "^" if anchored else "^(?:.*/)?"
    return Rule(re.compile(head + _glob(line) + "$"), negated, dirs_only)


class Ignore:
    """The rules of a directory's ignore files; ``left_out`` says whether a relative path is."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules

    @classmethod
    def of(cls, top: Path) -> Ignore:
        rules: list[Rule] = []
        for name in IGNORE_FILES:
            path = top / name
            if path.is_file() and not path.is_symlink():
                text = path.read_text(encoding="utf-8", errors="replace")
                rules += [r for line in text.splitlines() if (r := rule(line)) is not None]
        return cls(rules)

    def left_out(self, relative: str, is_dir: bool) -> bool:
        if relative.rsplit("/", 1)[-1] in ALWAYS_LEFT_OUT:
            return True
        verdict = False
        for r in self.rules:
            if (is_dir or not r.dirs_only) and r.regex.match(relative):
                verdict = not r.negated
        return verdict


@dataclass(frozen=True)
class Entry:
    """One thing to pack: its path relative to the top (``/``-separated) and its kind."""

    relative: str
    path: Path
    kind: str  # "dir", "file" or "link"
    size: int = 0
    executable: bool = False
    target: str = ""


def entries(top: Path) -> Iterator[Entry]:
    """What the archive of ``top`` holds, in sorted order, without what its ignore files leave out.
    Raises PackError for a symlink that leaves the directory or a thing that is not a file, a
    directory or a symlink."""
    real_top = top.resolve()
    ignore = Ignore.of(top)

    def walk(directory: Path, prefix: str) -> Iterator[Entry]:
        try:
            names = sorted(p.name for p in directory.iterdir())
        except OSError as e:
            raise PackError(f"cannot read {directory}: {e.strerror}") from None
        for name in names:
            path = directory / name
            relative = prefix + name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                if ignore.left_out(relative, path.is_dir()):
                    continue
                target = str(path.readlink())
                if Path(target).is_absolute() or not Path(os.path.realpath(path)).is_relative_to(real_top):
                    raise PackError(
                        f"{relative} is a symlink to {target}, outside {top}: leave it out in .runplaneignore"
                    )
                yield Entry(relative, path, "link", target=target)
            elif stat.S_ISDIR(st.st_mode):
                if ignore.left_out(relative, True):
                    continue
                yield Entry(relative, path, "dir")
                yield from walk(path, relative + "/")
            elif stat.S_ISREG(st.st_mode):
                if ignore.left_out(relative, False):
                    continue
                yield Entry(relative, path, "file", st.st_size, bool(st.st_mode & 0o111))
            elif not ignore.left_out(relative, False):
                raise PackError(f"{relative} is not a file, a directory or a symlink: leave it out in .runplaneignore")

    yield from walk(top, "")


@dataclass
class Packed:
    """A directory's archive: in ``file`` (a temporary file, removed by ``close``), its SHA-256
    (hex), the base64 of its MD5 (what ``Content-MD5`` carries), its size and how many entries it holds."""

    directory: Path
    file: IO[bytes]
    sha256: str
    md5: str
    size: int
    entries: int

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        self.file.seek(0)
        while chunk := self.file.read(size):
            yield chunk

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Packed:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Hashing(io.RawIOBase):
    """A file that hashes and counts what it is written, and refuses more than ``limit`` bytes."""

    def __init__(self, out: IO[bytes], limit: int, directory: Path) -> None:
        self.out, self.limit, self.directory = out, limit, directory
        self.sha, self.md5, self.size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.size += len(data)
        if self.size > self.limit:
            raise PackError(f"{self.directory} packs to more than {_mib(self.limit)}, the upload limit: {_hint()}")
        self.sha.update(data)
        self.md5.update(data)
        self.out.write(data)
        return len(data)


def _mib(n: int) -> str:
    return f"{n / 1024**2:.0f} MiB" if n >= 1024**2 else f"{n} bytes"


def _hint() -> str:
    return "leave files out with a .runplaneignore (the .gitignore syntax) at its top"


def _info(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.relative)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o644
    if entry.kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif entry.kind == "link":
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o755, entry.target
    else:
        info.size = entry.size
        if entry.executable:
            info.mode = 0o755
    return info


def pack(directory: str | Path, max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES) -> Packed:
    """The archive of ``directory`` (see the module). Raises PackError for a directory that is
    not one, a symlink out of it, a device, socket or fifo in it, contents over what an archive
    may unpack to (more than MAX_UNPACKED_FILES entries, or more than MAX_UNPACKED_BYTES_FACTOR
    times ``max_bytes``), or an archive over ``max_bytes`` (as soon as it passes it)."""
    top = Path(directory).expanduser()
    if not top.is_dir():
        raise PackError(f"{directory} is not a directory")
    out = tempfile.TemporaryFile()  # noqa: SIM115 (Packed holds it; close() removes it)
    try:
        sink = _Hashing(out, max_bytes, top)
        count = unpacked = 0
        with (
            gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=6) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for entry in entries(top):
                count += 1
                unpacked += entry.size
                if count > MAX_UNPACKED_FILES:
                    raise PackError(f"{top} holds more than {MAX_UNPACKED_FILES} files and directories: {_hint()}")
                if unpacked > max_bytes * MAX_UNPACKED_BYTES_FACTOR:
                    limit = _mib(max_bytes * MAX_UNPACKED_BYTES_FACTOR)
                    raise PackError(f"{top} holds more than {limit}, the most an upload unpacks to: {_hint()}")
                info = _info(entry)
                if entry.kind != "file":
                    tar.addfile(info)
                    continue
                with entry.path.open("rb") as f:
                    tar.addfile(info, f)
        md5 = base64.b64encode(sink.md5.digest()).decode()
        return Packed(top, out, sink.sha.hexdigest(), md5, sink.size, count)
    except BaseException:
        out.close()
        raise
