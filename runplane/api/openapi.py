"""The OpenAPI 3.1 document of the HTTP API, built from the domain models."""

from __future__ import annotations

import functools
from typing import Any

from runplane import __version__
from runplane.domain.models import RunSpec, RunState

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

_RUN = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "name": {"type": ["string", "null"]},
        "state": {"type": "string", "enum": [s.value for s in RunState]},
        "owner": {"type": "string"},
        "queue": {"type": "string"},
        "spec": {"$ref": "#/components/schemas/RunSpec"},
        "attempt": {"type": "integer"},
        "worker_id": {"type": ["string", "null"]},
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": {"type": ["string", "null"], "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "exit_code": {"type": ["integer", "null"]},
        "failure": {
            "type": ["object", "null"],
            "properties": {"reason": {"type": "string"}, "message": {"type": "string"}},
        },
        "waiting_reason": {"type": ["string", "null"]},
        "usage": {"type": "object"},
        "events": {"type": "array", "items": {"type": "object"}},
    },
}


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {
            "description": "error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for c in codes
    }


def _ok(status: int, schema: dict[str, Any], description: str = "ok") -> dict[str, Any]:
    return {str(status): {"description": description, "content": {"application/json": {"schema": schema}}}}


_RUN_ID = [{"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_RUN_REF = {"$ref": "#/components/schemas/Run"}


@functools.cache
def openapi_document() -> dict[str, Any]:
    spec_schema = RunSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = spec_schema.pop("$defs", {})
    return {
        "openapi": "3.1.0",
        "info": {"title": "runplane", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"RunSpec": spec_schema, "Run": _RUN, "Error": _ERROR, **defs},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/runs": {
                "post": {
                    "summary": "Submit a run",
                    "parameters": [{"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}}],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunSpec"}}},
                    },
                    "responses": {
                        **_ok(201, _RUN_REF, "created"),
                        **_ok(200, _RUN_REF, "replayed"),
                        **_errors(400, 401, 403, 409, 413, 422),
                    },
                },
                "get": {
                    "summary": "List your runs, newest first",
                    "parameters": [
                        {"name": "state", "in": "query", "schema": {"type": "string"}},
                        {"name": "queue", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        **_ok(
                            200,
                            {
                                "type": "object",
                                "properties": {
                                    "runs": {"type": "array", "items": _RUN_REF},
                                    "next_cursor": {"type": ["string", "null"]},
                                },
                            },
                        ),
                        **_errors(400, 401, 422),
                    },
                },
            },
            "/v1/runs/{run_id}": {
                "get": {
                    "summary": "One run",
                    "parameters": _RUN_ID,
                    "responses": {**_ok(200, _RUN_REF), **_errors(401, 403, 404)},
                }
            },
            "/v1/runs/{run_id}/kill": {
                "post": {
                    "summary": "Kill a run",
                    "parameters": _RUN_ID,
                    "responses": {**_ok(202, _RUN_REF, "kill accepted"), **_errors(401, 403, 404, 409)},
                }
            },
            "/v1/runs/{run_id}/logs": {
                "get": {
                    "summary": "Read stdout or stderr from an offset, also while the run goes",
                    "parameters": [
                        *_RUN_ID,
                        {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
                        {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    ],
                    "responses": {
                        **_ok(
                            200,
                            {
                                "type": "object",
                                "properties": {
                                    "data": {"type": "string"},
                                    "next_offset": {"type": "integer"},
                                    "complete": {"type": "boolean"},
                                },
                            },
                        ),
                        **_errors(401, 403, 404, 422),
                    },
                }
            },
            "/v1/runs/{run_id}/outputs": {
                "get": {
                    "summary": "Output files with download URLs",
                    "parameters": _RUN_ID,
                    "responses": {
                        **_ok(200, {"type": "object", "properties": {"files": {"type": "array"}}}),
                        **_errors(401, 403, 404),
                    },
                }
            },
            "/v1/pools": {
                "get": {
                    "summary": "Pools with backlog and workers",
                    "responses": {**_ok(200, {"type": "object"}), **_errors(401)},
                }
            },
            "/v1/workers": {
                "get": {
                    "summary": "Workers and their last heartbeat",
                    "responses": {**_ok(200, {"type": "object"}), **_errors(401)},
                }
            },
            "/v1/health": {"get": {"summary": "Liveness", "security": [], "responses": _ok(200, {"type": "object"})}},
            "/v1/openapi.json": {
                "get": {"summary": "This document", "security": [], "responses": _ok(200, {"type": "object"})}
            },
        },
    }
