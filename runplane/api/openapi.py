"""The OpenAPI 3.1 document of the HTTP API, generated from its pydantic models.

Request bodies (``RunSpec``, ``SetPriority``, ``TokenCreate``, ``QuotaLimits``) have the schemas of
what the API accepts (pydantic's validation mode: sizes and times may be text such as "512m" or
"2h"); answers have the schemas of what it sends (serialization mode), made exact: every field is
required and no other may appear, because the server always sends exactly the model's fields (a
client that parses answers ignores fields it does not know, so it keeps working with a newer
server). A model whose two schemas differ keeps its name for the request and is ``<name>View`` in
answers (a run's spec: ``RunSpec`` in, ``RunSpecView`` out). Every operation lists each status it
can answer with, so a client (or a fuzzer) meets no undocumented one;
tests/integration/contracts/test_wire.py drives every operation and checks each answer against this
document.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from runplane import __version__
from runplane.api.models import (
    ErrorBody,
    Health,
    LogPage,
    Me,
    OutputPage,
    PoolList,
    QuotaLimits,
    QuotaList,
    QuotaView,
    RunPage,
    RunView,
    SetPriority,
    SweepPage,
    SweepPatch,
    SweepRetried,
    SweepView,
    TokenCreate,
    TokenCreated,
    TokenList,
    UsageReport,
    UserSettings,
    UserView,
    WorkerList,
)
from runplane.domain.common import NAME_PATTERN
from runplane.domain.records import MAX_SPEC_BYTES
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.sweeps import SweepSpec

REF = "#/components/schemas/{model}"
REQUESTS: tuple[type[BaseModel], ...] = (
    RunSpec,
    SetPriority,
    TokenCreate,
    UserSettings,
    QuotaLimits,
    SweepSpec,
    SweepPatch,
)
RESPONSES: tuple[type[BaseModel], ...] = (
    RunView,
    RunPage,
    LogPage,
    OutputPage,
    PoolList,
    WorkerList,
    Health,
    ErrorBody,
    TokenCreated,
    TokenList,
    UserView,
    Me,
    QuotaView,
    QuotaList,
    UsageReport,
    SweepView,
    SweepRetried,
    SweepPage,
)
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

_RUN_EXAMPLES = {
    "train": {
        "summary": "sizes and the time limit as text",
        "value": {
            "command": "python train.py --epochs 10",
            "image": "python:3.12",
            "name": "train",
            "queue": "default",
            "resources": {"cpus": 2, "gpus": 0, "memory": "4g", "disk": "10g", "time": "2h"},
            "env": {"EPOCHS": "10"},
            "inputs": {"data": "s3://datasets/mnist/"},
        },
    },
    "minimal": {"summary": "a command alone: the default pool, its image, its limits", "value": {"command": "echo hi"}},
    "after": {
        "summary": "waits for a run's outputs (queued, holding no worker, until that run has succeeded)",
        "value": {
            "command": "python evaluate.py /inputs/model",
            "inputs": {"model": "run:r-4f9c2a7be0d14d3aa1c05e21/checkpoints"},
            "after": ["r-8d1e0b5c9a7f4e2b8c6d3a10"],
        },
    },
}
_PRIORITY_EXAMPLES = {
    "urgent": {"summary": "ahead of every waiting run of priority 79 or less", "value": {"priority": 80}},
    "later": {"summary": "behind the others: a run that can wait", "value": {"priority": 10}},
}
_PRIORITY_403 = (
    "the token lacks the scope this needs, or a caller who is not an admin asks a priority above the "
    "pool's max_user_priority"
)
_RELEASE_403 = (
    "the token lacks the scope this needs, the sweep's owner is no longer in the group it is charged to or "
    "allowed its inputs, or a caller who is not an admin would release members at a priority above the "
    "pool's max_user_priority"
)
_USER_EXAMPLES = {
    "default": {"summary": "runs naming no group are charged to vision", "value": {"default_group": "vision"}},
    "none": {"summary": "no default: a run must name its group", "value": {"default_group": None}},
}
_TOKEN_EXAMPLES = {
    "user": {
        "summary": "a user of the group vision for 90 days",
        "value": {"user": "alice", "groups": ["vision"], "scopes": ["runs:read", "runs:write"], "expires_in": "90d"},
    }
}
_QUOTA_EXAMPLES = {
    "caps": {
        "summary": "at most 4 runs and 2 GPUs at once, 200 GPU-hours a month",
        "value": {"max_running": 4, "max_gpus": 2, "gpu_hours": 200, "period": "month"},
    },
    "daily": {"summary": "100 cpu-hours a day", "value": {"cpu_hours": 100, "period": "day"}},
    "count": {"summary": "no limit: only count use", "value": {}},
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


def _exact(schema: Any) -> Any:
    """``schema`` with every object that lists properties closed (no others) and complete (each
    one required): an answer carries every field of its model and nothing else."""
    if isinstance(schema, list):
        return [_exact(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in _VALUES else _exact(v) for k, v in schema.items()}
    if isinstance(out.get("properties"), dict):
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


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


def component_schemas() -> dict[str, Any]:
    """Every schema the document's operations refer to, by component name."""
    requests = _definitions(REQUESTS, "validation")
    responses = {name: _exact(schema) for name, schema in _definitions(RESPONSES, "serialization").items()}
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


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {"description": _DESCRIPTIONS[c], "content": {"application/json": {"schema": _ref("Error")}}}
        for c in codes
    }


