"""Uploads: the offer a client gets for an archive of a directory it packed (already there, or a
URL to PUT it to), and the check a submit makes of the uploads a run names.

An archive lives at ``upload_key(owner, sha256)``, under its uploader's own prefix, so nobody's
run reads another user's upload: a run naming one its owner did not upload is refused with the
words a missing one gets (404). The URL carries the archive's MD5, so the store refuses other
bytes; the agent checks the SHA-256 when it fetches the archive.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass

from runplane.domain.errors import InvalidRequest, NotFound, PayloadTooLarge, RunplaneError
from runplane.domain.retention import TOUCH_AFTER_SECONDS
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.domain.uploads import PUT_URL_SECONDS, UPLOAD_SOURCE_PREFIX, upload_key
from runplane.ports import ObjectInfo, Ports

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadOffer:
    """What a client does with an archive: nothing (``present``), or PUT it to ``url`` with
    ``headers`` before ``expires_at``."""

    sha256: str
    size: int
    present: bool
    url: str | None = None
    headers: dict[str, str] | None = None
    expires_at: float | None = None

    @property
    def source(self) -> str:
        """How a run names the upload as an input."""
        return UPLOAD_SOURCE_PREFIX + self.sha256


def offer(ports: Ports, principal: Principal, sha256: str, size: int, md5: str) -> UploadOffer:
    """Where ``principal`` puts an archive of ``size`` bytes whose SHA-256 is ``sha256`` and whose
    MD5 is ``md5`` (base64). Raises PayloadTooLarge (over ``max_upload_bytes``, naming it) and
    InvalidRequest (``md5`` is not the base64 of 16 bytes)."""
    limit = ports.settings.max_upload_bytes
    if size > limit:
        raise PayloadTooLarge(f"an upload is at most {limit} bytes (max_upload_bytes); this one is {size}")
    _check_md5(md5)
    key = upload_key(principal.user, sha256)
    found = ports.objects.head(key)
    if found is not None and found.size == size:
        try:
            touch(ports, found)  # a submit naming it comes next: not deleted as unused meanwhile
        except NotFound:  # deleted meanwhile: put again
            pass
        else:
            return UploadOffer(sha256, size, present=True)
    url, headers = ports.objects.put_url(key, size, md5, expires_seconds=PUT_URL_SECONDS)
    return UploadOffer(sha256, size, False, url, headers, ports.clock() + PUT_URL_SECONDS)


def missing(sha: str) -> str:
    """The 404 of an upload the caller has not (or no longer) got: the same for another user's, so
    that it tells nothing of theirs; it says how to send it again, as a retry of a run whose upload
    expired needs."""
    return (
        f"upload {sha} not found: uploads unused for a while expire; upload the directory again "
        "(runplane run --upload DIR, or the SDK's uploads=) and submit anew"
    )


def check_run(ports: Ports, principal: Principal, spec: RunSpec) -> None:
    """Raise NotFound unless every upload ``spec`` names as an input is one of ``principal``'s
    (another user's reads exactly like a missing one), and PayloadTooLarge for one over
    ``max_upload_bytes``: a SAS cannot bind the length of what is PUT with it, so this is where
    the limit holds on Azure. Each is marked used (``touch``)."""
    limit = ports.settings.max_upload_bytes
    for sha in spec.uploads():
        found = ports.objects.head(upload_key(principal.user, sha))
        if found is None:
            raise NotFound(missing(sha))
        if found.size > limit:  # a store whose URL cannot bind the length (an Azure SAS) took more
            raise PayloadTooLarge(
                f"upload {sha} is {found.size} bytes; an upload is at most {limit} bytes (max_upload_bytes)"
            )
        touch(ports, found)


def touch(ports: Ports, found: ObjectInfo) -> None:
    """Mark an upload a run names used again (its time renewed, which its expiry counts from: the
    stack's ``uploads`` retention, the store's own lifecycle rule) when its last mark is older than
    ``TOUCH_AFTER_SECONDS``, or than a quarter of that retention when it is shorter; never while
    uploads are kept for good (a versioned bucket keeps a copy a touch). Raises NotFound when it went
    meanwhile; another failure is logged, never the submit's."""
    kept_for = ports.settings.kept().seconds("uploads")
    if kept_for is None:
        return
    after = min(TOUCH_AFTER_SECONDS, kept_for / 4)
    if found.modified is not None and ports.clock() - found.modified < after:
        return
    try:
        ports.objects.touch(found.key)
    except NotFound:
        raise NotFound(missing(found.key.rpartition("/")[2])) from None
    except RunplaneError as e:
        log.warning("upload %s could not be marked used: %s", found.key, e)


def _check_md5(md5: str) -> None:
    try:
        digest = base64.b64decode(md5, validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 16:
        raise InvalidRequest("md5 must be the base64 of the archive's MD5 (16 bytes)")
