"""Who a run's command runs as: the image's USER read as numbers from the image's own
``/etc/passwd`` and ``/etc/group``, with uid 0 only where the pool allows root.

Docker resolves USER inside the container at start, so a uid 0 spelt ``0000``, ``+0`` or as a
name whose passwd uid is 0 slips past any check of the text. Here the image's account files are
read first (from a container that is created, never started, and removed), USER is resolved
the way runc does, and the run gets ``user="UID:GID"`` in numbers. The pure part (parsing and
resolving) is separate from the Docker part (reading the files), so it is tested on text.
"""

from __future__ import annotations

import contextlib
import io
import logging
import posixpath
import re
import tarfile
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import docker.errors
import requests

log = logging.getLogger(__name__)

NOBODY = 65534
"""The uid and gid of runs that may not be root (``nobody``/``nogroup`` on most distributions)."""
RUN_HOME = "/runplane/home"
"""HOME of runs whose own home is missing or not writable: a directory of the run (counted
against its disk), owned by its uid."""
_MAX_ID = 2**31 - 2
_NUMBER = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi (and so runc) takes for a number


class UnknownUser(Exception):
    """USER (or --run-user) names a user or group the image does not have, or is no valid id."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class PathInfo:
    """The first tar header of a path in an image: what it is and who owns it."""

    is_dir: bool
    uid: int
    gid: int
    mode: int


@dataclass(frozen=True)
class RunAs:
    """``user`` for Docker, and the HOME to set (None: leave the image's or Docker's)."""

    uid: int
    gid: int
    home: str | None = None

    @property
    def user(self) -> str:
        return f"{self.uid}:{self.gid}"

    @property
    def root(self) -> bool:
        return self.uid == 0


DEFAULT_RUN_AS = RunAs(NOBODY, NOBODY)


def _number(text: str) -> int | None:
    return int(text) if _NUMBER.fullmatch(text) else None


def parse_passwd(text: str) -> list[Account]:
    """Entries of an ``/etc/passwd``; malformed lines are skipped, as the C library does."""
    accounts = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) < 7 or not fields[0] or line.startswith(("#", "+", "-")):
            continue
        uid, gid = _number(fields[2]), _number(fields[3])
        if uid is None or gid is None:
            continue
        accounts.append(Account(fields[0], uid, gid, fields[5]))
    return accounts


def parse_groups(text: str) -> dict[str, int]:
    """Group name -> gid of an ``/etc/group`` (the first entry of a name wins)."""
    groups: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) < 3 or not fields[0] or line.startswith(("#", "+", "-")):
            continue
        gid = _number(fields[2])
        if gid is not None:
            groups.setdefault(fields[0], gid)
    return groups


def _check_id(value: int, what: str, text: str) -> int:
    if not 0 <= value <= _MAX_ID:
        raise UnknownUser(f"{what} {text!r} is not a valid id (0 to {_MAX_ID})")
    return value


def resolve(spec: str, passwd: list[Account], groups: dict[str, int]) -> tuple[int, int | None, Account | None]:
    """``USER`` as runc reads it: ``user``, ``uid``, ``user:group``, ``uid:gid`` (and mixes).
    Returns (uid, gid, the passwd entry used); gid is None where runc would fall back to 0 (a
    number with no passwd entry and no group). An empty spec is root. Raises UnknownUser."""
    user_text, _, group_text = spec.partition(":")
    if not user_text:
        user_text = "0"
    number = _number(user_text)
    if number is not None:
        uid = _check_id(number, "uid", user_text)
        entry = next((a for a in passwd if a.uid == uid), None)
    else:
        entry = next((a for a in passwd if a.name == user_text), None)
        if entry is None:
            raise UnknownUser(f"user {user_text!r} is not in the image's /etc/passwd")
        uid = _check_id(entry.uid, "uid of", user_text)
    gid: int | None = entry.gid if entry is not None else None
    if group_text:
        number = _number(group_text)
        if number is not None:
            gid = _check_id(number, "gid", group_text)
        elif group_text in groups:
            gid = _check_id(groups[group_text], "gid of", group_text)
        else:
            raise UnknownUser(f"group {group_text!r} is not in the image's /etc/group")
    return uid, gid, entry


def choose(
    setting: str,
    image_user: str,
    passwd: list[Account],
    groups: dict[str, int],
    allow_root: bool,
) -> tuple[int, int]:
    """(uid, gid) a run's command gets.

    ``setting`` is the agent's ``--run-user``: ``nobody`` runs the image's own user unless it is
    root, in any spelling, and then 65534:65534; ``image`` runs the image's user as Docker would,
    root included where the pool allows root; ``UID[:GID]`` is fixed. Uid 0 needs ``allow_root``
    in every case (else 65534:65534); a run that is not root never gets gid 0 (group root): a
    numeric uid with no group takes its passwd gid, else 65534. Raises UnknownUser."""
    fixed = setting not in ("nobody", "image")
    uid, gid, _ = resolve(setting if fixed else image_user, passwd, groups)
    if uid == 0:
        if allow_root and setting != "nobody":
            return 0, gid or 0
        return NOBODY, NOBODY
    return uid, gid if gid else NOBODY


def home_for(
    uid: int,
    gid: int,
    image_env: list[str],
    passwd: list[Account],
    stat: Callable[[str], PathInfo | None],
) -> str | None:
    """The HOME to give a run as ``uid:gid``, or None to leave what the image or Docker sets:
    the image's ``HOME`` variable, else the passwd home of the uid, else ``/`` (Docker's
    default), kept if it is a directory that user can write; else ``RUN_HOME``.
    ``stat(path) -> PathInfo | None`` looks a path up in the image."""
    home = next((e.partition("=")[2] for e in reversed(image_env) if e.startswith("HOME=")), None)
    if home is None:
        entry = next((a for a in passwd if a.uid == uid), None)
        home = entry.home if entry is not None else "/"
    info = stat(home) if home.startswith("/") else None
    if info is not None and info.is_dir and writable(info, uid, gid):
        return None
    return RUN_HOME


def writable(info: PathInfo, uid: int, gid: int) -> bool:
    if uid == 0:
        return True
    if info.uid == uid:
        return bool(info.mode & 0o200)
    if info.gid == gid:
        return bool(info.mode & 0o020)
    return bool(info.mode & 0o002)


class ImageUsers:
    """Resolves runs' users against each image's account files, read once per image id (and
    agent settings) and cached for the life of the agent. Thread-safe."""

    def __init__(self, client: docker.DockerClient, labels: dict[str, str] | None = None) -> None:
        self.client = client
        self.labels = labels or {}
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, bool], RunAs | UnknownUser] = {}

    def run_as(self, image: Any, setting: str, allow_root: bool) -> RunAs:
        """The user (and HOME) for a run of ``image`` (a docker Image). Raises UnknownUser, and
        docker.errors.APIError / requests.RequestException when the image cannot be read."""
        key = (str(image.id), setting, allow_root)
        with self._lock:
            known = self._cache.get(key)
        if known is None:
            try:
                known = self._read(image, setting, allow_root)
            except UnknownUser as e:
                known = e
            with self._lock:
                self._cache[key] = known
        if isinstance(known, UnknownUser):
            raise known
        return known

    def _read(self, image: Any, setting: str, allow_root: bool) -> RunAs:
        config = image.attrs.get("Config") or {}
        container = self.client.containers.create(
            image.id,
            entrypoint=["/runplane-never-started"],
            command=[],
            name=f"runplane-probe-{uuid.uuid4().hex[:12]}",
            network_mode="none",
            labels={**self.labels, "io.runplane.probe": "users"},
        )
        try:
            passwd = parse_passwd(_text(_read_file(container, "/etc/passwd")))
            groups = parse_groups(_text(_read_file(container, "/etc/group")))
            uid, gid = choose(setting, str(config.get("User") or ""), passwd, groups, allow_root)
            home = home_for(uid, gid, list(config.get("Env") or []), passwd, lambda p: _stat(container, p))
            return RunAs(uid, gid, home)
        finally:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True, v=True)


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


_CHUNK = 64 * 1024


def _first_member(container: Any, path: str, limit: int) -> tuple[tarfile.TarInfo, bytes] | None:
    """The first tar member of ``path`` in the container (the path itself) and up to ``limit``
    bytes of its content; None if the path does not exist. Reads no more of the archive than
    that: a home directory (or ``/``) may hold gigabytes."""
    try:
        chunks, _ = container.get_archive(path, chunk_size=_CHUNK)
    except docker.errors.NotFound:
        return None
    try:
        return first_member(chunks, limit)
    finally:
        chunks.close()  # the rest of the archive is never read


def first_member(chunks: Iterable[bytes], limit: int) -> tuple[tarfile.TarInfo, bytes] | None:
    """The first member of the tar stream ``chunks`` and up to ``limit`` bytes of its content
    (a file's), read as a stream: the extended headers before it (PAX, GNU long names, as an
    xattr or a long name or link target makes) are read as such, and nothing past the first
    member's content is. None for an empty archive. Raises tarfile.TarError."""
    with tarfile.open(fileobj=_Chunks(chunks), mode="r|") as tar:
        info = tar.next()
        if info is None:
            return None
        data = b""
        if info.isfile() and limit:
            member = tar.extractfile(info)
            data = member.read(limit) if member is not None else b""
        return info, data


class _Chunks(io.RawIOBase):
    """A readable file over an iterable of byte chunks (what tarfile's stream mode reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _resolve_link(path: str, info: tarfile.TarInfo) -> str:
    return posixpath.normpath(posixpath.join(posixpath.dirname(path), info.linkname))


def _read_file(container: Any, path: str, limit: int = 4 * 1024 * 1024) -> bytes | None:
    for _ in range(8):  # symlinks followed a few times, as /etc/passwd may be one
        try:
            found = _first_member(container, path, limit)
        except (docker.errors.APIError, requests.RequestException, tarfile.TarError) as e:
            log.warning("cannot read %s of the image: %s", path, e)
            return None
        if found is None:
            return None
        info, data = found
        if not info.issym():
            return data if info.isfile() else None
        path = _resolve_link(path, info)
    return None


def _stat(container: Any, path: str) -> PathInfo | None:
    for _ in range(8):
        try:
            found = _first_member(container, path, 0)
        except (docker.errors.APIError, requests.RequestException, tarfile.TarError):
            return None
        if found is None:
            return None
        info, _ = found
        if not info.issym():
            return PathInfo(info.isdir(), info.uid, info.gid, info.mode)
        path = _resolve_link(path, info)
    return None