def _ok(status: int, schema: str | dict[str, Any], description: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        str(status): {
            "description": description or _DESCRIPTIONS[status],
            "content": {"application/json": {"schema": _ref(schema) if isinstance(schema, str) else schema}},
            **extra,
        }
    }


def _forbidden(responses: dict[str, Any], description: str) -> dict[str, Any]:
    """``responses`` with the 403's description replaced (an operation refused for more than a
    missing scope)."""
    return {**responses, "403": {**responses["403"], "description": description}}


def _body(name: str, examples: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(name), "examples": examples}}}


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_RUN_ID = [_path("run_id")]
_CURSOR = _query("cursor", {"type": "string"}, "the next_cursor of the previous page")
_ATTEMPT = _query(
    "attempt", {"type": "integer", "minimum": 1}, "which attempt's (1 to the run's attempt; default: the latest)"
)
_LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": 500})
_LOCATION = {"Location": {"description": "the run's address", "schema": {"type": "string"}}}
# Every route but health and the document itself reads the token store (401 without a token, 503
# when the store fails) and, all but /v1/me, needs a scope (403).
_AUTH = (401, 403, 503)


def _runs_paths() -> dict[str, Any]:
    return {
        "/v1/runs": {
            "post": {
                "operationId": "submitRun",
                "summary": "Submit a run",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                        "description": "a retry with the same key and body returns the same run (200)",
                    }
                ],
                "requestBody": _body("RunSpec", _RUN_EXAMPLES),
                "responses": _forbidden(
                    {
                        **_ok(201, "RunView", headers=_LOCATION),
                        **_ok(200, "RunView", "replayed: the run this Idempotency-Key made", headers=_LOCATION),
                        **_errors(400, *_AUTH, 404, 409, 413, 422),
                    },
                    _PRIORITY_403,
                ),
            },
            "get": {
                "operationId": "listRuns",
                "summary": "List your runs (an admin: anyone's), newest first; pages stay under 5 MB",
                "parameters": [
                    _query("state", {"type": "string", "enum": [s.value for s in RunState]}),
                    _query("queue", {"type": "string"}),
                    _query("owner", {"type": "string"}, "another user's runs (admins only)"),
                    _query(
                        "sweep",
                        {"type": "string"},
                        "the members of this sweep released so far, in index order (not with owner or queue)",
                    ),
                    _LIMIT,
                    _CURSOR,
                ],
                "responses": {**_ok(200, "RunPage"), **_errors(400, *_AUTH, 404, 422)},
            },
        },
        "/v1/runs/{run_id}": {
            "get": {
                "operationId": "getRun",
                "summary": "One run; a queued one says why it waits",
                "parameters": _RUN_ID,
                "responses": {**_ok(200, "RunView"), **_errors(*_AUTH, 404)},
            }
        },
        "/v1/runs/{run_id}/kill": {
            "post": {
                "operationId": "killRun",
                "summary": "Kill a run: a queued one at once, a running one within seconds",
                "parameters": _RUN_ID,
                "responses": {**_ok(202, "RunView"), **_errors(*_AUTH, 404, 409)},
            }
        },
        "/v1/runs/{run_id}/priority": {
            "post": {
                "operationId": "setRunPriority",
                "summary": "Change a queued run's priority (a user: up to the pool's max_user_priority)",
                "parameters": _RUN_ID,
                "requestBody": _body("SetPriority", _PRIORITY_EXAMPLES),
                "responses": _forbidden(
                    {
                        **_ok(200, "RunView", "changed; the run as it is now"),
                        **_errors(400, *_AUTH, 404, 409, 413, 422),
                    },
                    _PRIORITY_403 + ", or its owner is no longer in the group it is charged to or allowed its inputs",
                ),
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
                    _ATTEMPT,
                ],
                "responses": {**_ok(200, "LogPage"), **_errors(400, *_AUTH, 404, 422)},
            }
        },
        "/v1/runs/{run_id}/outputs": {
            "get": {
                "operationId": "listOutputs",
                "summary": "Output files with download URLs, a page at a time",
                "parameters": [*_RUN_ID, _LIMIT, _CURSOR, _ATTEMPT],
                "responses": {**_ok(200, "OutputPage"), **_errors(400, *_AUTH, 404, 422)},
            }
        },
    }


