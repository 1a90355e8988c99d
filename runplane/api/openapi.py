"""The OpenAPI 3.1 document of the HTTP API, generated whole from its routes (runplane/api/routing.py:
each operation's parameters, body, answers and errors) and its pydantic models.

Request bodies (``RunSpec``, ``SetPriority``, ``TokenCreate``, ``QuotaLimits``, ``SecretPut``) have the schemas of
what the API accepts (pydantic's validation mode: sizes and times may be text such as "512m" or
"2h"); answers have the schemas of what it sends (serialization mode), made exact: every field is
required and no other may appear, because the server always sends exactly the model's fields (a
client that parses answers ignores fields it does not know, so it keeps working with a newer
server). A model whose two schemas differ keeps its name for the request and is ``<name>View`` in
answers (a run's spec: ``RunSpec`` in, ``RunSpecView`` out). Every operation lists each status it
can answer with, from the error map (``STATUS``); ``x-valid-refusals`` lists those a request the
document calls valid may still get, each a status and the error code it carries (422
``unschedulable``: no pool can fit it; 422 ``not_allowed``: a bucket, a group or a quota refuses it;
400 ``bad_request``: a cursor no listing gave). A request refused for its shape is a 422
``invalid_request`` (or a 400 ``bad_request``), never one of those.
tests/integration/contracts/test_wire.py drives every operation and checks each answer against this
document.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from runplane import __version__
from runplane.api.app import status_of
from runplane.api.models import ErrorBody, Health
from runplane.api.routes import checkpoints, fleet, runs, secrets, sessions, sweeps, tenancy, uploads
from runplane.api.routing import OPERATIONS, Answer, Operation, Query, Reply, operation
from runplane.domain.records import MAX_SPEC_BYTES
from runplane.domain.wire import since_fields

ROUTES = (runs, checkpoints, sessions, sweeps, tenancy, secrets, uploads, fleet)
"""The modules whose routes the document describes (importing them declares their operations)."""

REF = "#/components/schemas/{model}"
_NAMES = {"ErrorBody": "Error"}
"""Components named other than their model."""

_VALUES = frozenset({"examples", "default", "const", "enum"})
"""Keywords whose values are data, not schemas: left alone when schemas are rewritten."""

_DESCRIPTIONS = {
    200: "ok",
    201: "created",
    202: "accepted",
    204: "done; no body",
    400: "the request cannot be read (body not UTF-8 or JSON, nested too deep, a bad cursor or parameter)",
    401: "no token, or a token that is unknown, revoked or expired",
    403: "the token lacks the scope this needs",
    404: "no such thing, or one of another user's",
    409: "conflicts with the current state",
    413: f"body too large, or a run's spec over {MAX_SPEC_BYTES} bytes as JSON (a sweep's largest member too)",
    422: "values that are not acceptable",
    503: "a backing service (database, queue, storage) failed; retry",
}

_DOCUMENT = {
    "type": "object",
    "description": "an OpenAPI 3.1 document",
    "required": ["openapi", "info", "components", "security", "paths"],
    "properties": {
        "openapi": {"type": "string", "pattern": r"^3\.1\.\d+$"},
        "info": {"type": "object", "required": ["title", "version"]},
        "components": {"type": "object", "required": ["schemas"]},
        "security": {"type": "array"},
        "paths": {"type": "object"},
    },
    "additionalProperties": False,
}


def _definitions(models: tuple[type[BaseModel], ...], mode: Literal["validation", "serialization"]) -> dict[str, Any]:
    """The JSON schemas of ``models`` and of everything they refer to, by name."""
    _, top = models_json_schema([(m, mode) for m in models], ref_template=REF)
    return dict(top.get("$defs", {}))


def _exact(schema: Any, optional: frozenset[str] = frozenset()) -> Any:
    """``schema`` with every object that lists properties closed (no others) and complete (each
    one required but those of ``optional``, at its top): an answer carries every field of its model
    and nothing else, but a field added since the previous release, left out at its default."""
    if isinstance(schema, list):
        return [_exact(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in _VALUES else _exact(v) for k, v in schema.items()}
    if isinstance(out.get("properties"), dict):
        out["required"] = [name for name in out["properties"] if name not in optional]
        out["additionalProperties"] = False
    return out


def _since(models: tuple[type[BaseModel], ...]) -> dict[str, frozenset[str]]:
    """The fields marked ``Since`` (answers leave them out at their default) of ``models`` and of
    every model they hold, by model name."""
    found: dict[str, frozenset[str]] = {}
    todo = list(models)
    while todo:
        model = todo.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = frozenset(since_fields(model))
        todo.extend(m for f in model.model_fields.values() for m in _held(f.annotation))
    return found


def _held(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _held(arg)]


def _renamed(schema: Any, names: Mapping[str, str]) -> Any:
    """``schema`` with its references to ``names``' keys pointing at their values instead."""
    if isinstance(schema, list):
        return [_renamed(s, names) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in _VALUES else _renamed(v, names) for k, v in schema.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith(REF.format(model="")):
        target = ref.removeprefix(REF.format(model=""))
        out["$ref"] = REF.format(model=names.get(target, target))
    return out


def _models(operations: list[Operation]) -> tuple[tuple[type[BaseModel], ...], tuple[type[BaseModel], ...]]:
    """The request bodies and the answers' models of ``operations``, each once, in order."""
    requests = {op.body: None for op in operations if op.body is not None}
    answers = {a.body: None for op in operations for a in op.answers.values() if isinstance(a.body, type)}
    return tuple(requests), (*answers, ErrorBody)


def component_schemas() -> dict[str, Any]:
    """Every schema the document's operations refer to, by component name."""
    request_models, answer_models = _models(OPERATIONS)
    requests = _definitions(request_models, "validation")
    since = _since(answer_models)
    responses = {
        name: _exact(schema, since.get(name, frozenset()))
        for name, schema in _definitions(answer_models, "serialization").items()
    }
    names = {name: _NAMES.get(name, name) for name in responses}
    for name, schema in responses.items():
        if name in requests and requests[name] != schema:
            names[name] = f"{name}View"
            description = f"{name} as answers show it: every field, sizes in bytes and times in seconds."
            responses[name] = {**schema, "description": description}
    # Schemas that are the same both ways (the states, the failure reasons) are shared.
    return {
        **requests,
        **{names[n]: {**_renamed(s, names), "title": names[n]} for n, s in responses.items()},
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _content(body: type[BaseModel] | dict[str, Any]) -> dict[str, Any]:
    schema = body if isinstance(body, dict) else _ref(_NAMES.get(body.__name__, body.__name__))
    return {"application/json": {"schema": schema}}


def _answer(status: int, answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"description": answer.description or _DESCRIPTIONS[status]}
    if answer.body is not None:
        out["content"] = _content(answer.body)
    if answer.headers:
        out["headers"] = {name: {"description": d, "schema": {"type": "string"}} for name, d in answer.headers.items()}
    return out


def _error(op: Operation, status: int) -> dict[str, Any]:
    description = op.notes.get(status) or _DESCRIPTIONS[status]
    valid = [f"{why} ({error.code})" for error, why in op.valid_refusals.items() if status_of(error) == status]
    if valid:
        description += f"; also for a request this document calls valid: {'; '.join(valid)}"
    return {"description": description, "content": _content(ErrorBody)}


def _query_parameters(model: type[Query], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """The query parameters of ``model``, each with the schema of one value (never null: a
    parameter not given is absent); schemas they refer to are added to ``defs``."""
    schema = model.model_json_schema(ref_template=REF, mode="validation")
    defs.update(schema.get("$defs", {}))
    out = []
    for name, prop in schema.get("properties", {}).items():
        prop = {
            k: v for k, v in prop.items() if k not in ("title", "description") and not (k == "default" and v is None)
        }
        branches = [b for b in prop.pop("anyOf", []) if b != {"type": "null"}]
        if len(branches) == 1:
            prop = {**branches[0], **prop}
        elif branches:
            prop["anyOf"] = branches
        field = model.model_fields[name]
        out.append(
            {"name": name, "in": "query", "required": field.is_required(), "schema": prop,
             "description": field.description or ""}
        )  # fmt: skip
    return out


def _parameters(op: Operation, defs: dict[str, Any]) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "pattern": p.pattern},
         "description": p.description}
        for name, p in op.path_params.items()
    ]  # fmt: skip
    if op.query is not None:
        params += _query_parameters(op.query, defs)
    if op.idempotency is not None:
        schema = {"type": "string", "minLength": 1, "maxLength": 200}
        params.append({"name": "Idempotency-Key", "in": "header", "schema": schema, "description": op.idempotency})
    return params


