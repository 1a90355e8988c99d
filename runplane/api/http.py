"""The HTTP API as one Powertools resolver. Routes parse, call one service, and shape the answer.

Errors leave as ``{"error": {"code", "message"}}`` with a 4xx status chosen in one place
(``STATUS``); anything unexpected is logged and answered with a 500 that carries no trace.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import ValidationError

from runplane import bootstrap
from runplane.api.observability import make_tracer
from runplane.api.openapi import openapi_document
from runplane.api.views import pool_view, run_view, worker_view
from runplane.domain import errors
from runplane.domain.models import PoolRecord, Principal, RunSpec, RunState, Worker
from runplane.services import auth, runs
from runplane.services.dispatch import alive_workers, explain_wait, fresh
from runplane.services.logs import outputs_prefix, read_logs

logger = Logger(service="runplane-api")
metrics = Metrics(namespace="runplane", service="api")
tracer = make_tracer("runplane-api")
app = APIGatewayHttpResolver()

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
}


def error_response(status: int, code: str, message: str) -> Response[str]:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps({"error": {"code": code, "message": message}}),
    )


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(body), headers=headers
    )


@app.exception_handler(errors.RunplaneError)  # type: ignore[untyped-decorator]
def _known(e: errors.RunplaneError) -> Response[str]:
    status = next((s for cls, s in STATUS.items() if isinstance(e, cls)), 500)
    if status >= 500:
        logger.error("request failed", extra={"code": e.code, "error": e.message})
    return error_response(status, e.code, e.message if status < 500 else "a backing service failed; retry")


@app.exception_handler(Exception)  # type: ignore[untyped-decorator]
def _unexpected(e: Exception) -> Response[str]:
    logger.exception("unhandled error")
    return error_response(500, "internal", "internal error; it has been logged")


@app.not_found
def _not_found(_: Exception) -> Response[str]:
    path = app.current_event.path
    return error_response(404, "not_found", f"no route for {app.current_event.http_method} {path}")


def _principal() -> Principal:
    return auth.authenticate(bootstrap.stack().tokens, app.current_event.get_header_value("authorization"))


def _body_object() -> dict[str, Any]:
    body = app.current_event.decoded_body or ""
    if len(body.encode()) > bootstrap.stack().settings.max_body_bytes:
        raise errors.PayloadTooLarge(f"body is larger than {bootstrap.stack().settings.max_body_bytes} bytes")
    try:
        data = json.loads(body) if body.strip() else None
    except ValueError as e:
        raise errors.BadRequest(f"body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise errors.BadRequest("body must be a JSON object")
    return data


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _int_param(name: str, default: int, low: int, high: int) -> int:
    raw = app.current_event.get_query_string_value(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise errors.BadRequest(f"query parameter {name} must be an integer") from e
    if not low <= value <= high:
        raise errors.InvalidRequest(f"query parameter {name} must be between {low} and {high}")
    return value


@app.get("/v1/health")
def health() -> dict[str, Any]:
    return {"status": "ok"}


@app.get("/v1/openapi.json")
def openapi() -> dict[str, Any]:
    return openapi_document()


@app.post("/v1/runs")
def submit() -> Response[str]:
    principal = _principal()
    auth.require(principal, "runs:write")
    data = _body_object()
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as e:
        raise errors.InvalidRequest(_validation_message(e)) from e
    key = app.current_event.get_header_value("idempotency-key")
    if key is not None and not 1 <= len(key) <= 200:
        raise errors.InvalidRequest("Idempotency-Key must be 1 to 200 characters")
    s = bootstrap.stack()
    result = runs.submit_run(s.store, s.queue, s.pools, principal, spec, key, s.clock)
    if result.created:
        metrics.add_metric(name="RunsSubmitted", unit=MetricUnit.Count, value=1)
    return _json(201 if result.created else 200, run_view(result.run), {"Location": f"/v1/runs/{result.run.id}"})


@app.get("/v1/runs")
def list_runs() -> dict[str, Any]:
    principal = _principal()
    state_raw = app.current_event.get_query_string_value("state")
    try:
        state = RunState(state_raw) if state_raw else None
    except ValueError as e:
        raise errors.InvalidRequest(f"unknown state {state_raw!r}; states are {[s.value for s in RunState]}") from e
    page = runs.list_runs(
        bootstrap.stack().store,
        principal,
        state=state,
        queue=app.current_event.get_query_string_value("queue"),
        limit=_int_param("limit", 50, 1, 500),
        cursor=app.current_event.get_query_string_value("cursor"),
    )
    return {"runs": [run_view(r) for r in page.runs], "next_cursor": page.next_cursor}


def _pool_record(pool: str) -> PoolRecord | None:
    """The dispatcher's record of ``pool``; None if unreadable (what it adds is a courtesy: a
    read never fails for it)."""
    try:
        return bootstrap.stack().pool_states.get(pool)
    except errors.RunplaneError as e:
        logger.warning("pool record of %s unreadable: %s", pool, e)
        return None


@app.get("/v1/runs/<run_id>")
def get_run(run_id: str) -> dict[str, Any]:
    s = bootstrap.stack()
    run = runs.get_run(s.store, _principal(), run_id)
    view = run_view(run)
    if run.state == RunState.QUEUED:
        workers = alive_workers(s.workers, run.queue, s.clock(), s.settings.worker_stale_seconds)
        pool = s.pools.get(run.queue)
        record = _pool_record(pool.name) if pool is not None else None
        view["waiting_reason"] = explain_wait(pool, workers, run.waiting_reason, record, run)
    return view


@app.post("/v1/runs/<run_id>/kill")
def kill(run_id: str) -> Response[str]:
    principal = _principal()
    auth.require(principal, "runs:write")
    s = bootstrap.stack()
    return _json(202, run_view(runs.kill_run(s.store, principal, run_id, s.clock)))


@app.get("/v1/runs/<run_id>/logs")
def logs(run_id: str) -> dict[str, Any]:
    s = bootstrap.stack()
    run = runs.get_run(s.store, _principal(), run_id)
    stream = app.current_event.get_query_string_value("stream") or "stdout"
    if stream not in ("stdout", "stderr"):
        raise errors.InvalidRequest("stream must be stdout or stderr")
    page = read_logs(s.objects, run, stream, _int_param("offset", 0, 0, 2**62))  # type: ignore[arg-type]
    return {"data": page.data, "next_offset": page.next_offset, "complete": page.complete}


@app.get("/v1/runs/<run_id>/outputs")
def outputs(run_id: str) -> dict[str, Any]:
    s = bootstrap.stack()
    run = runs.get_run(s.store, _principal(), run_id)
    prefix = outputs_prefix(run.id, run.attempt)
    files = [
        {"path": o.key[len(prefix) :], "size": o.size, "url": s.objects.url(o.key)} for o in s.objects.list(prefix)
    ]
    return {"files": files, "complete": run.state.terminal}


@app.get("/v1/pools")
def pools() -> dict[str, Any]:
    _principal()
    s = bootstrap.stack()
    now = s.clock()
    by_pool: dict[str, list[Worker]] = {}
    for worker in fresh(s.workers.list(), now, s.settings.worker_stale_seconds):  # one read for all pools
        by_pool.setdefault(worker.pool, []).append(worker)
    out = []
    for pool in s.pools.pools:
        backlog = s.store.count(pool.name, RunState.QUEUED)
        record = _pool_record(pool.name) or PoolRecord(pool=pool.name)
        out.append(pool_view(pool, backlog, by_pool.get(pool.name, []), record))
    return {"pools": out}


@app.get("/v1/workers")
def workers() -> dict[str, Any]:
    _principal()
    s = bootstrap.stack()
    now = s.clock()
    return {"workers": [worker_view(w, now, s.settings.worker_stale_seconds) for w in s.workers.list()]}