_SWEEP_EXAMPLES = {
    "grid": {
        "summary": "3 learning rates times 2 seeds, at most 2 at once",
        "value": {
            "name": "lr-search",
            "run": {"command": "python train.py --lr $LR --seed $SEED", "resources": {"gpus": 1, "time": "2h"}},
            "parameters": {"LR": [0.1, 0.01, 0.001], "SEED": [1, 2]},
            "max_parallel": 2,
        },
    },
    "repeat": {
        "summary": "the same run 100 times (RUNPLANE_SWEEP_INDEX tells them apart)",
        "value": {"run": {"command": "python eval.py --shard $RUNPLANE_SWEEP_INDEX"}, "count": 100},
    },
}
_SWEEP_ID = [_path("sweep_id")]


def _sweep_paths() -> dict[str, Any]:
    return {
        "/v1/sweeps": {
            "post": {
                "operationId": "createSweep",
                "summary": "Make a sweep: one run per point of a parameter grid (times count), up to 10,000",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                        "description": "a retry with the same key and body returns the same sweep (200)",
                    }
                ],
                "requestBody": _body("SweepSpec", _SWEEP_EXAMPLES),
                "responses": _forbidden(
                    {
                        **_ok(201, "SweepView"),
                        **_ok(200, "SweepView", "replayed: the sweep this Idempotency-Key made"),
                        **_errors(400, *_AUTH, 404, 409, 413, 422),
                    },
                    _PRIORITY_403,
                ),
            },
            "get": {
                "operationId": "listSweeps",
                "summary": "Your sweeps (an admin: anyone's), newest first, counted as last recorded",
                "parameters": [
                    _query("owner", {"type": "string"}, "another user's sweeps (admins only)"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                    _CURSOR,
                ],
                "responses": {**_ok(200, "SweepPage"), **_errors(400, *_AUTH, 422)},
            },
        },
        "/v1/sweeps/{sweep_id}": {
            "get": {
                "operationId": "getSweep",
                "summary": "One sweep: members by state and failure reason",
                "parameters": _SWEEP_ID,
                "responses": {**_ok(200, "SweepView"), **_errors(*_AUTH, 404)},
            },
            "patch": {
                "operationId": "updateSweep",
                "summary": "Change max_parallel while the sweep goes",
                "parameters": _SWEEP_ID,
                "requestBody": _body("SweepPatch", {"four": {"summary": "4 at once", "value": {"max_parallel": 4}}}),
                "responses": _forbidden(
                    {**_ok(200, "SweepView"), **_errors(400, *_AUTH, 404, 409, 413, 422)}, _RELEASE_403
                ),
            },
        },
        "/v1/sweeps/{sweep_id}/kill": {
            "post": {
                "operationId": "killSweep",
                "summary": "End every unfinished member (running ones within seconds)",
                "parameters": _SWEEP_ID,
                "responses": {**_ok(202, "SweepView"), **_errors(*_AUTH, 404, 409)},
            }
        },
        "/v1/sweeps/{sweep_id}/retry": {
            "post": {
                "operationId": "retrySweep",
                "summary": "Run again the members whose latest try failed, was killed or timed out",
                "parameters": _SWEEP_ID,
                "responses": _forbidden({**_ok(200, "SweepRetried"), **_errors(*_AUTH, 404, 409, 413)}, _RELEASE_403),
            }
        },
    }


def _admin_paths() -> dict[str, Any]:
    return {
        "/v1/me": {
            "get": {
                "operationId": "whoAmI",
                "summary": "Who the caller's token acts for (any valid token)",
                "responses": {**_ok(200, "Me"), **_errors(401, 503)},
            }
        },
        "/v1/tokens": {
            "post": {
                "operationId": "createToken",
                "summary": "Make a token for a user (admin); its secret is in this answer only",
                "requestBody": _body("TokenCreate", _TOKEN_EXAMPLES),
                "responses": {**_ok(201, "TokenCreated"), **_errors(400, *_AUTH, 413, 422)},
            },
            "get": {
                "operationId": "listTokens",
                "summary": "Every token, never a secret (admin)",
                "parameters": [_query("user", {"type": "string"}, "only this user's")],
                "responses": {**_ok(200, "TokenList"), **_errors(*_AUTH)},
            },
        },
        "/v1/tokens/{token_id}": {
            "delete": {
                "operationId": "revokeToken",
                "summary": "Revoke a token (admin): refused everywhere within seconds",
                "parameters": [_path("token_id")],
                "responses": {"204": {"description": _DESCRIPTIONS[204]}, **_errors(*_AUTH, 404)},
            }
        },
        "/v1/users/{user}": {
            "get": {
                "operationId": "getUser",
                "summary": "A user's groups (those of their tokens now) and default group (admin)",
                "parameters": [_path("user")],
                "responses": {**_ok(200, "UserView"), **_errors(*_AUTH, 404, 422)},
            },
            "put": {
                "operationId": "setUser",
                "summary": "Set a user's default group (admin): the group their runs naming none are charged to",
                "parameters": [_path("user")],
                "requestBody": _body("UserSettings", _USER_EXAMPLES),
                "responses": {**_ok(200, "UserView"), **_errors(400, *_AUTH, 404, 413, 422)},
            },
        },
    }


