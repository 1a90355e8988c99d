"""Signed object URLs of a stack on one machine, and their answer: ``FileObjectStore.url`` signs
``GET /objects/<bucket>/<key>?expires=<unix time>&signature=<hex>`` with a key derived from the
stack's secret; the stack's front hands every request whose path starts with ``/objects/`` to
``serve``, which checks it (the signature compared in constant time, not expired, a key that
stays inside the objects directory) and answers the object as a download.

``FileObjectStore.put_url`` signs a PUT of the same shape whose signature also covers the size
and the MD5 the request must declare (``Content-Length``, ``Content-MD5``): its body is written to
a file of its own in ``objects/.partial`` and linked into place only when its length and MD5 are
the signed ones, and never over an object of other content."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import hmac
import json
import logging
import os
import re
import secrets as random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qsl, quote, unquote

from runplane.adapters.local.db import OBJECTS_DIR
from runplane.adapters.local.paths import (
    FOLDER_TRIES,
    PARTIAL_DIR,
    check_bucket,
    key_segments,
    make_folder,
    objects_dir,
    open_dir,
    open_file,
    open_object,
    place,
)
from runplane.domain.errors import BadRequest, RunplaneError

__all__ = [
    "MAX_URL_SECONDS",
    "PATH_PREFIX",
    "PUT_LIMITS",
    "ObjectAnswer",
    "PutLimits",
    "serve",
    "sign",
    "sign_put",
    "url_key",
]

MAX_URL_SECONDS = 7 * 24 * 3600
"""The longest a signed URL lasts, as on S3."""
PATH_PREFIX = f"/{OBJECTS_DIR}/"
"""The paths of the front that ``serve`` answers."""
log = logging.getLogger(__name__)
_URL_KEY_LABEL = b"runplane object URLs v1"
"""What the stack's secret signs to make the key of object URLs. It holds no NUL, which every
other message the secret signs does (ids derived from an Idempotency-Key)."""
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
MD5_PATTERN = re.compile(r"[A-Za-z0-9+/]{22}==")
"""The base64 of an MD5 digest, as ``Content-MD5`` holds it."""
_CHUNK = 1024 * 1024
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_EVERY_ANSWER = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}
_IN_FLIGHT: set[str] = set()
"""The signatures of the PUTs being received: one at a time per URL."""
_IN_FLIGHT_LOCK = threading.Lock()


@dataclass(frozen=True)
class PutLimits:
    """What a PUT of a signed URL must keep to. The disk holding the objects is the stack's
    database's too: a PUT is refused (507) unless its size and ``reserve_bytes`` or
    ``reserve_fraction`` of the file system, whichever is more, stay free. A body arriving at
    under ``min_bytes_per_second`` on average, once ``rate_after_seconds`` have passed, is cut
    off (408); one whose URL expired more than ``expiry_grace_seconds`` before it ended is
    refused (403)."""

    reserve_bytes: int = 1024**3
    reserve_fraction: float = 0.05
    rate_after_seconds: float = 30.0
    min_bytes_per_second: int = 64 * 1024
    expiry_grace_seconds: float = 60.0


PUT_LIMITS = PutLimits()


def url_key(secret: bytes) -> bytes:
    """The key object URLs are signed with, derived from the stack's secret."""
    return hmac.new(secret, _URL_KEY_LABEL, hashlib.sha256).digest()


