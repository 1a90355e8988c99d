"""The HTTP API as one Powertools resolver. Routes parse, call one service, and shape the answer.

Errors leave as ``{"error": {"code", "message"}}`` with a 4xx status chosen in one place
(``STATUS``); anything unexpected is logged and answered with a 500 that carries no trace.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any
from urllib.parse import unquote

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import Response, content_types
from pydantic import BaseModel, ValidationError

from runplane import bootstrap
from runplane.api import ui
from runplane.api.models import (
    Health,
    LogPage,
    OutputFile,
    OutputPage,
    PoolList,
    QuotaLimits,
    QuotaList,
    SetPriority,
    SweepPatch,
    SweepRetried,
    TokenCreate,
    TokenCreated,
    TokenList,
    UserSettings,
    WorkerList,
)
from runplane.api.observability import make_tracer
from runplane.api.openapi import openapi_document
from runplane.api.resolver import ConcurrentResolver
from runplane.api.views import (
    live_counts,
    me_view,
    pool_view,
    quota_view,
    run_view,
    sweep_view,
    token_view,
    usage_view,
    user_view,
    worker_view,
)
from runplane.domain import errors
from runplane.domain.common import NAME_PATTERN, RUN_ID_PATTERN
from runplane.domain.quotas import QuotaKind
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.sweeps import Sweep, SweepSpec
from runplane.domain.tenancy import TOKEN_ID_PATTERN, Principal
from runplane.domain.workers import PoolRecord
from runplane.metrics import emit
from runplane.services import auth, dependencies, lifecycle, quota_admin, runs, sweeps, tenancy, usage
from runplane.services.dispatch import FIGURES_STALE_SECONDS, alive_workers, explain_wait
from runplane.services.logs import MAX_OUTPUTS_PAGE, attempt_over, read_logs, read_outputs

logger = Logger(service="runplane-api")
tracer = make_tracer("runplane-api")
app = ConcurrentResolver()
app.include_router(ui.router)  # the dashboard's files under /ui/

MAX_DEPTH = 32
"""The deepest nesting of arrays and objects a body may have."""
MAX_WORKERS_PAGE = 100
"""The workers a page holds unless ``?limit=`` says otherwise."""
MAX_PAGE_BYTES = 5 * 1024 * 1024
"""The largest list page as it travels in Lambda's response (its body is a JSON string there, so
quotes and backslashes count twice): under Lambda's 6 MB limit."""
_RUN_ID = re.compile(RUN_ID_PATTERN)

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


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps({"error": {"code": code, "message": message}}),
        headers=headers,
    )


def _json(status: int, body: BaseModel | Any, headers: dict[str, str] | None = None) -> Response[str]:
    """A JSON answer; a response model is sent as its wire form."""
    text = body.model_dump_json() if isinstance(body, BaseModel) else json.dumps(body)
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=text, headers=headers)


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


