"""Every answer of the HTTP API agrees with its OpenAPI document.

Each operation is driven through a real front (the Lambda handler on moto's server, the Azure HTTP
function on Azurite) to its successes and its failures. Every answer's status must be one its
operation lists, and its body must match that status's schema exactly: the document's answer
objects name every field and allow no other. A path the document has, asked with a method it
lacks, must answer 405 with Allow; a path it lacks, 404. Every documented operation must be
exercised here, and every route the resolver serves must be documented, so that no route slips by.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from pydantic import BaseModel
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from runplane import bootstrap
from runplane.adapters.local.relay import FrontSessionRelay
from runplane.api.app import STATUS
from runplane.api.http import app
from runplane.api.models import WireModel
from runplane.api.openapi import openapi_document
from runplane.devstack.relay import RelayHub
from runplane.domain.common import DURATION_PATTERN, SIZE_PATTERN
from runplane.domain.sessions import secret_hash
from runplane.domain.states import RunState
from runplane.domain.units import parse_bytes, parse_duration
from runplane.domain.uploads import upload_key
from runplane.domain.wire import Record, since_fields
from runplane.domain.workers import Worker
from runplane.services import lifecycle
from runplane.services.auth import register_token
from runplane.services.logs import log_chunk_key, outputs_prefix
from runplane.settings import StackSettings
from tests.conftest import POOLS_FILE
from worker_agent.checkpoints import sync

DOC_URI = "urn:runplane:openapi"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
TOKENS = {
    "admin": "wire-admin",
    "alice": "wire-alice",
    "bob": "wire-bob",
    "reader": "wire-reader",
    "empty": "wire-eve",
    "carol": "wire-carol",
}
Send = Callable[[str, str, dict[str, str], bytes], tuple[int, dict[str, str], bytes]]


def _pointer(*parts: str) -> str:
    return "#" + "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _body_schema(template: str, method: str, *where: str) -> str:
    """Where the JSON schema of a request body (``"requestBody"``) or of an answer (``"responses",
    "200"``) of an operation is."""
    return _pointer("paths", template, method.lower(), *where, "content", "application/json", "schema")


class Contract:
    """An OpenAPI document as a judge of answers; remembers the statuses each operation gave."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.registry = Registry().with_resource(DOC_URI, DRAFT202012.create_resource(doc))
        self.templates = [
            (re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + "$"), path) for path in doc["paths"]
        ]
        self.seen: dict[str, set[int]] = defaultdict(set)

    def operations(self) -> dict[str, tuple[str, str]]:
        """operationId -> (method, path template)."""
        return {
            op["operationId"]: (method, path)
            for path, item in self.doc["paths"].items()
            for method, op in item.items()
            if method in METHODS
        }

    def validate(self, instance: Any, pointer: str, what: str) -> None:
        """Assert that ``instance`` matches the schema at ``pointer`` in the document."""
        validator = Draft202012Validator(
            {"$ref": DOC_URI + pointer},
            registry=self.registry,
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        )
        errors = [f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}" for e in validator.iter_errors(instance)]
        assert not errors, f"{what} does not match {pointer}:\n" + "\n".join(errors[:10])

    def request(self, method: str, path: str, body: Any) -> None:
        """Assert that a body the API accepted is one the document accepts."""
        template = self._template(path)
        assert template is not None, f"{method} {path} succeeded but the document has no such path"
        self.validate(body, _body_schema(template, method, "requestBody"), f"the accepted body of {method} {path}")

    def _template(self, path: str) -> str | None:
        return next((template for rx, template in self.templates if rx.match(path)), None)

    def answer(self, method: str, path: str, status: int, headers: dict[str, str], data: bytes) -> str:
        """Assert that one answer agrees with the document; return the operationId it answered
        for (or "405"/"404" for a method or a path the document lacks)."""
        what = f"{method} {path} -> {status}"
        path = path.partition("?")[0]
        template = self._template(path)
        error_schema = _pointer("components", "schemas", "Error")
        if template is None:
            assert status == 404, f"{what}: a path the document lacks must answer 404"
            self.validate(json.loads(data), error_schema, what)
            return "404"
        item = self.doc["paths"][template]
        operation = item.get(method.lower())
        if operation is None:
            allowed = ", ".join(sorted(m.upper() for m in item if m in METHODS))
            assert status == 405, f"{what}: {method} is not in the document for {template}, so it must answer 405"
            assert headers.get("allow") == allowed, f"{what}: Allow is {headers.get('allow')!r}, not {allowed!r}"
            self.validate(json.loads(data), error_schema, what)
            return "405"
        op_id, responses = operation["operationId"], operation["responses"]
        assert str(status) in responses, f"{what}: {op_id} does not list {status} (it lists {sorted(responses)})"
        response = responses[str(status)]
        for header in response.get("headers", {}):
            assert header.lower() in headers, f"{what}: the header {header} the document promises is missing"
        if "content" not in response:
            assert data == b"", f"{what}: the document says no body, the answer has {data[:200]!r}"
        else:
            assert headers.get("content-type", "").startswith("application/json"), f"{what}: {headers}"
            self.validate(json.loads(data), _body_schema(template, method, "responses", str(status)), what)
        self.seen[op_id].add(status)
        return str(op_id)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


class Wire:
    """Sends requests through one front; every answer is judged by the contract on the way back."""

    def __init__(self, send: Send, contract: Contract) -> None:
        self.send, self.contract = send, contract

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        who: str | None = "alice",
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        sent = dict(headers or {})
        if who is not None:
            sent["Authorization"] = f"Bearer {TOKENS[who]}"
        raw = data if data is not None else (json.dumps(body).encode() if body is not None else b"")
        if raw:
            sent["Content-Type"] = "application/json"
        status, got, out = self.send(method, path, sent, raw)
        got = {k.lower(): v for k, v in got.items()}
        self.contract.answer(method, path, status, got, out)
        if body is not None and 200 <= status < 300:
            self.contract.request(method, path.partition("?")[0], body)
        return Answer(status, got, json.loads(out) if out else None)


