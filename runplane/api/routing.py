"""Typed routes: each operation of the HTTP API is declared once, and that declaration both serves
it and describes it in the OpenAPI document (runplane/api/openapi.py).

A route declares who may call it (a scope), its path parameters (each with its pattern), its query
parameters (a ``Query`` model: types and bounds), its body (a pydantic model), the answers it gives
and the errors of the error map (``STATUS``) its service may raise. The wrapper here authenticates,
reads and checks all of these before the route runs, hands the route the ports once, and turns
what the route returns (a model, or a ``Reply``) into the answer; the route itself only calls one
service. What a user sends is strict: an unknown body field is a 422 that names it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import Response, content_types
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from runplane import bootstrap
from runplane.api.app import app, status_of
from runplane.domain import errors
from runplane.domain.tenancy import Principal
from runplane.domain.wire import shown_json
from runplane.ports import Ports
from runplane.services import auth

MAX_DEPTH = 32
_INTEGER = re.compile(r"-?[0-9]+")
"""An integer as a query parameter: digits alone (not 5.0, 1_0 or +5)."""
"""The deepest nesting of arrays and objects a body may have."""

Schema = dict[str, Any]


@dataclass(frozen=True)
class PathParam:
    """A path parameter. ``pattern`` is what the document promises; with ``checked`` the route
    answers a value that does not match as a ``what`` that does not exist (404), otherwise its
    service judges it. ``unquote``: the value is percent-decoded first (user and group names)."""

    pattern: str
    what: str
    description: str = ""
    checked: bool = True
    unquote: bool = False

    def matches(self, value: str) -> bool:
        return re.fullmatch(self.pattern.removeprefix("^").removesuffix("$"), value) is not None


class Query(BaseModel):
    """The query parameters of a route. A parameter given empty is one not given (but those of
    ``kept_empty``); others are ignored. A value that is not a number where one is needed is a
    400, one out of bounds or of the wrong form a 422 (with ``messages[field]`` as its message
    when there is one)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    messages: ClassVar[Mapping[str, str]] = {}
    kept_empty: ClassVar[frozenset[str]] = frozenset()
    """Parameters whose empty value is a value (refused by its reader), not one not given."""

    @classmethod
    def refusals(cls) -> set[int]:
        """The statuses reading these parameters can answer: 400 when one must be a number, 422
        when one has bounds, a form or a set of values (none for parameters of free text)."""
        found: set[int] = set()
        for info in cls.model_fields.values():
            kinds = set(typing.get_args(info.annotation) or (info.annotation,)) - {type(None)}
            if kinds & {int, float}:
                found.add(400)
            if info.metadata or kinds - {str}:
                found.add(422)
        return found

    @model_validator(mode="before")
    @classmethod
    def _empty_is_absent(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v != "" or k in cls.kept_empty}


@dataclass(frozen=True)
class Answer:
    """One answer of an operation: its body's model (or schema; None: no body), what it means,
    and the headers it carries (name -> description)."""

    body: type[BaseModel] | Schema | None
    description: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """What a route returns when its answer is not simply its first status with a model."""

    body: BaseModel | Schema | None
    status: int | None = None
    headers: dict[str, str] | None = None
    text: str | None = None
    """The body already serialised (a page that measured itself), sent as it is."""


@dataclass(frozen=True)
class Operation:
    """One operation: how it is served and how the document shows it."""

    method: str
    path: str
    operation_id: str
    summary: str
    scope: str | None
    """The scope a caller needs; "": any valid token; None: no token at all."""
    answers: Mapping[int, Answer]
    path_params: Mapping[str, PathParam] = field(default_factory=dict)
    query: type[Query] | None = None
    body: type[BaseModel] | None = None
    examples: Mapping[str, Any] = field(default_factory=dict)
    raises: tuple[type[errors.RunplaneError], ...] = ()
    """What the service may raise beyond what reading the request and the token can."""
    notes: Mapping[int, str] = field(default_factory=dict)
    """Statuses whose meaning here is more than the common one: status -> description."""
    valid_refusals: Mapping[type[errors.RunplaneError], str] = field(default_factory=dict)
    """The errors a request the document calls valid may still get, and why (a pool that cannot fit
    it, a cursor no listing gave): in the document as ``x-valid-refusals``, each its status and its
    code. A refusal for the request's shape is never one of them."""
    idempotency: str | None = None
    """What the Idempotency-Key header does here (None: not read)."""

    def error_statuses(self) -> set[int]:
        """Every error status this operation can answer with."""
        found = {status_of(e) for e in self.raises}
        if self.scope is not None:
            found |= {401, 503} | ({403} if self.scope else set())
        if any(p.checked for p in self.path_params.values()):
            found.add(404)
        if self.query is not None:
            found |= self.query.refusals()
        if self.body is not None:
            found |= {400, 413, 422}
        return found | {status_of(e) for e in self.valid_refusals} | {s for s in self.notes if s >= 400}


OPERATIONS: list[Operation] = []
"""Every operation, in the order their routes were declared."""


class Call:
    """What a route is handed: the ports every service takes (the process's, read once per request,
    on first use) and the caller."""

    def __init__(self) -> None:
        self._principal: Principal | None = None

    def authenticate(self, scope: str | None) -> None:
        """Know the caller, who must hold ``scope`` ("": any valid token; None: no token is read).
        Raises Unauthorized or Forbidden."""
        if scope is None:
            return
        header = app.current_event.get_header_value("authorization")
        self._principal = auth.authenticate(self.ports.tokens, header, now=self.ports.clock())
        if scope:
            auth.require(self._principal, scope)

    @cached_property
    def ports(self) -> Ports:
        return bootstrap.stack().ports

    @property
    def principal(self) -> Principal:
        if self._principal is None:
            raise errors.Unauthorized("this route takes no token")
        return self._principal


