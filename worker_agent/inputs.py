"""Run inputs in a content-addressed cache that several agents may share (e.g. on NFS).

Layout under the cache root::

    <key>/content      the file or directory, complete and never changed once there
    <key>/done         written last: the entry is complete
    <key>/users/<id>   one file per run using the entry (never evicted while any exist)
    <key>/owners/<h>   an upload's: one file per owner whose own archive matched it
    <key>.lock         flock'ed while the entry is downloaded, evicted or its users change

An input downloads once, whoever asks first: the others wait on the lock and then find it
done. An upload (``upload:<sha256>``) is keyed by its SHA-256 (``upload-<sha256>``): its
archive is checked against it and unpacked (``unpack.py``) as ``content``, the bytes it unpacked
to in ``<key>/size``. Its owners are marked in ``<key>/owners/``: an owner is marked only once
their own archive was downloaded and matched the SHA-256, and uses the entry only then (the
store checks only the MD5 of what someone sends: a SHA-256 another user's run made known is no
key to their tree). Entries are evicted least-recently-used first when the cache grows over its limit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from runplane.domain.errors import Forbidden, InvalidRequest, NotFound, PayloadTooLarge, RunplaneError
from runplane.domain.states import RunState
from runplane.domain.units import format_bytes
from runplane.domain.uploads import (
    DEFAULT_MAX_UPLOAD_BYTES,
    MAX_UNPACKED_BYTES_FACTOR,
    MAX_UNPACKED_FILES,
    upload_key,
    upload_sha,
)
from runplane.ports import InputRules, ObjectStore, RunStore
from runplane.services.inputs import InputPolicy
from runplane.services.logs import outputs_prefix
from worker_agent.unpack import UnsafeArchive, unpack
from worker_agent.usage import dir_size

log = logging.getLogger(__name__)


class InputUnavailable(RunplaneError):
    code = "input_unavailable"


@dataclass(frozen=True)
class Resolved:
    """Where an input's bytes are: objects under ``prefix`` in ``store`` (one object if ``single``),
    ``size`` bytes in all as the store lists them."""

    store: ObjectStore
    prefix: str
    single: bool
    version: str
    size: int = 0


@dataclass(frozen=True)
class Fetched:
    path: Path
    key: str
    downloaded: bool
    size: int = 0
    """Bytes of the input, as the store listed them (the cached copy holds just these)."""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class InputCache:
    """``policy`` is the stack's (the operator's allow-list and the stack's own bucket): every
    source is checked against it and the run's owner before a byte is read, whatever the API
    accepted. The default policy allows no bucket. An upload unpacks to at most
    ``max_upload_bytes`` (the stack's) times MAX_UNPACKED_BYTES_FACTOR bytes."""

    def __init__(
        self,
        root: Path,
        objects: ObjectStore,
        store: RunStore,
        max_bytes: int | None = None,
        policy: InputRules | None = None,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    ) -> None:
        self.root = root
        self.objects = objects
        self.store = store
        self.max_bytes = max_bytes
        self.policy = policy or InputPolicy()
        self.max_upload_bytes = max_upload_bytes
        self.max_unpacked_bytes = max_upload_bytes * MAX_UNPACKED_BYTES_FACTOR

    # -- resolving a source ---------------------------------------------------------------

    def resolve(self, source: str, owner: str, groups: Iterable[str] = ()) -> Resolved:
        """Find the objects behind ``s3://bucket/key``, ``run:<id>[/path]`` or ``upload:<sha256>``
        for a run of ``owner`` (a member of ``groups``). Raises InputUnavailable, also for a source
        the owner may not read (another user's run or upload reads as one that does not exist)."""
        sha = upload_sha(source)
        if sha is not None:
            # a HEAD, as the API's check at submit: workers may read uploads/, not list it
            key = upload_key(owner, sha)
            try:
                found = self.objects.head(key)
            except RunplaneError as e:
                if not _missing(e):
                    raise InputUnavailable(f"{source}: cannot read it: {e.message}") from e
                raise InputUnavailable(upload_gone(sha, denied=_denied(e))) from e
            if found is None:
                raise InputUnavailable(upload_gone(sha))
            return Resolved(self.objects, key, True, sha, found.size)
        if source.startswith("s3://"):
            try:
                self.policy.check(source, source, groups)
            except InvalidRequest as e:
                raise InputUnavailable(e.message.removeprefix(f"input {source}: ")) from e
            bucket, _, key = source[5:].partition("/")
            store = self.objects.within(bucket)
            return self._listing(store, key, source)
        run_id, _, path = source[4:].partition("/")
        try:
            run = self.store.get(run_id)
        except NotFound:
            run = None
        if run is None or run.owner != owner:
            raise InputUnavailable(f"{source}: run {run_id} does not exist")
        if run.state != RunState.SUCCEEDED:
            raise InputUnavailable(f"{source}: run {run_id} is {run.state}, not succeeded")
        return self._listing(self.objects, outputs_prefix(run.id, run.attempt) + path, source)

    @staticmethod
    def _listing(store: ObjectStore, key: str, source: str) -> Resolved:
        try:
            objects = store.list(key)
        except RunplaneError as e:
            raise InputUnavailable(f"{source}: cannot list it: {e.message}") from e
        exact = [o for o in objects if o.key == key]
        if exact and not key.endswith("/"):
            obj = exact[0]
            return Resolved(store, key, True, f"{obj.key}:{obj.size}:{obj.etag}", obj.size)
        prefix = key if key.endswith("/") or not key else key + "/"
        inside = [o for o in objects if o.key.startswith(prefix)]
        if not inside:
            raise InputUnavailable(f"{source}: nothing there")
        version = "\n".join(f"{o.key}:{o.size}:{o.etag}" for o in inside)
        return Resolved(store, prefix, False, version, sum(o.size for o in inside))

    # -- the cache ------------------------------------------------------------------------

    def fetch(
        self, source: str, user: str, *, owner: str, groups: Iterable[str] = (), max_bytes: int | None = None
    ) -> Fetched:
        """The input's local path for a run of ``owner`` (see ``resolve``), downloaded unless a
        complete copy is cached; registers ``user`` so the entry is not evicted until ``release``.
        An input of more than ``max_bytes`` (what the run's disk has left for it) is refused
        before a byte is read, as the store lists its size, and its download stops once past it
        (an object that grew since). Raises InputUnavailable."""
        resolved = self.resolve(source, owner, groups)
        if max_bytes is not None and resolved.size > max_bytes:
            raise InputUnavailable(_too_large(source, f"is {format_bytes(resolved.size)}", max_bytes))
        sha = upload_sha(source)
        if sha and resolved.size > self.max_upload_bytes:
            raise InputUnavailable(
                _too_large_upload(source, f"is {format_bytes(resolved.size)}", self.max_upload_bytes)
            )
        key = f"upload-{sha}" if sha else hashlib.sha256(f"{source}\n{resolved.version}".encode()).hexdigest()[:32]
        entry = self.root / key
        downloaded = False
        size = resolved.size
        with _locked(self.root / f"{key}.lock"):
            done = (entry / "done").exists()
            if not done:
                shutil.rmtree(entry, ignore_errors=True)
            if sha and not (done and _owner_mark(entry, owner).exists()):
                self._download_upload(resolved, entry, source, sha, max_bytes, owner)
                downloaded = True
            elif not done:
                self._download(resolved, entry, source, max_bytes)
                downloaded = True
            if sha:
                size = _unpacked_size(entry)
                if max_bytes is not None and size > max_bytes:
                    raise InputUnavailable(_too_large(source, f"unpacks to {format_bytes(size)}", max_bytes))
            (entry / "users").mkdir(exist_ok=True)
            (entry / "users" / user).touch()
            os.utime(entry / "done")  # the LRU clock
        return Fetched(entry / "content", key, downloaded, size)

    def _download_upload(
        self, resolved: Resolved, entry: Path, source: str, sha: str, max_bytes: int | None, owner: str
    ) -> None:
        """``owner``'s archive, its SHA-256 checked, unpacked into ``entry``'s content: at most
        ``max_bytes`` (what the run's disk has left) and the stack's unpacked limit, its download
        stopped past ``max_bytes`` and the stack's ``max_upload_bytes`` (Azure's SAS cannot bind
        the length of a PUT: the object may be larger than its upload said); ``owner``
        marked in the entry as one who may use it. An entry complete already (unpacked from
        another owner's archive of the same SHA-256) is not unpacked again: the owner is marked
        once their own archive matched it (the store checked only the MD5 of what they sent)."""
        tmp = self.root / f".partial-{uuid.uuid4().hex}"
        limit = self.max_unpacked_bytes if max_bytes is None else min(max_bytes, self.max_unpacked_bytes)
        fetch_limit = self.max_upload_bytes if max_bytes is None else min(max_bytes, self.max_upload_bytes)
        try:
            tmp.mkdir(parents=True)
            archive = tmp / "archive"
            resolved.store.download_file(resolved.prefix, archive, fetch_limit)
            if _sha256(archive) != sha:
                raise InputUnavailable(f"{source}: the archive stored does not match its SHA-256")
            if (entry / "done").exists():
                _mark_owner(entry, owner)
                return
            size = unpack(archive, tmp / "content", max_bytes=limit, max_files=MAX_UNPACKED_FILES)
            archive.unlink()
            _mark_owner(tmp, owner)
            (tmp / "size").write_text(str(size))
            (tmp / "done").write_text(source)
            tmp.rename(entry)
        except UnsafeArchive as e:
            raise InputUnavailable(f"{source}: refused: {e.message}") from e
        except PayloadTooLarge as e:
            if max_bytes is not None and max_bytes <= self.max_upload_bytes:
                raise InputUnavailable(_too_large(source, "grew since it was listed", max_bytes)) from e
            raise InputUnavailable(_too_large_upload(source, "grew since it was listed", self.max_upload_bytes)) from e
        except InputUnavailable:
            raise
        except RunplaneError as e:
            if _missing(e):  # deleted since its HEAD
                raise InputUnavailable(upload_gone(sha, denied=_denied(e))) from e
            raise InputUnavailable(f"{source}: download failed: {e.message}") from e
        except OSError as e:
            raise InputUnavailable(f"{source}: download failed: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _download(self, resolved: Resolved, entry: Path, source: str, max_bytes: int | None = None) -> None:
        tmp = self.root / f".partial-{uuid.uuid4().hex}"
        left = max_bytes
        try:
            if resolved.single:
                tmp.mkdir(parents=True)
                resolved.store.download_file(resolved.prefix, tmp / "content", left)
            else:
                for obj in resolved.store.list(resolved.prefix):
                    rel = obj.key[len(resolved.prefix) :]
                    target = (tmp / "content" / rel).resolve()
                    if not rel or not target.is_relative_to((tmp / "content").resolve()):
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    resolved.store.download_file(obj.key, target, left)
                    if left is not None:
                        left -= target.stat().st_size
            for path in (tmp / "content").rglob("*") if not resolved.single else [tmp / "content"]:
                path.chmod(0o755 if path.is_dir() else 0o644)
            (tmp / "done").write_text(source)
            tmp.rename(entry)
        except PayloadTooLarge as e:
            raise InputUnavailable(_too_large(source, "grew since it was listed", max_bytes or 0)) from e
        except RunplaneError as e:
            raise InputUnavailable(f"{source}: download failed: {e.message}") from e
        except OSError as e:
            raise InputUnavailable(f"{source}: download failed: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def release(self, key: str, user: str) -> None:
        with _locked(self.root / f"{key}.lock"):
            (self.root / key / "users" / user).unlink(missing_ok=True)

    def entries(self) -> int:
        """How many inputs are cached and complete."""
        return sum(1 for _ in self.root.glob("*/done")) if self.root.exists() else 0

    def size(self) -> int:
        return dir_size(self.root)

    def evict(self) -> list[str]:
        """Remove least-recently-used entries no run uses until the cache fits its limit.

        It sizes the whole cache, every file of every entry, at each call (after every run):
        its cost grows with the cache, not the run. Entries never change once complete, so
        their sizes could be recorded at download and summed instead; not done yet."""
        if self.max_bytes is None or not self.root.exists():
            return []
        entries = []
        for done in self.root.glob("*/done"):
            entry = done.parent
            entries.append((done.stat().st_mtime, entry))
        total = self.size()
        removed = []
        for _, entry in sorted(entries):
            if total <= self.max_bytes:
                break
            with _locked(self.root / f"{entry.name}.lock"):
                users = entry / "users"
                if users.exists() and any(users.iterdir()):
                    continue
                size = dir_size(entry)
                shutil.rmtree(entry, ignore_errors=True)
            total -= size
            removed.append(entry.name)
        if removed:
            log.info("evicted %d cached input(s); cache now %d bytes", len(removed), total)
        return removed


def upload_gone(sha: str, *, denied: bool = False) -> str:
    """Why a run cannot have the upload ``sha``: its owner has no such object (any more), or, when the
    store ``denied`` the read (S3's 403, its answer for a missing key too), the worker may not read it."""
    role = ", or this worker's role cannot read uploads/ (ReadUploads)" if denied else ""
    return (
        f"upload {sha} is gone (it was deleted, or expired unused for as long as the stack keeps uploads{role}): "
        "upload the directory again (runplane run --upload sends it anew) and run again"
    )


_DENIED = frozenset({"403", "AccessDenied", "Forbidden"})


def _missing(e: RunplaneError) -> bool:
    """Whether ``e`` says an upload's object is not there: NotFound, or the 403 S3 answers for a
    missing key to a reader that may not list where it is (a worker's role without s3:ListBucket
    on uploads/). The stores' adapters end their messages with the store's code (never its words)."""
    return isinstance(e, (NotFound, Forbidden)) or e.message.rsplit(": ", 1)[-1] in _DENIED


def _denied(e: RunplaneError) -> bool:
    """Whether the store refused the read (403), rather than said the object is not there."""
    return not isinstance(e, NotFound)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


def _owner_mark(entry: Path, owner: str) -> Path:
    """The file that says ``owner``'s own archive matched an upload entry (their name hashed)."""
    return entry / "owners" / hashlib.sha256(owner.encode()).hexdigest()[:32]


def _mark_owner(entry: Path, owner: str) -> None:
    mark = _owner_mark(entry, owner)
    mark.parent.mkdir(exist_ok=True)
    mark.touch()


def _unpacked_size(entry: Path) -> int:
    """The bytes an upload's entry unpacked to, as recorded (counted afresh if not)."""
    try:
        return int((entry / "size").read_text())
    except (OSError, ValueError):
        return dir_size(entry / "content")


def _too_large_upload(source: str, what: str, max_upload_bytes: int) -> str:
    return f"{source} {what}, more than the {format_bytes(max_upload_bytes)} an upload may be"


def _too_large(source: str, what: str, max_bytes: int) -> str:
    return f"{source} {what}, more than the {format_bytes(max_bytes)} of the run's disk left for its inputs"