def _lambda_front() -> Send:
    from functions.aws import api
    from runplane.api.gateway import http_event, response_parts
    from runplane.devstack.lambda_shim import LambdaContext

    def send(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        path, _, query = path.partition("?")
        event = http_event(method, path, query, headers, body, "127.0.0.1")
        return response_parts(api.lambda_handler(event, LambdaContext(function_name="runplane-api")))

    return send


def _azure_front() -> Send:
    import azure.functions as func

    from functions.azure import api

    function = api.http_api.build().get_user_function()

    def send(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        route = path.partition("?")[0].removeprefix("/v1/")
        req = func.HttpRequest(method=method, url=f"http://127.0.0.1:7071{path}", headers=headers,
                               route_params={"path": route}, body=body)  # fmt: skip
        answer = function(req)
        return answer.status_code, dict(answer.headers), answer.get_body()

    return send


@pytest.fixture
def wire(request, stack, monkeypatch):
    """The process-wide stack the fronts use, on the contract suite's fresh stack (moto or
    Azurite), with the users of TOKENS; yields a Wire through that cloud's front."""
    settings = stack.settings
    send = _azure_front() if settings.cloud == "azure" else _lambda_front()
    where = {
        "azure_storage_connection_string": settings.azure_storage_connection_string,
        "aws_endpoint_url": settings.aws_endpoint_url,
        "state_dir": settings.state_dir,  # one machine: the suite's fresh directory, not the default
        "public_url": settings.public_url,
    }
    s = bootstrap.build_stack(
        StackSettings(cloud=settings.cloud, prefix=settings.prefix, pools=str(POOLS_FILE), retention=RETENTION, **where)
    )
    s.sealer = stack.sealer  # Azure's: the suite's Key Vault fake (no emulator); elsewhere the same key
    # the relay runplane dev's front hosts on every cloud: sessions open (no side dials it here)
    s.relay = FrontSessionRelay(settings.public_url or "http://127.0.0.1:8080", RelayHub(s.sessions, s.clock))
    before = bootstrap.use(s)
    register_token(s.tokens, TOKENS["admin"], "root", scopes=["admin"], now=time.time())
    register_token(s.tokens, TOKENS["alice"], "alice", now=time.time())
    register_token(s.tokens, TOKENS["bob"], "bob", now=time.time())
    register_token(s.tokens, TOKENS["reader"], "alice", scopes=["runs:read"], now=time.time())
    register_token(s.tokens, TOKENS["empty"], "eve", scopes=[], now=time.time())
    register_token(s.tokens, TOKENS["carol"], "carol", groups=["vision"], now=time.time())
    yield Wire(send, Contract(openapi_document()))
    bootstrap.use(before)


PARKED = {"command": "echo hi", "queue": "parked"}
RETENTION = '{"outputs": "30d", "runs": "180d"}'


def _runs(wire: Wire) -> str:
    """Submit, list and read runs; returns the id of a queued run of alice's."""
    submitted = wire("POST", "/v1/runs", {**PARKED, "name": "wire", "resources": {"memory": "256m", "time": "90s"}})
    assert submitted.status == 201 and submitted.headers["location"] == f"/v1/runs/{submitted.body['id']}"
    assert submitted.body["spec"]["resources"]["memory"] == 256 * 1024**2  # text in, bytes out
    key = {"Idempotency-Key": f"wire-{time.time_ns()}"}
    first = wire("POST", "/v1/runs", {**PARKED, "resources": {"disk": "1g", "time": 60}}, headers=key)
    again = wire("POST", "/v1/runs", {**PARKED, "resources": {"disk": "1g", "time": 60}}, headers=key)
    assert (first.status, again.status, again.body["id"]) == (201, 200, first.body["id"])
    assert wire("POST", "/v1/runs", {**PARKED, "command": "other"}, headers=key).status == 409
    assert wire("POST", "/v1/runs", {**PARKED, "resources": {"memory": "lots"}}).status == 422
    assert wire("POST", "/v1/runs", data=b"{not json").status == 400
    assert wire("POST", "/v1/runs", {**PARKED, "inputs": {"d": "run:r-nothing"}}).status == 404
    assert wire("POST", "/v1/runs", {"command": "x" * 300_000}).status == 413
    assert wire("POST", "/v1/runs", PARKED, who=None).status == 401
    assert wire("POST", "/v1/runs", PARKED, who="reader").status == 403

    page = wire("GET", "/v1/runs?limit=1")
    assert page.status == 200 and len(page.body["runs"]) == 1 and page.body["next_cursor"]
    rest = wire("GET", f"/v1/runs?limit=1&cursor={page.body['next_cursor']}")
    assert rest.status == 200
    assert [r["id"] for r in page.body["runs"] + rest.body["runs"]] == [first.body["id"], submitted.body["id"]]
    assert wire("GET", "/v1/runs?state=queued&queue=parked").status == 200
    assert wire("GET", "/v1/runs?limit=x").status == 400
    for text in ("5.0", "1_0", "+5", " 5"):  # the document says integer: digits alone
        refused = wire("GET", f"/v1/runs?limit={text.replace('+', '%2B').replace(' ', '%20')}")
        assert (refused.status, refused.body["error"]["message"]) == (400, "query parameter limit must be an integer")
    assert wire("GET", "/v1/runs?cursor=not-a-cursor").status == 400
    assert wire("GET", "/v1/runs?state=sleeping").status == 422
    assert wire("GET", "/v1/runs?owner=bob").status == 403
    assert wire("GET", "/v1/runs", who=None).status == 401

    run_id = submitted.body["id"]
    got = wire("GET", f"/v1/runs/{run_id}")
    assert got.status == 200 and got.body["state"] == "queued" and got.body["waiting_reason"]
    waited = wire("GET", f"/v1/runs/{run_id}?wait=0.2&since={got.body['revision']}")  # unchanged: as it is
    assert waited.status == 200 and waited.body["revision"] == got.body["revision"]
    assert wire("GET", f"/v1/runs/{run_id}?wait=21").status == 422
    assert wire("GET", f"/v1/runs/{run_id}?wait=1&since=nothing").status == 422
    assert wire("GET", f"/v1/runs/{run_id}?wait=soon").status == 400
    assert wire("GET", f"/v1/runs/{run_id}", who="bob").status == 404
    assert wire("GET", "/v1/runs/r-nothing").status == 404
    assert wire("GET", f"/v1/runs/{run_id}", who="empty").status == 403
    return run_id


def _logs_and_outputs(wire: Wire, run_id: str) -> None:
    objects = bootstrap.stack().objects
    objects.put_bytes(log_chunk_key(run_id, 0, "stdout", 0), b"hello\n")
    objects.put_bytes(outputs_prefix(run_id, 0) + "model/weights.bin", b"\0" * 10)
    logs = wire("GET", f"/v1/runs/{run_id}/logs?stream=stdout&offset=0")
    assert logs.status == 200 and logs.body == {"data": "hello\n", "next_offset": 6, "complete": False}
    assert wire("GET", f"/v1/runs/{run_id}/logs?offset=x").status == 400
    assert wire("GET", f"/v1/runs/{run_id}/logs?stream=stdin").status == 422
    assert wire("GET", f"/v1/runs/{run_id}/logs", who="bob").status == 404
    outputs = wire("GET", f"/v1/runs/{run_id}/outputs?limit=10")
    assert outputs.status == 200
    assert [(f["path"], f["size"]) for f in outputs.body["files"]] == [("model/weights.bin", 10)]
    assert wire("GET", f"/v1/runs/{run_id}/outputs?cursor=bad").status == 400
    assert wire("GET", f"/v1/runs/{run_id}/outputs?limit=0").status == 422
    assert wire("GET", "/v1/runs/r-nothing/outputs").status == 404
    assert wire("GET", f"/v1/runs/{run_id}/outputs", who=None).status == 401


def _checkpoint(wire: Wire, run_id: str, tmp_path: Path) -> None:
    assert wire("GET", f"/v1/runs/{run_id}/checkpoint").status == 404  # none yet
    (tmp_path / "checkpoint" / "opt").mkdir(parents=True)
    for name in ("a", "b", "opt/c"):
        (tmp_path / "checkpoint" / name).write_text(name)
    sync(bootstrap.stack().objects, run_id, tmp_path / "checkpoint", None, attempt=0)
    first = wire("GET", f"/v1/runs/{run_id}/checkpoint?limit=2")
    assert first.status == 200 and (first.body["seq"], first.body["file_count"], first.body["dirs"]) == (1, 3, ["opt"])
    rest = wire("GET", f"/v1/runs/{run_id}/checkpoint?cursor={first.body['next_cursor']}")
    assert rest.status == 200 and [f["path"] for f in rest.body["files"]] == ["opt/c"] and rest.body["dirs"] == []
    assert wire("GET", f"/v1/runs/{run_id}/checkpoint?cursor=bad").status == 400
    assert wire("GET", f"/v1/runs/{run_id}/checkpoint?limit=0").status == 422
    assert wire("GET", f"/v1/runs/{run_id}/checkpoint", who="bob").status == 404
    assert wire("GET", f"/v1/runs/{run_id}/checkpoint", who=None).status == 401
    assert wire("GET", f"/v1/runs/{run_id}/checkpoint", who="empty").status == 403


def _fleet(wire: Wire, run_id: str) -> None:
    now = time.time()
    workers = bootstrap.stack().workers
    workers.put(Worker(id="w-wire", pool="parked", status="busy", host="h", started_at=now, heartbeat_at=now,
                       runs=[run_id], run_owners={run_id: "alice"}, agent_version="1"))  # fmt: skip
    workers.put(Worker(id="w-gone", pool="parked", started_at=now - 9000, heartbeat_at=now - 9000))
    listed = wire("GET", "/v1/workers")
    assert listed.status == 200
    by_id = {w["id"]: w for w in listed.body["workers"]}
    assert by_id["w-wire"]["runs"] == [run_id] and by_id["w-gone"]["status"] == "offline"
    assert [w["runs"] for w in wire("GET", "/v1/workers", who="bob").body["workers"]] == [[], []]
    # a parameter given empty is one not given: the document's any-string cursor took "" and was refused
    assert wire("GET", "/v1/workers?cursor=&pool=").body == listed.body
    assert wire("GET", "/v1/workers?cursor=AA").status == 400  # well formed, but no listing gave it: as on runs
    assert wire("GET", "/v1/workers", who="empty").status == 403
    pools = wire("GET", "/v1/pools")
    assert pools.status == 200
    parked = next(p for p in pools.body["pools"] if p["name"] == "parked")
    assert parked["backlog"] >= 2 and parked["workers"]["busy"] == 1
    # the stack's retention (RETENTION) over a pool that sets none; logs: for good
    assert parked["retention"] == {"outputs": 30 * 86400, "logs": None, "runs": 180 * 86400}
    assert wire("GET", "/v1/pools", who=None).status == 401
    assert wire("GET", "/v1/pools", who="empty").status == 403


def _tokens(wire: Wire) -> None:
    me = wire("GET", "/v1/me", who="empty")
    assert me.status == 200 and me.body["user"] == "eve" and me.body["scopes"] == []
    assert wire("GET", "/v1/me", who=None).status == 401
    made = wire("POST", "/v1/tokens", {"user": "dora", "groups": ["vision"], "expires_in": "30d"}, who="admin")
    assert made.status == 201 and made.body["token"] and made.body["expires_at"]
    assert wire("POST", "/v1/tokens", {"user": "dora", "expires_in": 3600.5}, who="admin").status == 201
    assert wire("POST", "/v1/tokens", {"user": "no one"}, who="admin").status == 422
    assert wire("POST", "/v1/tokens", data=b"[]", who="admin").status == 400
    assert wire("POST", "/v1/tokens", {"user": "x" * 300_000}, who="admin").status == 413
    assert wire("POST", "/v1/tokens", {"user": "dora"}).status == 403
    listed = wire("GET", "/v1/tokens?user=dora", who="admin")
    assert listed.status == 200 and made.body["id"] in [t["id"] for t in listed.body["tokens"]]
    assert wire("GET", "/v1/tokens", who="admin").status == 200
    assert wire("GET", "/v1/tokens").status == 403
    shown = wire("PUT", "/v1/users/dora", {"default_group": "vision"}, who="admin")
    assert shown.status == 200 and shown.body["default_group"] == "vision" and shown.body["groups"] == ["vision"]
    assert wire("GET", "/v1/users/dora", who="admin").body == shown.body
    assert wire("PUT", "/v1/users/dora", {"default_group": "nlp"}, who="admin").status == 422  # not hers
    assert wire("PUT", "/v1/users/dora", {"default_group": "Vision"}, who="admin").status == 422
    assert wire("PUT", "/v1/users/dora", data=b"[]", who="admin").status == 400
    assert wire("PUT", "/v1/users/dora", {"default_group": "x" * 300_000}, who="admin").status == 413
    assert wire("PUT", "/v1/users/dora", {"default_group": None}).status == 403
    assert wire("GET", "/v1/users/nobody", who="admin").status == 404
    assert wire("GET", "/v1/users/no%20one", who="admin").status == 422
    assert wire("GET", "/v1/users/dora").status == 403
    assert wire("DELETE", f"/v1/tokens/{made.body['id']}", who="admin").status == 204
    assert wire("DELETE", f"/v1/tokens/{made.body['id']}", who="admin").status == 404
    assert wire("DELETE", "/v1/tokens/not-a-token", who="admin").status == 404
    assert wire("DELETE", "/v1/tokens/tok-0123456789abcdef", who="bob").status == 403
    last = wire("DELETE", f"/v1/tokens/{wire('GET', '/v1/me', who='admin').body['token_id']}", who="admin")
    assert (last.status, last.body["error"]["code"]) == (409, "last_admin")  # the stack's only admin token


def _quotas(wire: Wire) -> None:
    """Set, read, list and remove quotas of users and groups; a user sees only those that apply to
    them, and another's answers as one that does not exist."""
    caps = {"max_running": 2, "max_gpus": 1, "gpu_hours": 12.5, "period": "week"}
    made = wire("PUT", "/v1/quotas/users/alice", caps, who="admin")
    assert made.status == 200 and made.body["max_gpus"] == 1 and made.body["max_cpus"] is None
    assert made.body["usage"]["running"] == 0 and made.body["usage"]["period"].startswith("week:")
    assert wire("PUT", "/v1/quotas/groups/vision", {"cpu_hours": 100}, who="admin").status == 200
    assert wire("PUT", "/v1/quotas/users/dora%40example.com", {}, who="admin").body["name"] == "dora@example.com"
    assert wire("PUT", "/v1/quotas/users/alice", caps).status == 403
    assert wire("PUT", "/v1/quotas/groups/vision", caps, who="carol").status == 403
    assert wire("PUT", "/v1/quotas/users/alice", caps, who=None).status == 401
    assert wire("PUT", "/v1/quotas/users/alice", {"max_gpus": -1}, who="admin").status == 422
    assert wire("PUT", "/v1/quotas/groups/Not-A-Group", {}, who="admin").status == 422
    assert wire("PUT", "/v1/quotas/groups/vision", data=b"[]", who="admin").status == 400
    assert wire("PUT", "/v1/quotas/users/alice", {"x": "y" * 300_000}, who="admin").status == 413

    assert wire("GET", "/v1/quotas/users/alice").body["gpu_hours"] == 12.5
    assert wire("GET", "/v1/quotas/groups/vision", who="carol").body["cpu_hours"] == 100
    hidden = wire("GET", "/v1/quotas/users/alice", who="bob")
    missing = wire("GET", "/v1/quotas/users/nobody", who="admin")
    assert (hidden.status, missing.status) == (404, 404)
    assert wire("GET", "/v1/quotas/groups/vision").status == 404  # alice is not of the group
    assert wire("GET", "/v1/quotas/users/bad%20name", who="admin").status == 404
    assert wire("GET", "/v1/quotas/groups/vision", who="empty").status == 403
    assert wire("GET", "/v1/quotas/users/alice", who=None).status == 401

    every = wire("GET", "/v1/quotas", who="admin")
    assert [(q["kind"], q["name"]) for q in every.body["quotas"]] == [
        ("user", "alice"),
        ("user", "dora@example.com"),
        ("group", "vision"),
    ]
    assert [q["name"] for q in wire("GET", "/v1/quotas").body["quotas"]] == ["alice"]
    assert [q["name"] for q in wire("GET", "/v1/quotas", who="carol").body["quotas"]] == ["vision"]
    assert wire("GET", "/v1/quotas", who="bob").body == {"quotas": []}
    assert wire("GET", "/v1/quotas", who="empty").status == 403
    assert wire("GET", "/v1/quotas", who=None).status == 401

    charged = wire("POST", "/v1/runs", PARKED, who="carol")
    assert charged.status == 201 and charged.body["group"] == "vision"  # the only group of hers
    assert wire("POST", "/v1/runs", {**PARKED, "group": "vision"}).status == 422  # not alice's
    assert wire("POST", f"/v1/runs/{charged.body['id']}/kill", who="carol").status == 202

    assert wire("DELETE", "/v1/quotas/groups/vision", who="carol").status == 403
    assert wire("DELETE", "/v1/quotas/groups/vision", who="admin").status == 204
    assert wire("DELETE", "/v1/quotas/groups/vision", who="admin").status == 404
    assert wire("GET", "/v1/quotas/groups/vision", who="carol").status == 404
    assert wire("DELETE", "/v1/quotas/users/alice").status == 403
    assert wire("DELETE", "/v1/quotas/users/alice", who=None).status == 401
    assert wire("DELETE", "/v1/quotas/users/alice", who="admin").status == 204
    assert wire("DELETE", "/v1/quotas/users/-bad", who="admin").status == 404
    assert wire("POST", "/v1/quotas", {}, who="admin").status == 405


def _usage(wire: Wire) -> None:
    """Usage reports: a user's own, an admin's of anyone, and the refusals."""
    mine = wire("GET", "/v1/usage?by=pool&since=2000-01-01")
    assert mine.status == 200 and mine.body["user"] == "alice"
    assert "parked" in [row["key"] for row in mine.body["rows"]] and mine.body["total"]["runs"] >= 2
    every = wire("GET", "/v1/usage?since=946684800&until=2100-01-01T00:00:00Z&by=user", who="admin")
    assert every.status == 200 and {"alice", "carol"} <= {row["key"] for row in every.body["rows"]}
    assert wire("GET", "/v1/usage?by=group&group=vision", who="carol").status == 200
    assert wire("GET", "/v1/usage?user=bob").status == 403
    assert wire("GET", "/v1/usage?since=yesterday").status == 400
    assert wire("GET", "/v1/usage?by=colour").status == 422
    assert wire("GET", "/v1/usage?pool=nowhere").status == 422
    assert wire("GET", "/v1/usage", who="empty").status == 403
    assert wire("GET", "/v1/usage", who=None).status == 401


def _secrets(wire: Wire) -> None:
    """Secrets: set, listed, named by runs and sweeps, removed; a value in no answer; another user's
    reads as one that does not exist."""
    value = f"wire-sekrit-{time.time_ns()}"
    made = wire("PUT", "/v1/secrets/wandb", {"value": value})
    assert made.status == 200 and made.body["ref"] == "wandb" and made.body["size"] == len(value)
    group = wire("PUT", "/v1/groups/vision/secrets/hf", {"value": value}, who="admin")
    assert group.status == 200 and (group.body["ref"], group.body["scope"]) == ("vision/hf", "group")
    assert wire("PUT", "/v1/groups/vision/secrets/hf", {"value": "x"}, who="carol").status == 403
    assert wire("PUT", "/v1/groups/Vision/secrets/hf", {"value": "x"}, who="admin").status == 422
    assert wire("PUT", "/v1/secrets/Wandb", {"value": "x"}).status == 422
    assert wire("PUT", "/v1/secrets/wandb", {"value": ""}).status == 422
    assert wire("PUT", "/v1/secrets/wandb", {"value": "\u00e9" * 20_000}).status == 413
    assert wire("PUT", "/v1/secrets/wandb", data=b"[]").status == 400
    assert wire("PUT", "/v1/secrets/wandb", {"value": "x"}, who="reader").status == 403
    assert wire("PUT", "/v1/secrets/wandb", {"value": "x"}, who=None).status == 401
    lists = [wire("GET", "/v1/secrets"), wire("GET", "/v1/secrets", who="carol"), wire("GET", "/v1/secrets", who="bob")]
    assert [[s["ref"] for s in got.body["secrets"]] for got in lists] == [["wandb"], ["vision/hf"], []]
    assert wire("GET", "/v1/groups/vision/secrets", who="admin").body["secrets"] == lists[1].body["secrets"]
    assert wire("GET", "/v1/groups/vision/secrets", who="carol").status == 403
    assert wire("GET", "/v1/groups/Vision/secrets", who="admin").status == 404
    assert wire("GET", "/v1/secrets", who="empty").status == 403
    used = wire("POST", "/v1/runs", {**PARKED, "secrets": {"WANDB_API_KEY": "wandb"}, "image_pull_secret": "wandb"})
    assert used.status == 201 and used.body["spec"]["secrets"] == {"WANDB_API_KEY": "wandb"}
    theirs = wire("POST", "/v1/runs", {**PARKED, "secrets": {"WANDB_API_KEY": "wandb"}}, who="bob")
    assert (theirs.status, theirs.body["error"]["message"]) == (404, "secret wandb does not exist")
    sweep = wire("POST", "/v1/sweeps", {"run": {**PARKED, "secrets": {"HF": "vision/hf"}}, "count": 1})
    assert sweep.status == 404  # alice is not of the group
    assert value not in json.dumps([made.body, group.body, used.body, *(got.body for got in lists)])
    assert wire("DELETE", "/v1/secrets/wandb", who="bob").status == 404
    assert wire("DELETE", "/v1/secrets/wandb").status == 204
    assert wire("DELETE", "/v1/secrets/wandb").status == 404
    assert wire("DELETE", "/v1/secrets/Wandb").status == 404
    assert wire("DELETE", "/v1/secrets/wandb", who="reader").status == 403
    assert wire("DELETE", "/v1/groups/vision/secrets/hf", who="carol").status == 403
    assert wire("DELETE", "/v1/groups/vision/secrets/hf", who="admin").status == 204
    assert wire("DELETE", "/v1/groups/vision/secrets/hf", who="admin").status == 404
    assert wire("GET", "/v1/secrets/wandb").status == 405


def _priority(wire: Wire, run_id: str) -> None:
    """Priorities at submit and on a queued run: a user up to the pool's max_user_priority (50 on
    parked), an admin any; another user's run answers as one that does not exist."""
    path = f"/v1/runs/{run_id}/priority"
    lowered = wire("POST", path, {"priority": 20})
    assert lowered.status == 200 and (lowered.body["priority"], lowered.body["spec"]["priority"]) == (20, 20)
    assert wire("POST", path, {"priority": 51}).status == 403
    assert wire("POST", path, {"priority": 90}, who="admin").body["priority"] == 90
    assert wire("POST", path, {"priority": 30}, who="bob").status == 404
    assert wire("POST", "/v1/runs/r-nothing/priority", {"priority": 30}).status == 404
    assert wire("POST", path, {"priority": 30}, who="reader").status == 403
    assert wire("POST", path, {"priority": 30}, who=None).status == 401
    assert wire("POST", path, {"priority": 101}).status == 422
    assert wire("POST", path, {"priority": "high"}).status == 422
    assert wire("POST", path, data=b"[]").status == 400
    assert wire("POST", path, {"priority": 1, "x": "y" * 300_000}).status == 413
    assert wire("GET", path).status == 405
    assert wire("POST", "/v1/runs", {**PARKED, "priority": 51}).status == 403
    urgent = wire("POST", "/v1/runs", {**PARKED, "priority": 95}, who="admin")
    assert urgent.status == 201 and urgent.body["priority"] == 95
    assert wire("POST", f"/v1/runs/{urgent.body['id']}/kill", who="admin").status == 202
    assert wire("POST", f"/v1/runs/{urgent.body['id']}/priority", {"priority": 1}, who="admin").status == 409


def _uploads(wire: Wire) -> None:
    data = b"an archive's bytes"
    sha, md5 = hashlib.sha256(data).hexdigest(), base64.b64encode(hashlib.md5(data).digest()).decode()
    body = {"sha256": sha, "size": len(data), "md5": md5}
    offered = wire("POST", "/v1/uploads", body)
    assert offered.status == 200 and offered.body["source"] == f"upload:{sha}" and not offered.body["present"]
    assert offered.body["url"] and offered.body["headers"] and offered.body["expires_at"] > time.time()
    assert wire("POST", "/v1/uploads", {**body, "size": 2**40}).status == 413
    assert wire("POST", "/v1/uploads", {**body, "sha256": sha.upper()}).status == 422
    assert wire("POST", "/v1/uploads", {**body, "md5": "not base64"}).status == 422
    assert wire("POST", "/v1/uploads", {**body, "extra": 1}).status == 422
    assert wire("POST", "/v1/uploads", body, who="reader").status == 403
    assert wire("POST", "/v1/uploads", body, who=None).status == 401
    named = {**PARKED, "inputs": {"code": f"upload:{sha}"}, "workdir": "/inputs/code"}
    assert wire("POST", "/v1/runs", named).status == 404  # offered, never sent
    bootstrap.stack().objects.put_bytes(upload_key("alice", sha), data)
    again = wire("POST", "/v1/uploads", body)
    assert again.status == 200 and again.body["present"] and again.body["url"] is None
    used = wire("POST", "/v1/runs", named)
    assert used.status == 201 and used.body["spec"]["workdir"] == "/inputs/code"
    assert wire("POST", "/v1/runs", named, who="bob").status == 404  # alice's upload is not bob's
    assert wire("POST", "/v1/sweeps", {"run": named, "count": 2}).status == 201
    assert wire("POST", "/v1/runs", {**named, "workdir": "/a/../b"}).status == 422


def _sweeps(wire: Wire) -> None:
    """Sweeps: made (and replayed by key), read, listed, their members listed, max_parallel
    changed, killed, retried; another user's sweep answers as one that does not exist."""
    body = {"run": PARKED, "parameters": {"LR": [0.1, "x"], "ON": [True]}, "count": 2, "max_parallel": 1}
    made = wire("POST", "/v1/sweeps", body, headers={"Idempotency-Key": "sweep-1"})
    assert made.status == 201 and made.body["size"] == 4 and made.body["waiting"] == 3
    assert made.body["counts"] == {"queued": 4} and made.body["spec"]["run"]["queue"] == "parked"
    again = wire("POST", "/v1/sweeps", body, headers={"Idempotency-Key": "sweep-1"})
    assert again.status == 200 and again.body["id"] == made.body["id"]
    assert wire("POST", "/v1/sweeps", {**body, "count": 3}, headers={"Idempotency-Key": "sweep-1"}).status == 409
    path = f"/v1/sweeps/{made.body['id']}"
    assert wire("GET", path).body["id"] == made.body["id"]
    assert wire("GET", f"{path}?wait=0.2&since={made.body['revision']}").body["revision"] == made.body["revision"]
    assert wire("GET", f"{path}?wait=-1").status == 422
    assert wire("GET", f"{path}?wait=x").status == 400
    assert wire("GET", path, who="bob").status == 404
    assert wire("GET", path, who=None).status == 401
    assert wire("GET", "/v1/sweeps/s-nothing").status == 404
    listed = wire("GET", "/v1/sweeps?limit=1")
    assert [s["id"] for s in listed.body["sweeps"]] == [made.body["id"]]
    assert wire("GET", "/v1/sweeps?owner=alice", who="bob").status == 403
    members = wire("GET", f"/v1/runs?sweep={made.body['id']}")
    assert [(r["sweep_id"], r["sweep_index"]) for r in members.body["runs"]] == [(made.body["id"], 0)]
    assert members.body["runs"][0]["spec"]["env"] == {"LR": "0.1", "ON": "true"}
    assert wire("GET", f"/v1/runs?sweep={made.body['id']}", who="bob").status == 404
    assert wire("GET", f"/v1/runs?sweep={made.body['id']}&cursor=x").status == 400
    # with owner or queue: the members of theirs, all of them or none (a sweep's share one of each)
    member = [(made.body["id"], 0)]
    for also, found in (("queue=parked", member), ("queue=default", []), ("owner=alice", member)):
        page = wire("GET", f"/v1/runs?sweep={made.body['id']}&{also}").body
        assert [(r["sweep_id"], r["sweep_index"]) for r in page["runs"]] == found, also
    assert wire("GET", f"/v1/runs?sweep={made.body['id']}&owner=bob").status == 403  # as without a sweep
    assert wire("GET", f"/v1/runs?sweep={made.body['id']}&owner=alice&queue=nowhere").body["runs"] == []
    wider = wire("PATCH", path, {"max_parallel": 2})
    assert wider.status == 200 and (wider.body["max_parallel"], wider.body["waiting"]) == (2, 2)
    assert wire("PATCH", path, {"max_parallel": 0}).status == 422
    assert wire("PATCH", path, {"max_parallel": 2}, who="bob").status == 404
    assert wire("PATCH", path, {"max_parallel": 2}, who="reader").status == 403
    assert wire("POST", "/v1/sweeps", {"run": PARKED, "count": 10_001}).status == 422
    # a grid and a count each within bounds, together over them: a refusal the document cannot
    # express, so not one of the request's shape
    huge = wire("POST", "/v1/sweeps", {"run": PARKED, "parameters": {"A": list(range(5001))}, "count": 2})
    assert (huge.status, huge.body["error"]["code"]) == (422, "not_allowed"), huge.body
    assert huge.body["error"]["message"] == "the sweep has 10002 members; at most 10000"
    assert wire("POST", "/v1/sweeps", {"run": PARKED}, who="reader").status == 403
    assert wire("POST", f"{path}/kill", who="bob").status == 404
    killed = wire("POST", f"{path}/kill")
    assert killed.status == 202 and killed.body["killed"] and killed.body["counts"] == {"killed": 4}
    assert wire("POST", f"{path}/kill").status == 409
    retried = wire("POST", f"{path}/retry")
    assert retried.status == 200 and retried.body["retried"] == 4 and retried.body["waiting"] == 2
    assert wire("POST", f"{path}/retry", who="bob").status == 404
    assert wire("POST", f"{path}/kill").status == 202
    assert wire("DELETE", path).status == 405


def _keep(wire: Wire, run_id: str) -> None:
    """An owner keeps a run and lets it go; a run that has not ended shows a retention only while kept.
    Another user's run answers as one that does not exist."""
    path = f"/v1/runs/{run_id}/keep"
    kept = wire("POST", path, {})  # keep defaults to true
    assert kept.status == 200 and kept.body["retention"] == {
        "kept": True, "outputs_until": None, "logs_until": None, "record_until": None, "deleted": [],
    }  # fmt: skip
    assert wire("POST", path, {"keep": False}, who="bob").status == 404
    assert wire("POST", path, {"keep": False}, who="reader").status == 403
    assert wire("POST", path, {"keep": False}, who=None).status == 401
    assert wire("POST", path, {"keep": "no"}).status == 422
    assert wire("POST", path, {"keep": False, "until": "never"}).status == 422
    assert wire("POST", path, data=b"{").status == 400
    assert wire("POST", path, {"x": "y" * 300_000}).status == 413
    assert wire("POST", "/v1/runs/r-nothing/keep", {}).status == 404
    assert wire("POST", "/v1/runs/not%20a%20run/keep", {}).status == 404
    assert wire("GET", f"/v1/runs/{run_id}").body["retention"]["kept"] is True
    let_go = wire("POST", path, {"keep": False})
    assert let_go.status == 200 and "retention" not in let_go.body  # queued and not kept: no dates yet


def _sessions(wire: Wire) -> None:
    """Sessions: opened into a running run only, listed without a ticket, a ticket renewed, closed;
    another user's run (an admin's asking too, without allow_admin_exec) answers as one that does
    not exist."""
    run_id = wire("POST", "/v1/runs", PARKED).body["id"]
    path = f"/v1/runs/{run_id}/sessions"
    ask = {"kind": "exec", "command": ["sh", "-c", "echo hi; exit 3"], "stdin": True}
    queued = wire("POST", path, ask)
    assert (queued.status, queued.body["error"]["message"]) == (409, f"run {run_id} is not running (queued)")
    store = bootstrap.stack().store
    run = store.get(run_id)
    held = lifecycle.claim(store, run, run.attempt, "w-wire", 60.0, time.time())
    lifecycle.advance(store, held, RunState.RUNNING, time.time(), "started")
    for who in ("bob", "admin"):
        assert wire("POST", path, ask, who=who).status == 404
        assert wire("GET", path, who=who).status == 404
    assert wire("POST", path, ask, who="reader").status == 403
    assert wire("POST", path, ask, who=None).status == 401
    assert wire("POST", path, {"kind": "exec"}).status == 422
    assert wire("POST", path, {"kind": "port_forward", "port": 70000}).status == 422
    assert wire("POST", path, data=b"[1]").status == 400
    assert wire("POST", path, {"kind": "exec", "command": ["x" * 40_000] * 2}).status == 413  # over 64 KiB in all
    assert wire("POST", "/v1/runs/r-nothing/sessions", ask).status == 404
    assert wire("POST", f"{path}/{run_id}.0.0123abcd/ticket").status == 404  # no such session
    assert wire("DELETE", f"{path}/{run_id}.0.0123abcd").status == 404
    opened = wire("POST", path, ask)
    assert opened.status == 201 and opened.body["state"] == "requested" and opened.body["command"] == ask["command"]
    sid, ticket = opened.body["id"], opened.body["ticket"]
    assert ticket.startswith(f"{sid}.") and opened.body["relay"]["headers"] == {"Authorization": f"Bearer {ticket}"}
    shown = wire("GET", path)
    assert shown.status == 200 and [s["id"] for s in shown.body["sessions"]] == [sid]
    assert "ticket" not in shown.body["sessions"][0] and "relay" not in shown.body["sessions"][0]
    renewed = wire("POST", f"{path}/{sid}/ticket")
    assert renewed.status == 200 and renewed.body["ticket"] not in (ticket, None)
    stored = bootstrap.stack().ports.sessions.get(sid)  # only the new ticket's hash
    assert stored.client_secret_hash == secret_hash(renewed.body["ticket"].rsplit(".", 1)[1])
    for who in ("bob", "admin"):
        assert wire("POST", f"{path}/{sid}/ticket", who=who).status == 404
        assert wire("DELETE", f"{path}/{sid}", who=who).status == 404
    assert wire("POST", f"{path}/not-a-session/ticket").status == 404
    closed = wire("DELETE", f"{path}/{sid}")
    assert closed.status == 200 and (closed.body["state"], closed.body["end_reason"]) == ("ended", "closed")
    assert wire("DELETE", f"{path}/{sid}").body == closed.body  # over: as it is
    assert wire("POST", f"{path}/{sid}/ticket").status == 409


def test_every_answer_agrees_with_the_document(wire, tmp_path):
    assert wire("GET", "/v1/health", who=None).status == 200
    document = wire("GET", "/v1/openapi.json", who=None)
    assert document.status == 200 and document.body == json.loads(json.dumps(openapi_document()))
    run_id = _runs(wire)
    _logs_and_outputs(wire, run_id)
    _checkpoint(wire, run_id, tmp_path)
    _fleet(wire, run_id)
    _tokens(wire)
    _quotas(wire)
    _usage(wire)
    _secrets(wire)
    _uploads(wire)
    _priority(wire, run_id)
    _keep(wire, run_id)
    _sweeps(wire)
    _sessions(wire)

    killed = wire("POST", f"/v1/runs/{run_id}/kill")
    assert killed.status == 202 and killed.body["state"] == "killed" and killed.body["failure"]["reason"] == "killed"
    dates = killed.body["retention"]  # ended: the stack's retention dates it
    assert not dates["kept"] and dates["outputs_until"] < dates["record_until"] == dates["logs_until"]
    assert wire("POST", f"/v1/runs/{run_id}/kill").status == 409
    assert wire("POST", f"/v1/runs/{run_id}/kill", who="bob").status == 404
    assert wire("POST", f"/v1/runs/{run_id}/kill", who="reader").status == 403
    ended = wire("GET", f"/v1/runs/{run_id}/logs?offset=6")
    assert ended.body == {"data": "", "next_offset": 6, "complete": True}
    assert wire("GET", f"/v1/runs/{run_id}").body["waiting_reason"] is None

    assert wire("DELETE", "/v1/runs").status == 405
    assert wire("PUT", "/v1/health", who=None).status == 405
    assert wire("POST", f"/v1/runs/{run_id}").status == 405
    assert wire("GET", "/v1/nothing").status == 404

    unexercised = set(wire.contract.operations()) - set(wire.contract.seen)
    assert not unexercised, f"operations of the document this test never drove: {sorted(unexercised)}"


# ------------------------------------------------------------------------------------------------
# The document itself, and the judge: no service needed.


def test_every_route_the_resolver_serves_is_documented_and_nothing_else():
    routes = [*app._static_routes, *app._dynamic_routes]
    routes = [route for route in routes if not route.path.startswith("/ui")]  # the dashboard's files
    served = {(route.method.lower(), re.sub(r"<(\w+)>", r"{\1}", route.path)) for route in routes}
    documented = {(method, path) for method, path in Contract(openapi_document()).operations().values()}
    assert len(served) >= 14  # the resolver's routes were found
    assert served - documented == set(), "routes the document does not describe"
    assert documented - served == set(), "operations no route serves"


def _schemas(node: Any, where: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema object under ``node`` (an OpenAPI document or a schema), with where it is."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if "type" in node or "$ref" in node or "anyOf" in node or "enum" in node or "const" in node:
            found.append((where, node))
        for key, value in node.items():
            if key not in ("examples", "example", "default", "const", "enum"):
                found += _schemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _schemas(value, f"{where}/{i}")
    return found


def _records(model: type[BaseModel]) -> list[type[BaseModel]]:
    return [model, *(m for sub in model.__subclasses__() for m in _records(sub))]


def test_the_document_is_openapi_3_1_with_exact_answers_and_true_examples():
    doc = openapi_document()
    assert doc["openapi"] == "3.1.0"
    validate_openapi(copy.deepcopy(doc))
    contract = Contract(doc)
    components = doc["components"]["schemas"]
    for name, schema in components.items():
        assert re.fullmatch(r"[A-Z][A-Za-z]*", name), name
        Draft202012Validator.check_schema(schema)
        assert schema != {"type": "object"} and ("properties" in schema or "enum" in schema), f"{name} says nothing"
        for i, example in enumerate(schema.get("examples", [])):
            contract.validate(example, _pointer("components", "schemas", name), f"{name}'s example {i}")
    # every object in an answer is closed and complete: the server sends exactly its model's fields,
    # but one added since the previous release (Since), which it leaves out while at its default
    since = {name for base in (Record, WireModel) for model in _records(base) for name in since_fields(model)}
    answers = [(f"/paths{w}", s) for w, s in _schemas(doc["paths"]) if "/responses/" in w]
    refs = {s["$ref"].rsplit("/", 1)[1] for _, s in answers + _schemas(components) if "$ref" in s}
    requests = {"RunSpec", "Resources", "RetryRule", "CheckpointRule", "TokenCreate"}
    reached = [(f"#/components/schemas/{n}", components[n]) for n in refs - requests]
    for where, schema in answers + [(w + sub, s) for w, top in reached for sub, s in _schemas(top)]:
        if "properties" in schema:
            assert schema.get("additionalProperties") is False, f"{where} lets an answer carry other fields"
            optional = set(schema["properties"]) - set(schema.get("required", []))
            assert optional <= since, f"{where} has optional fields"
    assert {n for n in refs if n.endswith("View")} >= {"RunView", "RunSpecView", "ResourcesView", "RetryRuleView"}
    # request examples are bodies the document accepts
    for path, item in doc["paths"].items():
        for method, op in item.items():
            content = op.get("requestBody", {}).get("content", {}).get("application/json")
            if content is None:
                continue
            assert content["examples"], f"{method} {path} has no example"
            for name, example in content["examples"].items():
                pointer = _body_schema(path, method, "requestBody")
                contract.validate(example["value"], pointer, f"{method} {path} example {name}")


def test_every_operation_is_generated_whole_from_its_route():
    """Each operation carries what its route reads: its path parameters with their patterns (as the
    route checks them), its query parameters, its body, and error statuses from the error map only;
    a status a valid request may still get (x-valid-refusals) is one of its documented answers."""
    statuses = set(STATUS.values())
    for path, item in openapi_document()["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            named = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert named == set(re.findall(r"\{(\w+)\}", path)), where
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert param["required"] and param["schema"]["pattern"].startswith("^"), where
            errors = {int(s) for s in op["responses"] if int(s) >= 400}
            assert errors <= statuses, f"{where} lists statuses the error map never gives: {errors - statuses}"
            if op.get("security") != []:
                assert {401, 503} <= errors, f"{where} reads a token but does not document its refusals"
            refusals = op.get("x-valid-refusals", [])
            assert {r["status"] for r in refusals} <= errors, f"{where}: x-valid-refusals {refusals} not all documented"
            codes = {r["code"] for r in refusals if r["status"] == 422}
            assert "invalid_request" not in codes or op.get("requestBody") is None, f"{where}: a shape refusal is valid"
            for refusal in refusals:
                description = op["responses"][str(refusal["status"])]["description"]
                assert "also for a request this document calls valid" in description, where
                assert f"({refusal['code']})" in description, where
    listed = openapi_document()["paths"]["/v1/runs"]["get"]
    assert {p["name"] for p in listed["parameters"]} >= {"state", "queue", "owner", "sweep", "limit", "cursor"}
    assert next(p for p in listed["parameters"] if p["name"] == "limit")["schema"] == {
        "type": "integer", "minimum": 1, "maximum": 500, "default": 50,
    }  # fmt: skip
    assert listed["x-valid-refusals"] == [{"status": 400, "code": "bad_request"}, {"status": 404, "code": "not_found"}]
    # a query of free text cannot be refused; a name a PUT cannot take is refused, not a missing quota
    assert not {"400", "422"} & set(openapi_document()["paths"]["/v1/tokens"]["get"]["responses"])
    quota = openapi_document()["paths"]["/v1/quotas/users/{user}"]
    assert "refused (422)" in quota["put"]["parameters"][0]["description"]
    assert "does not exist" in quota["get"]["parameters"][0]["description"]
    submit = openapi_document()["paths"]["/v1/runs"]["post"]
    assert {(r["status"], r["code"]) for r in submit["x-valid-refusals"] if r["status"] == 422} == {
        (422, "not_allowed"), (422, "unknown_name"), (422, "unschedulable"),
    }  # fmt: skip


def test_the_judge_refuses_an_undocumented_status_or_field():
    doc = copy.deepcopy(openapi_document())
    ok = json.dumps({"status": "ok"}).encode()
    headers = {"content-type": "application/json"}
    assert Contract(doc).answer("GET", "/v1/health", 200, headers, ok) == "health"
    with pytest.raises(AssertionError, match="health does not list 500"):
        Contract(doc).answer("GET", "/v1/health", 500, headers, ok)
    with pytest.raises(AssertionError, match="Additional properties"):
        Contract(doc).answer("GET", "/v1/health", 200, headers, json.dumps({"status": "ok", "up": 1}).encode())
    with pytest.raises(AssertionError, match="must answer 405"):
        Contract(doc).answer("DELETE", "/v1/health", 404, headers, b'{"error": {"code": "x", "message": "y"}}')
    del doc["paths"]["/v1/runs/{run_id}"]["get"]["responses"]["404"]
    listed = r"\['200', '400', '401', '403', '422', '503'\]"
    with pytest.raises(AssertionError, match=rf"getRun does not list 404 \(it lists {listed}\)"):
        Contract(doc).answer("GET", "/v1/runs/r-1", 404, headers, b'{"error": {"code": "not_found", "message": "m"}}')


@pytest.mark.parametrize(
    ("pattern", "parse", "texts"),
    [
        (SIZE_PATTERN, parse_bytes, ["512m", "4g", "1.5GiB", " 2 g ", "10", "1kb", "1KiB", "3mB", "g", "1.g",
                                     "1.5.5g", "-1m", "1x", "1 m b", "", "1e3", "1 kk"]),
        (DURATION_PATTERN, parse_duration, ["90s", "1h30m", "2d", "1.5h", "10", " 1h 30m ", "1ms", "1H", "1m1m",
                                            "3600.5", "1 m s", "1h30", "h", "", "1.5.5h", "-1s", "1e3", "1h,2m"]),
    ],
)  # fmt: skip
def test_the_request_schema_reads_sizes_and_durations_as_the_api_does(pattern, parse, texts):
    def parses(text: str) -> bool:
        try:
            parse(text)
        except ValueError:
            return False
        return True

    assert [t for t in texts if bool(re.search(pattern, t)) != parses(t)] == []
    assert any(parses(t) for t in texts) and not all(parses(t) for t in texts)