def sign(key: bytes, bucket: str, object_key: str, expires: int) -> str:
    """The signature (hex) of a GET of ``bucket``/``object_key`` until ``expires`` (unix time).
    The bucket and the expiry hold no newline, so the message reads one way only."""
    message = f"GET\n{bucket}\n{expires}\n{object_key}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign_put(key: bytes, bucket: str, object_key: str, expires: int, size: int, md5: str) -> str:
    """The signature (hex) of a PUT of ``size`` bytes whose MD5 is ``md5`` (base64, which holds
    no newline) to ``bucket``/``object_key`` until ``expires``. It starts with another method than
    a GET's: neither signature stands for the other."""
    message = f"PUT\n{bucket}\n{expires}\n{size}\n{md5}\n{object_key}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class ObjectAnswer:
    """The front's answer to a request of an object URL. ``file``, when there is one, is the
    object, open: the front sends it as the body (none for HEAD) in chunks, of the length its
    ``Content-Length`` header gives, then closes it. Otherwise the body is ``body``."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    file: BinaryIO | None = None


def serve(
    root: Path,
    secret: Callable[[], bytes],
    method: str,
    path: str,
    query: str,
    clock: Callable[[], float] = time.time,
    headers: Mapping[str, str] | None = None,
    body: BinaryIO | None = None,
    limits: PutLimits = PUT_LIMITS,
) -> ObjectAnswer:
    """The answer to ``method`` of ``path`` (starting with ``PATH_PREFIX``) and ``query``, both
    still percent-encoded, for the stack whose state directory is ``root`` and whose secret is
    ``secret()``: the object, as an attachment, for a URL ``FileObjectStore.url`` signed that has
    not expired; 405 for a method other than GET, HEAD or PUT; 403 for a URL altered, unsigned or
    expired; 404 for an object that is not there (or a key that could not be one). A PUT (``put``)
    reads its body from ``body``, within ``limits``."""
    if method == "PUT":
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        return _put(root, secret, path, query, clock, lowered, body, limits)
    if method not in ("GET", "HEAD"):
        return _refused(405, "method_not_allowed", "object URLs answer GET, HEAD and PUT", Allow="GET, HEAD, PUT")
    parsed = _parse(path, query)
    if parsed is None:
        return _refused(403, "forbidden", "not an object URL this stack signed")
    bucket, key, expires, signature = parsed
    try:
        expected = sign(url_key(secret()), bucket, key, expires)
    except RunplaneError:  # the secret could not be read (the database is busy or broken)
        return _refused(503, "unavailable", "cannot check the URL now; try again", **{"Retry-After": "1"})
    if not hmac.compare_digest(expected, signature):
        return _refused(403, "forbidden", "the URL's signature does not match it")
    if expires < clock():
        return _refused(403, "forbidden", "the URL has expired")
    try:
        check_bucket(bucket)
        names = key_segments(key)
        found = open_object(root, bucket, names)
    except (BadRequest, OSError):
        return _refused(404, "not_found", "no such object")
    size = os.fstat(found.fileno()).st_size
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Disposition": disposition(names[-1]),
        "Content-Length": str(size),
        **_EVERY_ANSWER,
    }
    return ObjectAnswer(200, headers, file=found)


def disposition(name: str) -> str:
    """``Content-Disposition`` of a download saved as ``name``: a plain ASCII fallback, quoted,
    and the name itself percent-encoded (RFC 6266), so no header can be split or a path given."""
    plain = _SAFE_NAME.sub("_", name)[:150].lstrip(".") or "download"
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(name, safe='')}"


def _parse(path: str, query: str) -> tuple[str, str, int, str] | None:
    """The bucket, key, expiry and signature of an object URL; None for anything else."""
    if not path.startswith(PATH_PREFIX):
        return None
    raw_bucket, slash, raw_key = path[len(PATH_PREFIX) :].partition("/")
    if not slash:
        return None
    try:
        bucket, key = unquote(raw_bucket, errors="strict"), unquote(raw_key, errors="strict")
    except UnicodeDecodeError:
        return None
    try:
        fields = parse_qsl(query, keep_blank_values=True, max_num_fields=2)
    except ValueError:  # more fields than a signed URL has
        return None
    values = dict(fields)
    if len(fields) != 2 or set(values) != {"expires", "signature"}:
        return None
    expires, signature = values["expires"], values["signature"]
    if not (expires.isascii() and expires.isdigit() and len(expires) <= 12) or not _SIGNATURE.fullmatch(signature):
        return None
    return bucket, key, int(expires), signature


def _refused(status: int, code: str, message: str, **headers: str) -> ObjectAnswer:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    every = {"Content-Type": "application/json", "Content-Length": str(len(body)), **_EVERY_ANSWER}
    return ObjectAnswer(status, {**every, **headers}, body)


def _put(
    root: Path,
    secret: Callable[[], bytes],
    path: str,
    query: str,
    clock: Callable[[], float],
    headers: dict[str, str],
    body: BinaryIO | None,
    limits: PutLimits,
) -> ObjectAnswer:
    """The answer to a PUT of a signed URL: 200 once the object holds the body (or already held
    these very bytes); 403 for a URL altered, unsigned, expired (or expired long before its body
    ended), or a size or MD5 declared other than the signed ones; 400 for a body whose length or
    MD5 is not what was declared; 408 for a body too slow; 409 where an object of other content
    is, or while another PUT of the same URL is received; 404 where no object can be (no bucket,
    a key outside the tree); 507 where the disk would keep too little free."""
    parsed = _parse(path, query)
    if parsed is None:
        return _refused(403, "forbidden", "not an object URL this stack signed")
    bucket, key, expires, signature = parsed
    md5, length = headers.get("content-md5", ""), headers.get("content-length", "")
    if not MD5_PATTERN.fullmatch(md5):
        return _refused(400, "bad_request", "Content-MD5 (the base64 of the MD5 of the body) is required")
    if "chunked" in headers.get("transfer-encoding", "").lower() or not (
        length.isascii() and length.isdigit() and len(length) <= 15
    ):
        return _refused(411, "length_required", "a PUT gives its Content-Length (not chunked)")
    size = int(length)
    try:
        expected = sign_put(url_key(secret()), bucket, key, expires, size, md5)
    except RunplaneError:
        return _refused(503, "unavailable", "cannot check the URL now; try again", **{"Retry-After": "1"})
    if not hmac.compare_digest(expected, signature):
        return _refused(403, "forbidden", "the URL's signature does not match it, its Content-Length or Content-MD5")
    if expires < clock():
        return _refused(403, "forbidden", "the URL has expired")
    try:
        check_bucket(bucket)
        names = key_segments(key)
    except BadRequest:
        return _refused(404, "not_found", "no such bucket or key")
    with _IN_FLIGHT_LOCK:
        if signature in _IN_FLIGHT:
            return _refused(409, "conflict", "a PUT of this URL is being received; one at a time")
        _IN_FLIGHT.add(signature)
    try:

        def expired() -> bool:
            return clock() > expires + limits.expiry_grace_seconds

        return _receive(root, bucket, names, body, size, base64.b64decode(md5), limits, expired)
    finally:
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard(signature)


def _receive(
    root: Path,
    bucket: str,
    names: list[str],
    body: BinaryIO | None,
    size: int,
    md5: bytes,
    limits: PutLimits,
    expired: Callable[[], bool],
) -> ObjectAnswer:
    """Write ``size`` bytes of ``body`` to a file of its own, and link it at ``names`` of
    ``bucket`` when their MD5 is ``md5``, the URL had not ``expired()`` (long) when they ended,
    and no other object is there."""
    with contextlib.ExitStack() as on:
        try:
            top = on.enter_context(objects_dir(root))
            disk = os.fstatvfs(top)
            bucket_fd = open_dir(top, bucket)
            on.callback(os.close, bucket_fd)
            partial = open_dir(top, PARTIAL_DIR, create=True)
            on.callback(os.close, partial)
            directory = on.enter_context(make_folder(bucket_fd, names[:-1]))
        except OSError:  # no bucket, or a link or an object where a folder is
            return _refused(404, "not_found", "no object can be stored at this key")
        reserve = max(limits.reserve_bytes, int(limits.reserve_fraction * disk.f_blocks * disk.f_frsize))
        if size + reserve > disk.f_bavail * disk.f_frsize:  # the disk is the database's too
            log.warning("PUT of %d bytes in bucket %s refused: the disk would keep too little free", size, bucket)
            return _refused(507, "insufficient_storage", "the stack has no room for this object now")
        temp = random.token_hex(12)
        digest = hashlib.md5(usedforsecurity=False)
        received = 0
        read = getattr(body, "read1", None) or getattr(body, "read", None)  # read1: what has arrived
        started = time.monotonic()
        try:
            with os.fdopen(os.open(temp, _WRITE_FLAGS, 0o600, dir_fd=partial), "wb") as f:
                while received < size and read is not None:
                    chunk = read(min(_CHUNK, size - received))
                    if not chunk:
                        break
                    received += len(chunk)
                    digest.update(chunk)
                    f.write(chunk)
                    if _too_slow(received, size, time.monotonic() - started, limits):
                        return _refused(408, "too_slow", "the body came too slowly (a PUT may not trickle)")
            if received != size:
                return _refused(400, "incomplete_body", f"the body ended after {received} of {size} bytes")
            if not hmac.compare_digest(digest.digest(), md5):
                return _refused(400, "bad_digest", "the MD5 of the body is not its Content-MD5")
            if expired():
                return _refused(403, "forbidden", "the URL expired before its body ended")
            try:
                refused = _link(on, bucket_fd, names, directory, partial, temp, size, md5)
                if refused is not None:
                    return refused
            except OSError as e:
                if e.errno in (errno.EISDIR, errno.EPERM):
                    return _refused(409, "conflict", "objects are stored under this key, as in a folder")
                raise
        except OSError as e:  # the disk is full, or the tree is broken: its text names paths, for our log only
            log.warning("PUT of %s in bucket %s failed: %s", "/".join(names), bucket, e)
            return _refused(503, "unavailable", "the object could not be stored; try again", **{"Retry-After": "1"})
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=partial)
    return ObjectAnswer(200, {"Content-Length": "0", **_EVERY_ANSWER})


def _too_slow(received: int, size: int, elapsed: float, limits: PutLimits) -> bool:
    """Whether a body of which ``received`` bytes came in ``elapsed`` seconds is below the
    least average rate, once the first seconds have passed."""
    return received < size and elapsed > limits.rate_after_seconds and received < limits.min_bytes_per_second * elapsed


def _link(
    on: contextlib.ExitStack,
    bucket_fd: int,
    names: list[str],
    directory: int,
    partial: int,
    temp: str,
    size: int,
    md5: bytes,
) -> ObjectAnswer | None:
    """Link the written file ``temp`` of ``partial`` at ``names`` of the bucket: None once the object
    holds it (or already held these very bytes), a 409 where an object of other content is. Raises
    OSError as the link does."""
    for tries_left in reversed(range(FOLDER_TRIES)):
        try:
            place(
                lambda into: os.link(temp, names[-1], src_dir_fd=partial, dst_dir_fd=into, follow_symlinks=False),
                on,
                bucket_fd,
                names[:-1],
                directory,
                temp,
                partial,
            )
            return None
        except FileExistsError:
            # looked at in the folder as it is now (a delete may have removed, and another put made
            # again, the one this put opened)
            directory = on.enter_context(make_folder(bucket_fd, names[:-1]))
            if _holds(directory, names[-1], size, md5):
                return None
            if _present(directory, names[-1]) or not tries_left:
                return _refused(409, "conflict", "an object of other content is at this key")
            # deleted between the link and the look: link again
    return None


def _present(directory: int, name: str) -> bool:
    """Whether anything is at ``name`` in ``directory``."""
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _holds(directory: int, name: str, size: int, md5: bytes) -> bool:
    """Whether the object ``name`` of ``directory`` is ``size`` bytes whose MD5 is ``md5``."""
    try:
        with open_file(directory, name) as f:
            if os.fstat(f.fileno()).st_size != size:
                return False
            digest = hashlib.md5(usedforsecurity=False)
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
            return digest.digest() == md5
    except OSError:
        return False
