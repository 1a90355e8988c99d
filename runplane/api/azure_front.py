"""The HTTP API behind Azure Functions: a ``func.HttpRequest`` becomes the API Gateway event the
resolver reads on AWS, and the resolver's answer a ``func.HttpResponse``. Paths, bodies, errors
and auth are therefore those of the AWS API by construction.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import azure.functions as func
from aws_lambda_powertools.utilities.typing import LambdaContext

from runplane.api.gateway import http_event, response_parts
from runplane.api.http import app


def client_ip(forwarded_for: str | None) -> str:
    """The client address from the Functions front end's ``X-Forwarded-For`` (``ip:port`` or
    ``[v6]:port``, nearest last), or ``0.0.0.0`` when there is none."""
    first = (forwarded_for or "").split(",")[0].strip()
    if first.startswith("["):
        return first[1:].partition("]")[0] or "0.0.0.0"
    if first.count(":") == 1:
        return first.partition(":")[0]
    return first or "0.0.0.0"


def to_event(req: func.HttpRequest) -> dict[str, Any]:
    """The API Gateway v2 event for ``req``. The path is the request URL's, so the function app's
    ``routePrefix`` must be empty (host.json) for ``/v1/...`` to reach the API's routes."""
    url = urlsplit(req.url)
    headers = {key: value for key, value in req.headers.items()}
    source = client_ip(headers.get("x-forwarded-for") or headers.get("X-Forwarded-For"))
    return http_event(req.method.upper(), url.path or "/", url.query, headers, req.get_body() or b"", source)


def to_response(result: dict[str, Any]) -> func.HttpResponse:
    status, headers, body = response_parts(result)
    media_type = headers.get("content-type", "application/json").partition(";")[0].strip()
    return func.HttpResponse(body, status_code=status, headers=headers, mimetype=media_type or None)


def handle(req: func.HttpRequest) -> func.HttpResponse:
    """Serve one request with the API's resolver."""
    # the Python worker runs synchronous functions on a thread pool: the resolver keeps each
    # thread's request apart (runplane/api/resolver.py), so requests are served side by side
    return to_response(app.resolve(to_event(req), LambdaContext()))