def _quota_item(kind: str, param: str, what: str) -> dict[str, Any]:
    """The three operations on one user's or group's quota."""
    name = kind.capitalize()
    parameters = [
        {
            "name": param,
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": f"the {what} (percent-encoded); a name that cannot be one is a quota that does not exist",
        }
    ]
    return {
        "get": {
            "operationId": f"get{name}Quota",
            "summary": f"A {what}'s quota and its use (an admin: any; a user: their own and their groups')",
            "parameters": parameters,
            "responses": {**_ok(200, "QuotaView"), **_errors(*_AUTH, 404)},
        },
        "put": {
            "operationId": f"set{name}Quota",
            "summary": f"Set a {what}'s quota (admin): the limits given replace all it had",
            "parameters": parameters,
            "requestBody": _body("QuotaLimits", _QUOTA_EXAMPLES),
            "responses": {
                **_ok(200, "QuotaView", "stored; with its use now"),
                **_errors(400, *_AUTH, 413, 422),
            },
        },
        "delete": {
            "operationId": f"delete{name}Quota",
            "summary": f"Remove a {what}'s quota (admin): its runs are no longer held to it",
            "parameters": parameters,
            "responses": {"204": {"description": _DESCRIPTIONS[204]}, **_errors(*_AUTH, 404)},
        },
    }


def _quota_paths() -> dict[str, Any]:
    return {
        "/v1/quotas": {
            "get": {
                "operationId": "listQuotas",
                "summary": "Quotas and their use: every one (an admin), or those that apply to you",
                "responses": {**_ok(200, "QuotaList"), **_errors(*_AUTH)},
            }
        },
        "/v1/quotas/users/{user}": _quota_item("user", "user", "user"),
        "/v1/quotas/groups/{group}": _quota_item("group", "group", "group"),
    }


_MOMENT = {"type": "string", "examples": ["2026-11-01", "2026-11-01T09:30:00Z", "1793491200"]}


def _usage_paths() -> dict[str, Any]:
    return {
        "/v1/usage": {
            "get": {
                "operationId": "getUsage",
                "summary": "What runs submitted in a window used, per user, group or pool: yours (an admin: anyone's)",
                "parameters": [
                    _query("user", {"type": "string"}, "only this user's runs; another user's: admins only (403)"),
                    _query("group", {"type": "string"}, "only runs charged to this group"),
                    _query("pool", {"type": "string"}, "only runs of this pool"),
                    _query("since", _MOMENT, "ISO 8601 (UTC if no zone) or Unix seconds; default: this month (UTC)"),
                    _query("until", _MOMENT, "ISO 8601 or Unix seconds, exclusive; default: now"),
                    _query("by", {"type": "string", "enum": ["user", "group", "pool"]}, "rows per (default: user)"),
                ],
                "responses": {**_ok(200, "UsageReport"), **_errors(400, *_AUTH, 422)},
            }
        }
    }


def _fleet_paths() -> dict[str, Any]:
    return {
        "/v1/pools": {
            "get": {
                "operationId": "listPools",
                "summary": "Pools with backlog, workers (as the dispatcher last counted them) and launches",
                "responses": {**_ok(200, "PoolList"), **_errors(*_AUTH)},
            }
        },
        "/v1/workers": {
            "get": {
                "operationId": "listWorkers",
                "summary": "Workers and their last heartbeat (run ids: only your own runs'), a page at a time",
                "parameters": [
                    _query("pool", {"type": "string", "pattern": NAME_PATTERN}, "only this pool's"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "default 100"),
                    _CURSOR,
                ],
                "responses": {**_ok(200, "WorkerList"), **_errors(400, *_AUTH, 422)},
            }
        },
        "/v1/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness",
                "security": [],
                "responses": _ok(200, "Health"),
            }
        },
        "/v1/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": _ok(200, _DOCUMENT),
            }
        },
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The document, built once per process (on first use, never at import). Callers must not
    change it."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "runplane", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": component_schemas(),
        },
        "security": [{"bearer": []}],
        "paths": {
            **_runs_paths(),
            **_sweep_paths(),
            **_admin_paths(),
            **_quota_paths(),
            **_usage_paths(),
            **_fleet_paths(),
        },
    }
