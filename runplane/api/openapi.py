"""The OpenAPI 3.1 document of the HTTP API. Request bodies and the token answers take their
schemas from the pydantic models (``RunSpec``, ``runplane.api.models``); every operation lists
each status it can answer with, so a client (or a fuzzer) meets no undocumented one."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

from runplane import __version__
from runplane.api.models import Me, TokenCreate, TokenCreated, TokenList
from runplane.domain.models import FailureReason, RunSpec, RunState

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}

_NULLABLE_STRING = {"type": ["string", "null"]}
_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}

_RUN = {
    "type": "object",
    "required": ["id", "state", "owner", "queue", "spec", "attempt", "max_attempts", "created_at", "events"],
    "properties": {
        "id": {"type": "string"},
        "name": _NULLABLE_STRING,
        "state": {"type": "string", "enum": [s.value for s in RunState]},
        "owner": {"type": "string"},
        "queue": {"type": "string"},
        "spec": {"$ref": "#/components/schemas/RunSpec"},
        "attempt": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "worker_id": _NULLABLE_STRING,
        "created_at": _TIME,
        "started_at": _NULLABLE_TIME,
        "finished_at": _NULLABLE_TIME,
        "exit_code": {"type": ["integer", "null"]},
        "failure": {
            "type": ["object", "null"],
            "properties": {
                "reason": {"type": "string", "enum": [r.value for r in FailureReason]},
                "message": {"type": "string"},
            },
        },
        "waiting_reason": _NULLABLE_STRING,
        "kill_requested": {"type": "boolean"},
        "usage": {"type": "object"},
        "events": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"at": _TIME, "state": _NULLABLE_STRING, "message": {"type": "string"}},
            },
        },
    },
}

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
    413: "body too large",
    422: "values that are not acceptable",
}


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {
            "description": _DESCRIPTIONS[c],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for c in codes
    }


def _ok(status: int, schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    return {
        str(status): {
            "description": description or _DESCRIPTIONS[status],
            "content": {"application/json": {"schema": schema}},
        }
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(name)}}}


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


_RUN_ID = [{"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_RUN_REF = _ref("Run")
_CURSOR = _query("cursor", {"type": "string"}, "the next_cursor of the previous page")
# Every route but health and the document itself needs a token: 401 without one, 403 without the scope.
_AUTH = (401, 403)


def _models(*models: type[BaseModel]) -> dict[str, Any]:
    """The JSON schemas of ``models`` (and what they refer to), keyed by name."""
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _runs_paths() -> dict[str, Any]:
    return {
        "/v1/runs": {
            "post": {
                "operationId": "submitRun",
                "summary": "Submit a run",
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string", "maxLength": 200}}
                ],
                "requestBody": _body("RunSpec"),
                "responses": {
                    **_ok(201, _RUN_REF),
                    **_ok(200, _RUN_REF, "replayed: the run this Idempotency-Key made"),
                    **_errors(400, *_AUTH, 404, 409, 413, 422),
                },
            },
            "get": {
                "operationId": "listRuns",
                "summary": "List your runs (an admin: anyone's), newest first; pages stay under 5 MB",
                "parameters": [
                    _query("state", {"type": "string", "enum": [s.value for s in RunState]}),
                    _query("queue", {"type": "string"}),
                    _query("owner", {"type": "string"}, "another user's runs (admins only)"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}),
                    _CURSOR,
                ],
                "responses": {
                    **_ok(
                        200,
                        {
                            "type": "object",
                            "required": ["runs", "next_cursor"],
                            "properties": {
                                "runs": {"type": "array", "items": _RUN_REF},
                                "next_cursor": _NULLABLE_STRING,
                            },
                        },
                    ),
                    **_errors(400, *_AUTH, 422),
                },
            },
        },
        "/v1/runs/{run_id}": {
            "get": {
                "operationId": "getRun",
                "summary": "One run",
                "parameters": _RUN_ID,
                "responses": {**_ok(200, _RUN_REF), **_errors(*_AUTH, 404)},
            }
        },
        "/v1/runs/{run_id}/kill": {
            "post": {
                "operationId": "killRun",
                "summary": "Kill a run",
                "parameters": _RUN_ID,
                "responses": {**_ok(202, _RUN_REF), **_errors(*_AUTH, 404, 409)},
            }
        },
        "/v1/runs/{run_id}/logs": {
            "get": {
                "operationId": "readLogs",
                "summary": "Read stdout or stderr from an offset, also while the run goes",
                "parameters": [
                    *_RUN_ID,
                    _query("stream", {"type": "string", "enum": ["stdout", "stderr"]}),
                    _query("offset", {"type": "integer", "minimum": 0}),
                ],
                "responses": {
                    **_ok(
                        200,
                        {
                            "type": "object",
                            "required": ["data", "next_offset", "complete"],
                            "properties": {
                                "data": {"type": "string"},
                                "next_offset": {"type": "integer"},
                                "complete": {"type": "boolean"},
                            },
                        },
                    ),
                    **_errors(400, *_AUTH, 404, 422),
                },
            }
        },
        "/v1/runs/{run_id}/outputs": {
            "get": {
                "operationId": "listOutputs",
                "summary": "Output files with download URLs, a page at a time",
                "parameters": [*_RUN_ID, _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}), _CURSOR],
                "responses": {
                    **_ok(
                        200,
                        {
                            "type": "object",
                            "required": ["files", "next_cursor", "complete"],
                            "properties": {
                                "files": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["path", "size", "url"],
                                        "properties": {
                                            "path": {"type": "string"},
                                            "size": {"type": "integer"},
                                            "url": {"type": "string"},
                                        },
                                    },
                                },
                                "next_cursor": _NULLABLE_STRING,
                                "complete": {"type": "boolean"},
                            },
                        },
                    ),
                    **_errors(400, *_AUTH, 404, 422),
                },
            }
        },
    }


def _admin_paths() -> dict[str, Any]:
    token_id = [{"name": "token_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "/v1/me": {
            "get": {
                "operationId": "whoAmI",
                "summary": "Who the caller's token acts for (any valid token)",
                "responses": {**_ok(200, _ref("Me")), **_errors(401)},
            }
        },
        "/v1/tokens": {
            "post": {
                "operationId": "createToken",
                "summary": "Make a token for a user (admin); its secret is in this answer only",
                "requestBody": _body("TokenCreate"),
                "responses": {**_ok(201, _ref("TokenCreated")), **_errors(400, *_AUTH, 413, 422)},
            },
            "get": {
                "operationId": "listTokens",
                "summary": "Every token, never a secret (admin)",
                "parameters": [_query("user", {"type": "string"}, "only this user's")],
                "responses": {**_ok(200, _ref("TokenList")), **_errors(*_AUTH)},
            },
        },
        "/v1/tokens/{token_id}": {
            "delete": {
                "operationId": "revokeToken",
                "summary": "Revoke a token (admin): refused everywhere within seconds",
                "parameters": token_id,
                "responses": {"204": {"description": _DESCRIPTIONS[204]}, **_errors(*_AUTH, 404)},
            }
        },
    }


def _fleet_paths() -> dict[str, Any]:
    return {
        "/v1/pools": {
            "get": {
                "operationId": "listPools",
                "summary": "Pools with backlog and workers",
                "responses": {**_ok(200, {"type": "object", "required": ["pools"]}), **_errors(*_AUTH)},
            }
        },
        "/v1/workers": {
            "get": {
                "operationId": "listWorkers",
                "summary": "Workers and their last heartbeat (run ids: only your own runs')",
                "responses": {**_ok(200, {"type": "object", "required": ["workers"]}), **_errors(*_AUTH)},
            }
        },
        "/v1/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness",
                "security": [],
                "responses": _ok(200, {"type": "object"}),
            }
        },
        "/v1/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": _ok(200, {"type": "object"}),
            }
        },
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "runplane", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **_models(RunSpec, TokenCreate, TokenCreated, TokenList, Me),
                "Run": _RUN,
                "Error": _ERROR,
            },
        },
        "security": [{"bearer": []}],
        "paths": {**_runs_paths(), **_admin_paths(), **_fleet_paths()},
    }