def _operation(op: Operation, defs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    if op.scope is None:
        out["security"] = []
    params = _parameters(op, defs)
    if params:
        out["parameters"] = params
    if op.body is not None:
        content = _content(op.body)
        content["application/json"]["examples"] = dict(op.examples)
        out["requestBody"] = {"required": True, "content": content}
    responses = {str(status): _answer(status, answer) for status, answer in op.answers.items()}
    responses |= {str(status): _error(op, status) for status in sorted(op.error_statuses())}
    out["responses"] = responses
    if op.valid_refusals:
        out["x-valid-refusals"] = sorted(
            ({"status": status_of(error), "code": error.code} for error in op.valid_refusals),
            key=lambda r: (r["status"], r["code"]),
        )
    return out


def paths(operations: list[Operation], defs: dict[str, Any]) -> dict[str, Any]:
    """The document's paths: one item per path, one operation per method."""
    out: dict[str, dict[str, Any]] = {}
    for op in operations:
        out.setdefault(op.path, {})[op.method.lower()] = _operation(op, defs)
    return out


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The document, built once per process (on first use, never at import). Callers must not
    change it."""
    defs: dict[str, Any] = {}
    described = paths(OPERATIONS, defs)
    schemas = component_schemas()
    return {
        "openapi": "3.1.0",
        "info": {"title": "runplane", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {**defs, **schemas},
        },
        "security": [{"bearer": []}],
        "paths": described,
    }


@operation(
    "GET",
    "/v1/health",
    operation_id="health",
    summary="Liveness",
    scope=None,
    answers={200: Answer(Health)},
)
def health(_: Any) -> Health:
    return Health()


@operation(
    "GET",
    "/v1/openapi.json",
    operation_id="openapi",
    summary="This document",
    scope=None,
    answers={200: Answer(_DOCUMENT)},
)
def openapi(_: Any) -> Reply:
    return Reply(openapi_document())
