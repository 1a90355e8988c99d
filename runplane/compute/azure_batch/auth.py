"""Shared Key authentication of Azure Batch requests, as an azure-core pipeline policy.

The Batch service checks an HMAC-SHA256 over a canonical form of each request, keyed with the
account key (base64 in the portal). The canonical form, per the Batch REST documentation
("Authenticate requests to Azure Batch"):

    VERB \\n Content-Encoding \\n Content-Language \\n Content-Length \\n Content-MD5 \\n
    Content-Type \\n Date \\n If-Modified-Since \\n If-Match \\n If-None-Match \\n
    If-Unmodified-Since \\n Range \\n
    CanonicalizedHeaders      every ``ocp-*`` header, lower-cased, sorted: ``name:value\\n``
    CanonicalizedResource     ``/<account><path>`` then, per query parameter sorted by its
                              lower-cased name, ``\\nname:value`` (URL-decoded; several values
                              of one name sorted and joined with commas)

The request time travels in ``ocp-date`` (so the Date line stays empty); the service refuses
requests older than 15 minutes. A POST always signs its Content-Length, ``0`` for no body.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from urllib.parse import parse_qsl, urlsplit

from azure.core.pipeline import PipelineRequest
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.core.rest import HttpRequest

from runplane.domain.errors import InvalidRequest

SIGNED_HEADERS = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)


def decode_key(account_key: str) -> bytes:
    """The account key as bytes; raises InvalidRequest when it is not base64."""
    try:
        key = base64.b64decode(account_key, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequest("the Azure Batch account key is not valid base64 (copy it from the account's Keys)") from e
    if not key:
        raise InvalidRequest("the Azure Batch account key is empty")
    return key


def string_to_sign(method: str, url: str, headers: Mapping[str, str], account: str) -> str:
    """The canonical form of a request that Shared Key signs (see the module docstring)."""
    lower = {name.lower(): value.strip() for name, value in headers.items()}
    if method.upper() not in ("GET", "HEAD") and not lower.get("content-length"):
        lower["content-length"] = "0"
    lines = [method.upper(), *(lower.get(name, "") for name in SIGNED_HEADERS)]
    canonical_headers = "".join(f"{name}:{lower[name]}\n" for name in sorted(lower) if name.startswith("ocp-"))
    parts = urlsplit(url)
    resource = f"/{account}{parts.path or '/'}"
    values: dict[str, list[str]] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        values.setdefault(name.lower(), []).append(value)
    for name in sorted(values):
        resource += f"\n{name}:{','.join(sorted(values[name]))}"
    return "\n".join(lines) + "\n" + canonical_headers + resource


def sign(key: bytes, text: str) -> str:
    return base64.b64encode(hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()).decode("ascii")


class BatchSharedKeyPolicy(SansIOHTTPPolicy[HttpRequest, object]):
    """Dates and signs every request (again on each retry, so a retried request is fresh)."""

    def __init__(self, account: str, account_key: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.account = account
        self._key = decode_key(account_key)
        self._clock = clock

    def on_request(self, request: PipelineRequest[HttpRequest]) -> None:
        http = request.http_request
        http.headers["ocp-date"] = formatdate(self._clock(), usegmt=True)
        signature = sign(self._key, string_to_sign(http.method, http.url, http.headers, self.account))
        http.headers["Authorization"] = f"SharedKey {self.account}:{signature}"
