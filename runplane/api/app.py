"""The HTTP API's resolver and how every error leaves it.

Errors leave as ``{"error": {"code", "message"}}`` with a status chosen in one place (``STATUS``);
anything unexpected is logged and answered with a 500 that carries no trace. A path some route
serves, asked with a method none serves, is a 405 that lists the methods in ``Allow``.
"""

from __future__ import annotations

import json

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import Response, content_types

from runplane.api import ui
from runplane.api.observability import make_tracer
from runplane.api.resolver import ConcurrentResolver
from runplane.domain import errors

logger = Logger(service="runplane-api")
tracer = make_tracer("runplane-api")
app = ConcurrentResolver()
app.include_router(ui.router)  # the dashboard's files under /ui/

STATUS: dict[type[errors.RunplaneError], int] = {
    errors.BadRequest: 400,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PayloadTooLarge: 413,
    errors.InvalidRequest: 422,
    errors.Unschedulable: 422,
    errors.BackendError: 503,
    errors.Misconfigured: 503,
}

MISCONFIGURED = "this stack is misconfigured and serves nothing until its operator fixes its settings (see its log)"


def status_of(error: type[errors.RunplaneError]) -> int:
    """The status an error of class ``error`` is answered with (500: one the map lacks)."""
    return next((s for cls, s in STATUS.items() if issubclass(error, cls)), 500)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps({"error": {"code": code, "message": message}}),
        headers=headers,
    )


@app.exception_handler(errors.RunplaneError)  # type: ignore[untyped-decorator]
def _known(e: errors.RunplaneError) -> Response[str]:
    status = status_of(type(e))
    if isinstance(e, errors.Misconfigured):  # logged once, as the stack failed to build; no internals
        return error_response(status, e.code, MISCONFIGURED)
    if status >= 500:
        logger.error("request failed", extra={"code": e.code, "error": e.message})
    return error_response(status, e.code, e.message if status < 500 else "a backing service failed; retry")


@app.exception_handler(Exception)  # type: ignore[untyped-decorator]
def _unexpected(e: Exception) -> Response[str]:
    logger.exception("unhandled error")
    return error_response(500, "internal", "internal error; it has been logged")


def _allowed_methods(path: str) -> list[str]:
    """The methods some route serves for ``path`` (for a 405's ``Allow``). The resolver keeps its
    routes in these lists (Powertools 3); tests/security/test_hostile_input.py checks the 405s."""
    routes = [*getattr(app, "_static_routes", []), *getattr(app, "_dynamic_routes", [])]
    return sorted({route.method for route in routes if route.rule.match(path)})


@app.not_found
def _not_found(_: Exception) -> Response[str]:
    method, path = app.current_event.http_method, app.current_event.path
    allowed = _allowed_methods(path)
    if allowed:
        use = ", ".join(allowed)
        return error_response(405, "method_not_allowed", f"{method} is not allowed; use {use}", {"Allow": use})
    return error_response(404, "not_found", f"no route for {method[:20]} {path[:200]}")