def operation(
    method: str,
    path: str,
    *,
    operation_id: str,
    summary: str,
    scope: str | None,
    answers: Mapping[int, Answer],
    path_params: Mapping[str, PathParam] | None = None,
    query: type[Query] | None = None,
    body: type[BaseModel] | None = None,
    examples: Mapping[str, Any] | None = None,
    raises: tuple[type[errors.RunplaneError], ...] = (),
    notes: Mapping[int, str] | None = None,
    valid_refusals: Mapping[type[errors.RunplaneError], str] | None = None,
    idempotency: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare and serve one operation (the arguments are ``Operation``'s fields). The route is
    called with the ``Call``, its path parameters by name, ``query`` (the ``Query`` model), ``body``
    (the body model) and ``key`` (the Idempotency-Key header), each when declared."""
    op = Operation(
        method, path, operation_id, summary, scope, answers, path_params or {}, query, body, examples or {},
        raises, notes or {}, valid_refusals or {}, idempotency,
    )  # fmt: skip
    OPERATIONS.append(op)

    def register(route: Callable[..., Any]) -> Callable[..., Any]:
        def serve(**raw: str) -> Response[str]:
            call = Call()
            call.authenticate(op.scope)
            args: dict[str, Any] = {name: _path_value(raw[name], p) for name, p in op.path_params.items()}
            if op.query is not None:
                args["query"] = _query(op.query)
            if op.body is not None:
                args["body"] = _model(op.body, _body_object(call))
            if op.idempotency is not None:
                args["key"] = _idempotency_key()
            return _respond(op, route(call, **args))

        app.route(re.sub(r"\{(\w+)\}", r"<\1>", path), method)(serve)
        return route

    return register


def _path_value(raw: str, param: PathParam) -> str:
    value = unquote(raw[:400], errors="replace") if param.unquote else raw
    if param.checked and not param.matches(value):
        raise errors.NotFound(f"{param.what} {value[:80]!r} not found")
    return value


def _respond(op: Operation, result: Reply | BaseModel | Schema | None) -> Response[str]:
    reply = result if isinstance(result, Reply) else Reply(result)
    status = reply.status or next(iter(op.answers))
    if reply.text is not None:
        text = reply.text
    elif reply.body is None:
        text = ""
    elif isinstance(reply.body, BaseModel):
        text = shown_json(reply.body)
    else:
        text = json.dumps(reply.body)
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=text, headers=reply.headers)


def _query(model: type[Query]) -> Query:
    params = app.current_event.query_string_parameters or {}
    for name, info in model.model_fields.items():
        raw = params.get(name)
        if raw and int in (typing.get_args(info.annotation) or (info.annotation,)) and not _INTEGER.fullmatch(raw):
            raise errors.BadRequest(f"query parameter {name} must be an integer")
    try:
        return model.model_validate(dict(params))
    except ValidationError as e:
        raise _query_error(model, e.errors()[0], params) from e


def _query_error(model: type[Query], err: Any, params: Mapping[str, str]) -> errors.RunplaneError:
    kind = str(err["type"])
    if not err["loc"]:  # parameters that may not be given together
        return errors.InvalidRequest(str(err["msg"]).removeprefix("Value error, "))
    name = str(err["loc"][0])
    if kind.endswith("_parsing") or kind.endswith("_type"):
        return errors.BadRequest(f"query parameter {name} must be {'an integer' if 'int' in kind else 'a number'}")
    info = model.model_fields.get(name)
    bounds = {k: getattr(m, k) for m in (info.metadata if info else []) for k in ("ge", "le") if hasattr(m, k)}
    if kind in ("greater_than_equal", "less_than_equal") and len(bounds) == 2:
        return errors.InvalidRequest(f"query parameter {name} must be between {bounds['ge']} and {bounds['le']}")
    if name in model.messages:
        return errors.InvalidRequest(model.messages[name].format(value=repr(str(params.get(name, ""))[:40])))
    return errors.InvalidRequest(f"query parameter {name}: {str(err['msg']).removeprefix('Value error, ')}")


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


def _body_object(call: Call) -> dict[str, Any]:
    """The body as a JSON object. Raises PayloadTooLarge or BadRequest (with what is wrong) for a
    body that is too big, not UTF-8, not JSON, nested too deep, or holds NaN or Infinity."""
    event = app.current_event
    raw: bytes
    text = event.body or ""
    try:
        raw = base64.b64decode(text, validate=True) if event.is_base64_encoded else text.encode()
    except (binascii.Error, ValueError) as e:
        raise errors.BadRequest("body is not valid base64") from e
    limit = call.ports.settings.max_body_bytes
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


def _model(model: type[BaseModel], data: dict[str, Any]) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise errors.InvalidRequest(validation_message(e)) from e


def validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(p)[:80] for p in err["loc"]) or "body"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _idempotency_key() -> str | None:
    key = app.current_event.get_header_value("idempotency-key")
    if key is not None and not 1 <= len(key) <= 200:
        raise errors.InvalidRequest("Idempotency-Key must be 1 to 200 characters")
    return key
