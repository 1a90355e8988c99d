"""The request shape the HTTP API reads: an API Gateway HTTP API event (payload format 2.0).

API Gateway builds it in production on AWS; every other front (Azure Functions, the embedded
local stack) builds it here, so paths, bodies, errors and auth are the same on every front.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any
from urllib.parse import parse_qsl


def http_event(
    method: str, path: str, query: str, headers: dict[str, str], body: bytes, source_ip: str
) -> dict[str, Any]:
    """An API Gateway HTTP API (payload 2.0) event for one request.

    ``path`` is the raw (still percent-encoded) path, ``query`` the raw query string; repeated
    query parameters are joined with commas, as API Gateway does. A body that is not UTF-8 is
    passed base64-encoded.
    """
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        params[key] = f"{params[key]},{value}" if key in params else value
    try:
        text, is_b64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, is_b64 = base64.b64encode(body).decode(), True
    now = time.time()
    lowered = {k.lower(): v for k, v in headers.items()}
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": lowered,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": lowered.get("host", "localhost"),
            "domainPrefix": "local",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": lowered.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": is_b64,
    }
    if params:
        event["queryStringParameters"] = params
    if body:
        event["body"] = text
    return event


def response_parts(result: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body bytes) of the resolver's API Gateway response."""
    headers = {k.lower(): str(v) for k, v in (result.get("headers") or {}).items()}
    for key, values in (result.get("multiValueHeaders") or {}).items():
        headers[key.lower()] = ", ".join(values)
    body = result.get("body") or ""
    data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode()
    return int(result["statusCode"]), headers, data
