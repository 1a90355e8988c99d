"""Uploads: a directory of a user's, packed by the client into one gzip'd tar archive and kept in
the stack's bucket by the SHA-256 of the archive's bytes, under the uploading user's own prefix.
A run names one as an input ``upload:<sha256>``; the agent fetches it into its content-addressed
input cache, checks its SHA-256 and unpacks it read-only at ``/inputs/NAME``."""

from __future__ import annotations

import re

SHA256_PATTERN = r"^[0-9a-f]{64}$"
UPLOAD_SOURCE_PREFIX = "upload:"
UPLOAD_SOURCE_PATTERN = r"upload:[0-9a-f]{64}"
"""An input's source naming an upload (unanchored, for the input pattern's alternation)."""
UPLOADS_PREFIX = "uploads/"
"""Where uploads live in the stack's bucket: ``uploads/<owner>/<sha256>``."""
DEFAULT_MAX_UPLOAD_BYTES = 100 * 1024**2
"""The largest archive accepted (``max_upload_bytes``; 413 beyond, naming the limit)."""
MAX_UNPACKED_BYTES_FACTOR = 20
"""An archive unpacks to at most this many times the stack's upload limit (a decompression bomb stops there)."""
MAX_UNPACKED_FILES = 100_000
"""The most entries one archive unpacks to."""
PUT_URL_SECONDS = 900
"""How long the URL the client PUTs an archive to stays valid."""

_SOURCE = re.compile(f"^{UPLOAD_SOURCE_PATTERN}$")


def upload_key(owner: str, sha256: str) -> str:
    """The object key of ``owner``'s upload of the archive whose SHA-256 is ``sha256``."""
    return f"{UPLOADS_PREFIX}{owner}/{sha256}"


def upload_sha(source: str) -> str | None:
    """The SHA-256 an ``upload:<sha256>`` input names; None for another kind of source."""
    return source[len(UPLOAD_SOURCE_PREFIX) :] if _SOURCE.fullmatch(source) else None
