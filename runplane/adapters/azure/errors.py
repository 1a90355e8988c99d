"""Reading Azure SDK errors by their service error code, never by their message."""

from __future__ import annotations

from azure.core.exceptions import AzureError, HttpResponseError


def error_code(e: AzureError) -> str:
    """The ``x-ms-error-code`` of a failed call ('' for transport errors)."""
    code = getattr(e, "error_code", None)
    if not code and isinstance(e, HttpResponseError) and e.response is not None:
        code = getattr(e.response, "headers", {}).get("x-ms-error-code")
    return str(getattr(code, "value", code) or "")