def _principal(scope: str | None = None) -> Principal:
    """The caller, who must hold ``scope`` (when given). Raises Unauthorized or Forbidden."""
    principal = auth.authenticate(bootstrap.stack().tokens, app.current_event.get_header_value("authorization"))
    if scope is not None:
        auth.require(principal, scope)
    return principal


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar is 0), counted up to MAX_DEPTH + 1."""
    depth, level = 0, [value]
    while depth <= MAX_DEPTH:
        containers = [v for v in level if isinstance(v, dict | list)]
        if not containers:
            break
        depth += 1
        level = [child for c in containers for child in (c.values() if isinstance(c, dict) else c)]
    return depth


def _body_object() -> dict[str, Any]:
    """The body as a JSON object. Raises PayloadTooLarge or BadRequest (with what is wrong) for a
    body that is too big, not UTF-8, not JSON, nested too deep, or holds NaN or Infinity."""
    event = app.current_event
    raw: bytes
    text = event.body or ""
    try:
        raw = base64.b64decode(text, validate=True) if event.is_base64_encoded else text.encode()
    except (binascii.Error, ValueError) as e:
        raise errors.BadRequest("body is not valid base64") from e
    limit = bootstrap.stack().settings.max_body_bytes
    if len(raw) > limit:
        raise errors.PayloadTooLarge(f"body is larger than {limit} bytes")
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise errors.BadRequest(f"body is not UTF-8 (byte {e.start}): send JSON encoded as UTF-8") from e
    try:
        data = json.loads(body, parse_constant=_no_constant) if body.strip() else None
    except RecursionError as e:
        raise errors.BadRequest(f"body nests deeper than {MAX_DEPTH} levels") from e
    except ValueError as e:
        raise errors.BadRequest(f"body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise errors.BadRequest("body must be a JSON object")
    if _depth(data) > MAX_DEPTH:
        raise errors.BadRequest(f"body nests deeper than {MAX_DEPTH} levels")
    return data


def _model(model: Any, data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise errors.InvalidRequest(_validation_message(e)) from e


def _run_id(run_id: str) -> str:
    """A run id as a path gives it; one that cannot be an id is a run that does not exist."""
    if not _RUN_ID.fullmatch(run_id):
        raise errors.NotFound(f"run {run_id[:80]!r} not found")
    return run_id


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(p)[:80] for p in err["loc"]) or "body"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _int_param(name: str, default: int, low: int, high: int) -> int:
    raw = app.current_event.get_query_string_value(name)
    if raw is None:
        return default
    try:
        value = int(raw[:40])
    except ValueError as e:
        raise errors.BadRequest(f"query parameter {name} must be an integer") from e
    if len(raw) > 40 or not low <= value <= high:
        raise errors.InvalidRequest(f"query parameter {name} must be between {low} and {high}")
    return value


def _attempt(run: Run) -> int | None:
    """The attempt whose logs or outputs are asked for: ``?attempt=`` (1 to the run's latest), or
    None for its latest. Raises BadRequest/InvalidRequest."""
    if app.current_event.get_query_string_value("attempt") is None:
        return None
    if run.attempt < 1:
        raise errors.InvalidRequest(f"run {run.id} has not had an attempt yet")
    return _int_param("attempt", run.attempt, 1, run.attempt)


@app.get("/v1/health")
def health() -> Response[str]:
    return _json(200, Health())


@app.get("/v1/openapi.json")
def openapi() -> dict[str, Any]:
    return openapi_document()


def _idempotency_key() -> str | None:
    key = app.current_event.get_header_value("idempotency-key")
    if key is not None and not 1 <= len(key) <= 200:
        raise errors.InvalidRequest("Idempotency-Key must be 1 to 200 characters")
    return key


@app.post("/v1/runs")
def submit() -> Response[str]:
    principal = _principal("runs:write")
    spec = _model(RunSpec, _body_object())
    key = _idempotency_key()
    s = bootstrap.stack()
    secret = s.tokens.secret() if key is not None else b""
    result = runs.submit_run(
        s.store,
        s.queue,
        s.pools,
        principal,
        spec,
        key,
        s.clock,
        secret=secret,
        inputs=s.input_policy,
        quotas=s.quotas,
        sweeps=s.sweeps,
    )
    if result.created:
        emit("RunsSubmitted", 1, "api")
    return _json(201 if result.created else 200, run_view(result.run), {"Location": f"/v1/runs/{result.run.id}"})


@app.get("/v1/runs")
def list_runs() -> Response[str]:
    principal = _principal("runs:read")
    state_raw = app.current_event.get_query_string_value("state")
    try:
        state = RunState(state_raw) if state_raw else None
    except ValueError as e:
        states = [s.value for s in RunState]
        raise errors.InvalidRequest(f"unknown state {str(state_raw)[:40]!r}; states are {states}") from e
    store = bootstrap.stack().store
    sweep_id = app.current_event.get_query_string_value("sweep")
    if sweep_id is not None:
        return _sweep_members(principal, sweep_id, state)
    owner = app.current_event.get_query_string_value("owner") or principal.user
    page = runs.list_runs(
        store,
        principal,
        owner=owner,
        state=state,
        queue=app.current_event.get_query_string_value("queue") or None,
        limit=_int_param("limit", 50, 1, 500),
        cursor=app.current_event.get_query_string_value("cursor"),
    )
    views, cut = _within_page([run_view(run) for run in page.runs])
    cursor = page.next_cursor if cut is None else store.cursor_after(page.runs[cut - 1], owner)
    return _run_page(views, cursor)


def _within_page(views: list[BaseModel]) -> tuple[list[str], int | None]:
    """The views, as JSON, that fit one list page (``MAX_PAGE_BYTES`` as Lambda's response carries
    them: the body is a JSON string there, escaped again), and the index of the first left out
    (None: all fit). A page cut short goes on after its last item."""
    texts: list[str] = []
    size = 1024
    for view in views:
        text = view.model_dump_json()
        wire = len(json.dumps(text))
        if texts and size + wire > MAX_PAGE_BYTES:
            return texts, len(texts)
        texts.append(text)
        size += wire
    return texts, None


def _run_page(views: list[str], cursor: str | None) -> Response[str]:
    body = '{"runs": [' + ", ".join(views) + "], " + f'"next_cursor": {json.dumps(cursor)}' + "}"
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=body)


def _sweep_members(principal: Principal, sweep_id: str, state: RunState | None) -> Response[str]:
    """``GET /v1/runs?sweep=ID``: the members released so far, in index order."""
    query = app.current_event.get_query_string_value
    if query("owner") or query("queue"):
        raise errors.InvalidRequest("sweep cannot be combined with owner or queue")
    ports = bootstrap.stack().sweep_ports
    sweep = sweeps.get_sweep(ports, principal, _sweep_id(sweep_id))
    found, cursor = sweeps.members(ports, sweep, state, _int_param("limit", 50, 1, 500), query("cursor"))
    views, cut = _within_page([run_view(run) for run in found])
    return _run_page(views, cursor if cut is None else str(found[cut].sweep_index))


def _pool_record(pool: str) -> PoolRecord | None:
    """The dispatcher's record of ``pool``; None if unreadable (what it adds is a courtesy: a
    read never fails for it)."""
    try:
        return bootstrap.stack().pool_states.get(pool)
    except errors.RunplaneError as e:
        logger.warning("pool record of %s unreadable: %s", pool, e)
        return None


@app.get("/v1/runs/<run_id>")
def get_run(run_id: str) -> Response[str]:
    s = bootstrap.stack()
    run = runs.get_run(s.store, _principal("runs:read"), _run_id(run_id))
    reason = None
    if run.state == RunState.QUEUED and run.waiting_on:
        reason = dependencies.describe(s.sweep_ports.waits, run)
    elif run.state == RunState.QUEUED:
        workers = alive_workers(s.workers, run.queue, s.clock(), s.settings.worker_stale_seconds)
        pool = s.pools.get(run.queue)
        record = _pool_record(pool.name) if pool is not None else None
        reason = explain_wait(pool, workers, run.waiting_reason, record, run)
    return _json(200, run_view(run, waiting_reason=reason))


@app.post("/v1/runs/<run_id>/kill")
def kill(run_id: str) -> Response[str]:
    principal = _principal("runs:write")
    s = bootstrap.stack()
    run = runs.kill_run(s.store, principal, _run_id(run_id), s.clock)
    lifecycle.ended(s.queue, run)  # a sweep member killed while queued frees its place now
    return _json(202, run_view(run))


@app.post("/v1/runs/<run_id>/priority")
def set_priority(run_id: str) -> Response[str]:
    principal = _principal("runs:write")
    request: SetPriority = _model(SetPriority, _body_object())
    s = bootstrap.stack()
    run = runs.set_priority(
        s.store, s.pools, principal, _run_id(run_id), request.priority, s.clock, quotas=s.quotas, inputs=s.input_policy
    )
    return _json(200, run_view(run))


@app.get("/v1/runs/<run_id>/logs")
def logs(run_id: str) -> Response[str]:
    s = bootstrap.stack()
    run = runs.get_run(s.store, _principal("runs:read"), _run_id(run_id))
    stream = app.current_event.get_query_string_value("stream") or "stdout"
    if stream not in ("stdout", "stderr"):
        raise errors.InvalidRequest("stream must be stdout or stderr")
    offset = _int_param("offset", 0, 0, 2**62)
    page = read_logs(s.objects, run, stream, offset, attempt=_attempt(run))  # type: ignore[arg-type]
    return _json(200, LogPage(data=page.data, next_offset=page.next_offset, complete=page.complete))


@app.get("/v1/runs/<run_id>/outputs")
def outputs(run_id: str) -> Response[str]:
    s = bootstrap.stack()
    run = runs.get_run(s.store, _principal("runs:read"), _run_id(run_id))
    attempt = _attempt(run)
    page = read_outputs(
        s.objects,
        run,
        cursor=app.current_event.get_query_string_value("cursor"),
        limit=_int_param("limit", MAX_OUTPUTS_PAGE, 1, MAX_OUTPUTS_PAGE),
        attempt=attempt,
    )
    files = [OutputFile.model_validate(f) for f in page.files]
    return _json(200, OutputPage(files=files, next_cursor=page.next_cursor, complete=attempt_over(run, attempt)))


@app.get("/v1/pools")
def pools() -> Response[str]:
    """Each pool's backlog and workers as its dispatcher last counted them (one read per pool,
    whatever the number of runs and workers); a pool no pass has counted, or none lately (its
    dispatcher failing, say), is counted here."""
    _principal("runs:read")
    s = bootstrap.stack()
    out = []
    for pool in s.pools.pools:
        record = _pool_record(pool.name) or PoolRecord(pool=pool.name)
        counted = record.counted_at is not None and s.clock() - record.counted_at <= FIGURES_STALE_SECONDS
        if counted and record.backlog is not None:
            out.append(pool_view(pool, record.backlog, record.workers, record))
            continue
        workers = alive_workers(s.workers, pool.name, s.clock(), s.settings.worker_stale_seconds)
        backlog = s.store.count(pool.name, RunState.QUEUED)
        out.append(
            pool_view(pool, backlog, live_counts(workers, record), record.model_copy(update={"counted_at": None}))
        )
    return _json(200, PoolList(pools=out))


@app.get("/v1/workers")
def workers() -> Response[str]:
    """A page of workers (of ``?pool=``), ``?limit=`` (default 100) at a time."""
    principal = _principal("runs:read")
    query = app.current_event.get_query_string_value
    pool, cursor = query("pool"), query("cursor")
    if pool is not None and not re.fullmatch(NAME_PATTERN, pool):
        raise errors.InvalidRequest("pool must be a pool name: lowercase letters, digits and '-'")
    s = bootstrap.stack()
    limit = _int_param("limit", MAX_WORKERS_PAGE, 1, 500)
    found, after = s.workers.page(pool, limit, None if cursor is None else _worker_after(cursor))
    now = s.clock()
    views = [worker_view(w, now, s.settings.worker_stale_seconds, principal) for w in found]
    next_cursor = None if after is None else base64.urlsafe_b64encode(after.encode()).decode().rstrip("=")
    return _json(200, WorkerList(workers=views, next_cursor=next_cursor))


def _worker_after(cursor: str) -> str:
    """The worker id a workers cursor carries (base64url, so any id travels in a query string)."""
    try:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,344}", cursor):
            raise ValueError(cursor)
        after = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not after or not after.isprintable():
            raise ValueError(after)
    except ValueError as e:
        raise errors.InvalidRequest("cursor must be the next_cursor of the previous page") from e
    return after


@app.get("/v1/me")
def me() -> Response[str]:
    return _json(200, me_view(_principal()))


@app.post("/v1/tokens")
def create_token() -> Response[str]:
    principal = _principal("admin")
    request: TokenCreate = _model(TokenCreate, _body_object())
    s = bootstrap.stack()
    made = tenancy.create_token(
        s.tokens,
        user=request.user,
        groups=request.groups,
        scopes=request.scopes,
        expires_in=request.expires_in,
        created_by=principal.user,
        now=s.clock(),
    )
    return _json(201, TokenCreated(**token_view(made.token).model_dump(), token=made.secret))


@app.get("/v1/tokens")
def list_tokens() -> Response[str]:
    _principal("admin")
    user = app.current_event.get_query_string_value("user")
    found = tenancy.list_tokens(bootstrap.stack().tokens, user)
    return _json(200, TokenList(tokens=[token_view(t) for t in found]))


@app.delete("/v1/tokens/<token_id>")
def revoke_token(token_id: str) -> Response[str]:
    _principal("admin")
    if not re.fullmatch(TOKEN_ID_PATTERN, token_id):
        raise errors.NotFound(f"token {token_id[:80]!r} not found")
    tenancy.revoke_token(bootstrap.stack().tokens, token_id)
    return Response(status_code=204, content_type=content_types.APPLICATION_JSON, body="")


@app.get("/v1/users/<user>")
def get_user(user: str) -> Response[str]:
    _principal("admin")
    s = bootstrap.stack()
    return _json(200, user_view(tenancy.get_user(s.tokens, _subject(user), s.clock())))


@app.put("/v1/users/<user>")
def set_user(user: str) -> Response[str]:
    principal = _principal("admin")
    request: UserSettings = _model(UserSettings, _body_object())
    s = bootstrap.stack()
    found = tenancy.set_default_group(s.tokens, _subject(user), request.default_group, by=principal.user, now=s.clock())
    return _json(200, user_view(found))


def _subject(name: str) -> str:
    """A user or group name as a path gives it (percent-encoded: ``alice%40example.com``); the
    quota services check that it can be one."""
    return unquote(name[:400], errors="replace")


def _quota_answer(kind: QuotaKind, name: str) -> Response[str]:
    s = bootstrap.stack()
    found = quota_admin.get_quota(s.quotas, _principal("runs:read"), kind, _subject(name), s.clock)
    return _json(200, quota_view(found))


def _set_quota(kind: QuotaKind, name: str) -> Response[str]:
    principal = _principal("admin")
    request: QuotaLimits = _model(QuotaLimits, _body_object())
    s = bootstrap.stack()
    found = quota_admin.set_quota(s.quotas, principal, kind, _subject(name), request.model_dump(), s.clock)
    return _json(200, quota_view(found))


def _delete_quota(kind: QuotaKind, name: str) -> Response[str]:
    principal = _principal("admin")
    quota_admin.delete_quota(bootstrap.stack().quotas, principal, kind, _subject(name))
    return Response(status_code=204, content_type=content_types.APPLICATION_JSON, body="")


@app.get("/v1/quotas")
def list_quotas() -> Response[str]:
    s = bootstrap.stack()
    found = quota_admin.list_quotas(s.quotas, _principal("runs:read"), s.clock)
    return _json(200, QuotaList(quotas=[quota_view(q) for q in found]))


@app.get("/v1/quotas/users/<user>")
def get_user_quota(user: str) -> Response[str]:
    return _quota_answer("user", user)


@app.put("/v1/quotas/users/<user>")
def set_user_quota(user: str) -> Response[str]:
    return _set_quota("user", user)


@app.delete("/v1/quotas/users/<user>")
def delete_user_quota(user: str) -> Response[str]:
    return _delete_quota("user", user)


@app.get("/v1/quotas/groups/<group>")
def get_group_quota(group: str) -> Response[str]:
    return _quota_answer("group", group)


@app.put("/v1/quotas/groups/<group>")
def set_group_quota(group: str) -> Response[str]:
    return _set_quota("group", group)


@app.delete("/v1/quotas/groups/<group>")
def delete_group_quota(group: str) -> Response[str]:
    return _delete_quota("group", group)


def _moment(name: str) -> float | None:
    raw = app.current_event.get_query_string_value(name)
    return None if raw is None else usage.parse_moment(name, raw)


@app.get("/v1/usage")
def usage_report() -> Response[str]:
    principal = _principal("runs:read")
    query = app.current_event.get_query_string_value
    s = bootstrap.stack()
    report = usage.usage_report(
        s.store,
        s.pools,
        principal,
        user=query("user") or None,
        group=query("group") or None,
        pool=query("pool") or None,
        since=_moment("since"),
        until=_moment("until"),
        by=usage.parse_by(query("by")),
        clock=s.clock,
    )
    return _json(200, usage_view(report))


def _sweep_id(sweep_id: str) -> str:
    """A sweep id as a path gives it; one that cannot be an id is a sweep that does not exist."""
    if not _RUN_ID.fullmatch(sweep_id):
        raise errors.NotFound(f"sweep {sweep_id[:80]!r} not found")
    return sweep_id


def _sweep_answer(status: int, sweep: Sweep, headers: dict[str, str] | None = None) -> Response[str]:
    ports = bootstrap.stack().sweep_ports
    return _json(status, sweep_view(sweep, sweeps.progress(ports, sweep)), headers)


@app.post("/v1/sweeps")
def create_sweep() -> Response[str]:
    principal = _principal("runs:write")
    spec = _model(SweepSpec, _body_object())
    key = _idempotency_key()
    s = bootstrap.stack()
    secret = s.tokens.secret() if key is not None else b""
    result = sweeps.create_sweep(s.sweep_ports, principal, spec, key, secret=secret, inputs=s.input_policy)
    if result.created:
        emit("SweepsCreated", 1, "api")
    return _sweep_answer(201 if result.created else 200, result.sweep, {"Location": f"/v1/sweeps/{result.sweep.id}"})


@app.get("/v1/sweeps")
def list_sweeps() -> Response[str]:
    principal = _principal("runs:read")
    query = app.current_event.get_query_string_value
    ports = bootstrap.stack().sweep_ports
    found, cursor = sweeps.list_sweeps(
        ports, principal, query("owner") or None, _int_param("limit", 20, 1, 100), query("cursor")
    )
    texts, cut = _within_page([sweep_view(sweep) for sweep in found])  # a sweep's spec may be large
    cursor = cursor if cut is None else ports.sweeps.cursor_after(found[cut - 1])
    body = '{"sweeps": [' + ", ".join(texts) + "], " + f'"next_cursor": {json.dumps(cursor)}' + "}"
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=body)


@app.get("/v1/sweeps/<sweep_id>")
def get_sweep(sweep_id: str) -> Response[str]:
    principal = _principal("runs:read")
    return _sweep_answer(200, sweeps.get_sweep(bootstrap.stack().sweep_ports, principal, _sweep_id(sweep_id)))


@app.patch("/v1/sweeps/<sweep_id>")
def patch_sweep(sweep_id: str) -> Response[str]:
    principal = _principal("runs:write")
    request: SweepPatch = _model(SweepPatch, _body_object())
    ports = bootstrap.stack().sweep_ports
    return _sweep_answer(200, sweeps.set_max_parallel(ports, principal, _sweep_id(sweep_id), request.max_parallel))


@app.post("/v1/sweeps/<sweep_id>/kill")
def kill_sweep(sweep_id: str) -> Response[str]:
    principal = _principal("runs:write")
    return _sweep_answer(202, sweeps.kill_sweep(bootstrap.stack().sweep_ports, principal, _sweep_id(sweep_id)))


@app.post("/v1/sweeps/<sweep_id>/retry")
def retry_sweep(sweep_id: str) -> Response[str]:
    principal = _principal("runs:write")
    ports = bootstrap.stack().sweep_ports
    sweep, again = sweeps.retry_sweep(ports, principal, _sweep_id(sweep_id))
    view = sweep_view(sweep, sweeps.progress(ports, sweep))
    return _json(200, SweepRetried(**view.model_dump(), retried=again))
