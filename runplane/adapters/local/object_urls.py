"""Signed object URLs of a stack on one machine, and their answer: ``FileObjectStore.url`` signs
``GET /objects/<bucket>/<key>?expires=<unix time>&signature=<hex>`` with a key derived from the
stack's secret; the stack's front hands every request whose path starts with ``/objects/`` to
``serve``, which checks it (GET or HEAD only, the signature compared in constant time, not
expired, a key that stays inside the objects directory) and answers the object as a download."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qsl, quote, unquote

from runplane.adapters.local.db import OBJECTS_DIR
from runplane.adapters.local.paths import check_bucket, key_segments, open_object
from runplane.domain.errors import BadRequest, RunplaneError

__all__ = ["MAX_URL_SECONDS", "PATH_PREFIX", "ObjectAnswer", "serve", "sign", "url_key"]

MAX_URL_SECONDS = 7 * 24 * 3600
"""The longest a signed URL lasts, as on S3."""
PATH_PREFIX = f"/{OBJECTS_DIR}/"
"""The paths of the front that ``serve`` answers."""
_URL_KEY_LABEL = b"runplane object URLs v1"
"""What the stack's secret signs to make the key of object URLs. It holds no NUL, which every
other message the secret signs does (ids derived from an Idempotency-Key)."""
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_EVERY_ANSWER = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}


def url_key(secret: bytes) -> bytes:
    """The key object URLs are signed with, derived from the stack's secret."""
    return hmac.new(secret, _URL_KEY_LABEL, hashlib.sha256).digest()


def sign(key: bytes, bucket: str, object_key: str, expires: int) -> str:
    """The signature (hex) of a GET of ``bucket``/``object_key`` until ``expires`` (unix time).
    The bucket and the expiry hold no newline, so the message reads one way only."""
    message = f"GET\n{bucket}\n{expires}\n{object_key}".encode()
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
) -> ObjectAnswer:
    """The answer to ``method`` of ``path`` (starting with ``PATH_PREFIX``) and ``query``, both
    still percent-encoded, for the stack whose state directory is ``root`` and whose secret is
    ``secret()``: the object, as an attachment, for a URL ``FileObjectStore.url`` signed that has
    not expired; 405 for a method other than GET or HEAD; 403 for a URL altered, unsigned or
    expired; 404 for an object that is not there (or a key that could not be one)."""
    if method not in ("GET", "HEAD"):
        return _refused(405, "method_not_allowed", "object URLs answer GET and HEAD only", Allow="GET, HEAD")
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
