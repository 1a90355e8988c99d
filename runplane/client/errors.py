"""The errors of the SDK: one class per kind of answer, chosen from the HTTP status in one place.

Every error is an ``ApiError`` with ``.status`` (the HTTP status; 0 when no answer came),
``.code`` (machine-readable, the API's ``error.code``) and ``.message`` (for a person, also
``str(error)``), so a caller that does not care which one it was catches ``ApiError``.
"""

from __future__ import annotations

import json
from typing import Any


class ApiError(Exception):
    """An answer that was not a success, or no answer at all (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, message={self.message!r})"


class BadRequest(ApiError):
    """400: the request cannot be read (a body that is not JSON, a cursor the API did not make)."""


class Unauthorized(ApiError):
    """401: no token, or one the API does not know (revoked, expired, mistyped)."""


class Forbidden(ApiError):
    """403: the token is valid but lacks the scope the request needs."""


class NotFound(ApiError):
    """404: no such run or token, or one that belongs to another user (the API does not say which)."""


class Conflict(ApiError):
    """409: the request contradicts what exists: an Idempotency-Key used for a different request,
    a kill of a run that has already finished."""


class LastAdminToken(Conflict):
    """409 ``last_admin``: the token is the only admin token that has not expired; revoking it
    would lock every administrator out. Make another admin token first."""


class PayloadTooLarge(ApiError):
    """413: the body is larger than the API accepts."""


class InvalidRequest(ApiError):
    """422: the request is well-formed but not acceptable (bad resources, no pool that fits)."""


class QuotaExceeded(ApiError):
    """The caller has used up a quota (``code`` "quota_exceeded", whatever the status)."""


class RateLimited(ApiError):
    """429: too many requests; retried by the client before it is raised."""


class ServerError(ApiError):
    """5xx: the API or a service behind it failed; retried (where safe) before it is raised."""


class ConnectionFailed(ApiError):
    """No answer: the API cannot be reached, or did not answer in time (``status`` 0)."""


class DownloadFailed(ApiError):
    """An output file could not be written where asked (``status`` 0, or the storage's status)."""


class UploadFailed(ApiError):
    """An upload's bytes were not taken by the store (``status`` 0, or the store's status)."""


class WaitTimeout(ApiError, TimeoutError):
    """A run did not end within the time a ``wait`` allowed (``status`` 0)."""


BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: RateLimited,
}
"""The error class of each status (5xx: ServerError; any other: ApiError)."""


def error_class(status: int, code: str) -> type[ApiError]:
    if code == "quota_exceeded":
        return QuotaExceeded
    if status == 409 and code == "last_admin":
        return LastAdminToken
    if status >= 500:
        return ServerError
    return BY_STATUS.get(status, ApiError)


def error_from_answer(status: int, content: bytes) -> ApiError:
    """The error for an answer of ``status`` whose body is ``content``: the API's
    ``{"error": {"code", "message"}}``, or ``HTTP <status>: <the body's first 200 characters>``
    (code "http_error") when the body is not that shape (a proxy's page, say)."""
    code, message = _error_fields(content)
    if code is None or message is None:
        text = content[:200].decode("utf-8", errors="replace").strip()
        code, message = "http_error", f"HTTP {status}: {text}" if text else f"HTTP {status}"
    return error_class(status, code)(status, code, message)


def _error_fields(content: bytes) -> tuple[str | None, str | None]:
    try:
        data: Any = json.loads(content)
    except ValueError:
        return None, None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None, None
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        return None, None
    return code, message
