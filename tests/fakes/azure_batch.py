"""An in-process, stateful fake of the Azure Batch task REST endpoints, plugged into azure-core as
its transport (no socket is opened: a request for any other host fails as unreachable).

No Batch emulator exists, so the backend is tested against this. It follows the data-plane
REST API as documented for api-version 2024-07-01.20.0:

- routes: ``POST /jobs/{job}/tasks`` (201, empty body, ETag/Last-Modified/Location/DataServiceId),
  ``POST /jobs/{job}/addtaskcollection`` (200, ``{"value": [TaskAddResult]}``, per-task
  ``clienterror`` results; more than 100 tasks or a body of 1 MB or more is 413
  ``RequestBodyTooLarge``), ``GET /jobs/{job}/tasks`` (``$filter`` on ``prop eq|ne 'value'``
  joined by ``and``, ``$select``, ``maxresults``; pages linked by an absolute ``odata.nextLink``
  carrying ``$skiptoken``), ``GET /jobs/{job}/tasks/{task}`` (404 ``TaskNotFound``), ``POST
  /jobs/{job}/tasks/{task}/terminate`` (204; 409 ``TaskCompleted`` once completed);
- ``api-version`` is required and must be the one served (400 otherwise);
- every request is authenticated like the service does it: a Shared Key signature recomputed
  here from the request as received (its own implementation of the documented canonical form,
  independent of the client's) with an ``ocp-date`` no more than 15 minutes off, or a bearer
  token from ``tokens``; failures are 403 ``AuthenticationFailed`` with the string the server
  signed in ``AuthenticationErrorDetail``;
- errors are ``{"odata.metadata", "code", "message": {"lang", "value"}, "values"?}`` with the
  message ending in ``RequestId:`` and ``Time:`` lines, as the service writes them;
- task ids are unique without regard to case; unknown properties of a task are refused.

What it does not do: run anything. Tests move tasks along with ``start`` and ``complete``.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from tests.fakes.http_response import InProcessTransport

API_VERSION = "2024-07-01.20.0"
TEST_KEY = base64.b64encode(bytes(range(32))).decode()
MAX_TASKS_PER_COLLECTION = 100
MAX_BODY_BYTES = 1_000_000
TASK_PROPERTIES = {
    "id",
    "displayName",
    "exitConditions",
    "commandLine",
    "containerSettings",
    "resourceFiles",
    "outputFiles",
    "environmentSettings",
    "affinityInfo",
    "constraints",
    "requiredSlots",
    "userIdentity",
    "multiInstanceSettings",
    "dependsOn",
    "applicationPackageReferences",
    "authenticationTokenSettings",
}
CONTAINER_PROPERTIES = {
    "imageName",
    "containerRunOptions",
    "registry",
    "workingDirectory",
    "containerHostBatchBindMounts",
}
CONSTRAINT_PROPERTIES = {"maxWallClockTime", "retentionTime", "maxTaskRetryCount"}
ISO_DURATION = re.compile(r"^P(?!$)(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$")
TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ERROR_ENTITY = "Microsoft.Azure.Batch.Protocol.Entities.Container.errors/@Element"
AUTH_FAILED = (
    "Server failed to authenticate the request. Make sure the value of Authorization header is formed correctly "
    "including the signature."
)
HEADER_ORDER = (
    "Content-Encoding",
    "Content-Language",
    "Content-Length",
    "Content-MD5",
    "Content-Type",
    "Date",
    "If-Modified-Since",
    "If-Match",
    "If-None-Match",
    "If-Unmodified-Since",
    "Range",
)


@dataclass
class Recorded:
    """A request as the service received it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: Any


@dataclass
class Fault:
    method: str
    path: str
    status: int
    code: str
    message: str
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None


class BatchError(Exception):
    def __init__(self, status: int, code: str, message: str, values: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.values = status, code, message, values or {}


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"


def expected_signature(key: bytes, account: str, method: str, url: str, headers: dict[str, str]) -> tuple[str, str]:
    """The server's side of Shared Key: the string it signs for a request, and the signature."""
    by_name = {k.lower(): v for k, v in headers.items()}
    fixed = [by_name.get(name.lower(), "") for name in HEADER_ORDER]
    ocp = sorted((k, v.strip()) for k, v in by_name.items() if k.startswith("ocp-"))
    split = urlsplit(url)
    resource = "/" + account + split.path
    grouped: dict[str, list[str]] = {}
    for pair in split.query.split("&") if split.query else []:
        name, _, value = pair.partition("=")
        grouped.setdefault(unquote(name).lower(), []).append(unquote(value.replace("+", " ")))
    canonical = "\n".join([method, *fixed]) + "\n"
    canonical += "".join(f"{k}:{v}\n" for k, v in ocp)
    canonical += resource + "".join(f"\n{k}:{','.join(sorted(vs))}" for k, vs in sorted(grouped.items()))
    digest = hmac.new(key, canonical.encode(), hashlib.sha256).digest()
    return canonical, base64.b64encode(digest).decode()


class FakeBatchService:
    """The Batch account: jobs holding tasks, and every request it received in ``requests``."""

    def __init__(
        self,
        account: str = "runplanetest",
        region: str = "westeurope",
        key: str = TEST_KEY,
        tokens: tuple[str, ...] = (),
        page_size: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.account = account
        self.endpoint = f"https://{account}.{region}.batch.azure.com"
        self.key = base64.b64decode(key)
        self.tokens = set(tokens)
        self.page_size = page_size
        self.clock = clock
        self.jobs: dict[str, dict[str, dict[str, Any]]] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []

    # --- what tests do to the service -------------------------------------------------------

    def add_job(self, job_id: str) -> None:
        self.jobs.setdefault(job_id, {})

    def task(self, job_id: str, task_id: str) -> dict[str, Any]:
        return self.jobs[job_id][task_id.lower()]

    def start(self, job_id: str, task_id: str, node: str = "tvmps_0") -> None:
        task = self.task(job_id, task_id)
        now = _iso(self.clock())
        task.update(state="running", previousState=task["state"], stateTransitionTime=now)
        task["executionInfo"].update(startTime=now)
        task["nodeInfo"] = {"nodeId": node, "poolId": "runplane-gpu", "taskRootDirectory": f"workitems/{job_id}"}

    def complete(
        self, job_id: str, task_id: str, exit_code: int | None = 0, failure: dict[str, str] | None = None
    ) -> None:
        task = self.task(job_id, task_id)
        info = task["executionInfo"]
        if exit_code is not None:
            info["exitCode"] = exit_code
        if failure is None and exit_code not in (0, None):
            failure = {
                "category": "usererror",
                "code": "FailureExitCode",
                "message": "The task exited with an exit code representing a failure",
            }
        info.update(endTime=_iso(self.clock()), result="failure" if failure else "success")
        if failure:
            info["failureInfo"] = failure
        task.update(state="completed", previousState=task["state"], stateTransitionTime=_iso(self.clock()))

    def fail_next(self, method: str, path: str, status: int, code: str, message: str = "", **kwargs: Any) -> None:
        """Answer the next ``times`` requests to ``method path`` with this error instead."""
        self.faults.append(Fault(method, path, status, code, message or f"{code}.", **kwargs))

    def requests_to(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path == path]

    # --- the wire ---------------------------------------------------------------------------

    def handle(
        self, method: str, url: str, headers: dict[str, str], content: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        split = urlsplit(url)
        query = {unquote(k): v for k, v in parse_qsl(split.query, keep_blank_values=True)}
        body: Any = None
        request_id = str(uuid.uuid4())
        try:
            if content:
                try:
                    body = json.loads(content)
                except ValueError as e:
                    raise BatchError(
                        400, "InvalidRequestBody", "The specified Request Body is not syntactically valid."
                    ) from e
            self.requests.append(Recorded(method, split.path, query, {k.lower(): v for k, v in headers.items()}, body))
            self._check_version(query)
            self._authenticate(method, url, headers)
            content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
            if method == "POST" and not content_type.startswith("application/json"):
                raise BatchError(
                    400,
                    "InvalidHeaderValue",
                    "The value for one of the HTTP headers is not in the correct format.",
                    {"HeaderName": "Content-Type"},
                )
            for fault in self.faults:
                if fault.method == method and fault.path == split.path and fault.times > 0:
                    fault.times -= 1
                    if fault.raw is not None:
                        return fault.status, {"request-id": request_id, **fault.headers}, fault.raw
                    error = self._error(fault.status, fault.code, fault.message, {}, request_id)
                    return error[0], {**error[1], **fault.headers}, error[2]
            if len(content) >= MAX_BODY_BYTES:
                raise BatchError(
                    413,
                    "RequestBodyTooLarge",
                    "The request body is too large and exceeds the maximum permissible limit.",
                )
            status, answer, extra = self._route(method, split.path, query, body)
        except BatchError as e:
            return self._error(e.status, e.code, e.message, e.values, request_id)
        out = {"request-id": request_id, "DataServiceVersion": "3.0", **extra}
        if answer is None:
            return status, out, b""
        data = json.dumps(answer).encode()
        return status, {**out, "Content-Type": "application/json;odata=minimalmetadata"}, data

    def _error(
        self, status: int, code: str, message: str, values: dict[str, str], request_id: str
    ) -> tuple[int, dict[str, str], bytes]:
        body: dict[str, Any] = {
            "odata.metadata": f"{self.endpoint}/$metadata#{ERROR_ENTITY}",
            "code": code,
            "message": {"lang": "en-US", "value": f"{message}\nRequestId:{request_id}\nTime:{_iso(self.clock())}"},
        }
        if values:
            body["values"] = [{"key": k, "value": v} for k, v in values.items()]
        headers = {"request-id": request_id, "Content-Type": "application/json;odata=minimalmetadata"}
        return status, headers, json.dumps(body).encode()

    def _check_version(self, query: dict[str, str]) -> None:
        if "api-version" not in query:
            raise BatchError(
                400,
                "MissingRequiredQueryParameter",
                "A query parameter that's mandatory for this request is not specified.",
                {"QueryParameterName": "api-version"},
            )
        if query["api-version"] != API_VERSION:
            raise BatchError(
                400,
                "InvalidQueryParameterValue",
                "Value for one of the query parameters specified in the request URI is invalid.",
                {"QueryParameterName": "api-version", "QueryParameterValue": query["api-version"]},
            )

    def _authenticate(self, method: str, url: str, headers: dict[str, str]) -> None:
        by_name = {k.lower(): v for k, v in headers.items()}
        auth = by_name.get("authorization", "")
        failed = AUTH_FAILED
        if auth.startswith("Bearer ") and auth[len("Bearer ") :] in self.tokens:
            return
        if not auth.startswith("SharedKey "):
            raise BatchError(
                403,
                "AuthenticationFailed",
                failed,
                {"AuthenticationErrorDetail": "No valid credential in the Authorization header."},
            )
        account, _, signature = auth[len("SharedKey ") :].partition(":")
        if account != self.account:
            raise BatchError(
                403,
                "AuthenticationFailed",
                failed,
                {"AuthenticationErrorDetail": f"The account {account!r} is not this account."},
            )
        date = by_name.get("ocp-date") or by_name.get("date")
        sent = email.utils.parsedate_to_datetime(date).timestamp() if date else None
        if sent is None or abs(self.clock() - sent) > 15 * 60:
            raise BatchError(
                403,
                "AuthenticationFailed",
                failed,
                {"AuthenticationErrorDetail": "Request date header too old or missing."},
            )
        canonical, expected = expected_signature(self.key, self.account, method, url, headers)
        if not hmac.compare_digest(signature, expected):
            raise BatchError(
                403,
                "AuthenticationFailed",
                failed,
                {
                    "AuthenticationErrorDetail": f"The MAC signature found in the HTTP request '{signature}' is not "
                    f"the same as any computed signature. Server used following string to sign: '{canonical}'."
                },
            )

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any, dict[str, str]]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if len(parts) >= 3 and parts[0] == "jobs" and parts[2] in ("tasks", "addtaskcollection"):
            tasks = self.jobs.get(parts[1])
            if tasks is None:
                raise BatchError(404, "JobNotFound", "The specified job does not exist.")
            route = (method, len(parts), parts[2], parts[4] if len(parts) == 5 else None)
            if route == ("POST", 3, "tasks", None):
                created = self._add(parts[1], tasks, body)
                return (
                    201,
                    None,
                    {
                        "ETag": created["eTag"],
                        "Last-Modified": self._rfc1123(),
                        "Location": created["url"],
                        "DataServiceId": created["url"],
                    },
                )
            if route == ("POST", 3, "addtaskcollection", None):
                return 200, self._add_collection(parts[1], tasks, body), {}
            if route == ("GET", 3, "tasks", None):
                return 200, self._list(parts[1], tasks, query), {}
            if route == ("GET", 4, "tasks", None):
                return (
                    200,
                    self._select(self._find(tasks, parts[3]), query),
                    {"ETag": self._find(tasks, parts[3])["eTag"]},
                )
            if route == ("POST", 5, "tasks", "terminate"):
                self._terminate(self._find(tasks, parts[3]))
                return 204, None, {}
        raise AssertionError(f"the fake Batch service has no route for {method} {path}")

    def _rfc1123(self) -> str:
        return email.utils.formatdate(self.clock(), usegmt=True)

    @staticmethod
    def _find(tasks: dict[str, dict[str, Any]], task_id: str) -> dict[str, Any]:
        task = tasks.get(task_id.lower())
        if task is None:
            raise BatchError(404, "TaskNotFound", "The specified task does not exist.")
        return task

    @staticmethod
    def _invalid(name: str, reason: str) -> BatchError:
        return BatchError(
            400,
            "InvalidPropertyValue",
            "The value provided for one of the properties in the request body is invalid.",
            {"PropertyName": name, "Reason": reason},
        )

    def _validate(self, task: Any) -> None:
        if not isinstance(task, dict):
            raise BatchError(400, "InvalidRequestBody", "The specified Request Body is not syntactically valid.")
        unknown = sorted(set(task) - TASK_PROPERTIES)
        if unknown:
            raise BatchError(
                400,
                "InvalidRequestBody",
                "The specified Request Body is not syntactically valid.",
                {"PropertyName": unknown[0]},
            )
        if not isinstance(task.get("id"), str) or not TASK_ID.match(task["id"]):
            raise self._invalid("id", "must be 1-64 letters, digits, hyphens or underscores")
        if not isinstance(task.get("commandLine"), str):
            raise BatchError(
                400,
                "MissingRequiredProperty",
                "A property that is required for this request was not specified.",
                {"PropertyName": "commandLine"},
            )
        slots = task.get("requiredSlots", 1)
        if not isinstance(slots, int) or slots < 1:
            raise self._invalid("requiredSlots", "must be a positive integer")
        self._validate_container_and_constraints(task)
        self._validate_identity_environment_outputs(task)

    def _validate_container_and_constraints(self, task: dict[str, Any]) -> None:
        container = task.get("containerSettings")
        if container is not None and (set(container) - CONTAINER_PROPERTIES or not container.get("imageName")):
            raise self._invalid("containerSettings", "needs imageName and only known properties")
        constraints = task.get("constraints") or {}
        if set(constraints) - CONSTRAINT_PROPERTIES:
            raise self._invalid("constraints", "unknown property")
        for name in ("maxWallClockTime", "retentionTime"):
            if name in constraints and not ISO_DURATION.match(str(constraints[name])):
                raise self._invalid(name, "not an ISO 8601 duration")

    def _validate_identity_environment_outputs(self, task: dict[str, Any]) -> None:
        for setting in task.get("environmentSettings") or []:
            if set(setting) - {"name", "value"} or not setting.get("name"):
                raise self._invalid("environmentSettings", "each setting is {name, value}")
        auto = (task.get("userIdentity") or {}).get("autoUser") or {}
        if auto.get("scope", "pool") not in ("pool", "task") or auto.get("elevationLevel", "nonadmin") not in (
            "admin",
            "nonadmin",
        ):
            raise self._invalid("userIdentity", "unknown scope or elevation level")
        for output in task.get("outputFiles") or []:
            condition = (output.get("uploadOptions") or {}).get("uploadCondition")
            if not output.get("filePattern") or condition not in ("tasksuccess", "taskfailure", "taskcompletion"):
                raise self._invalid("outputFiles", "needs filePattern and uploadOptions.uploadCondition")
            if not (output.get("destination") or {}).get("container", {}).get("containerUrl"):
                raise self._invalid("outputFiles", "needs destination.container.containerUrl")

    def _add(self, job_id: str, tasks: dict[str, dict[str, Any]], body: Any) -> dict[str, Any]:
        self._validate(body)
        if body["id"].lower() in tasks:
            raise BatchError(409, "TaskExists", "The specified task already exists.")
        now = _iso(self.clock())
        url = f"{self.endpoint}/jobs/{quote(job_id)}/tasks/{quote(body['id'])}"
        created = {
            "id": body["id"],
            "url": url,
            "eTag": f"0x{uuid.uuid4().hex[:15].upper()}",
            "creationTime": now,
            "lastModified": now,
            "state": "active",
            "stateTransitionTime": now,
            **{k: v for k, v in body.items() if k != "id"},
            "constraints": {
                "maxWallClockTime": "P10675199DT2H48M5.4775807S",
                "retentionTime": "P7D",
                "maxTaskRetryCount": 0,
                **(body.get("constraints") or {}),
            },
            "requiredSlots": body.get("requiredSlots", 1),
            "executionInfo": {"retryCount": 0, "requeueCount": 0},
        }
        tasks[body["id"].lower()] = created
        return created

    def _add_collection(self, job_id: str, tasks: dict[str, dict[str, Any]], body: Any) -> dict[str, Any]:
        values = body.get("value") if isinstance(body, dict) else None
        if not isinstance(values, list) or not values:
            raise BatchError(400, "InvalidRequestBody", "The specified Request Body is not syntactically valid.")
        if len(values) > MAX_TASKS_PER_COLLECTION:
            raise BatchError(
                413, "RequestBodyTooLarge", "The request body is too large and exceeds the maximum permissible limit."
            )
        results = []
        for task in values:
            try:
                created = self._add(job_id, tasks, task)
            except BatchError as e:
                error: dict[str, Any] = {"code": e.code, "message": {"lang": "en-US", "value": e.message}}
                if e.values:
                    error["values"] = [{"key": k, "value": v} for k, v in e.values.items()]
                task_id = task.get("id") if isinstance(task, dict) else None
                results.append({"status": "clienterror", "taskId": task_id, "error": error})
                continue
            results.append(
                {
                    "status": "success",
                    "taskId": created["id"],
                    "eTag": created["eTag"],
                    "lastModified": created["lastModified"],
                    "location": created["url"],
                }
            )
        return {"odata.metadata": f"{self.endpoint}/$metadata#taskaddresult", "value": results}

    @staticmethod
    def _matches(task: dict[str, Any], expression: str) -> bool:
        for clause in expression.split(" and "):
            match = re.fullmatch(r"\s*(\w+)\s+(eq|ne)\s+'([^']*)'\s*", clause)
            if match is None:
                raise BatchError(
                    400,
                    "InvalidQueryParameterValue",
                    "Value for one of the query parameters specified in the request URI is invalid.",
                    {"QueryParameterName": "$filter", "QueryParameterValue": expression},
                )
            name, op, value = match.groups()
            if (str(task.get(name)) == value) != (op == "eq"):
                return False
        return True

    @staticmethod
    def _select(task: dict[str, Any], query: dict[str, str]) -> dict[str, Any]:
        if "$select" not in query:
            return task
        wanted = {name.strip() for name in query["$select"].split(",")}
        return {k: v for k, v in task.items() if k in wanted}

    def _list(self, job_id: str, tasks: dict[str, dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
        chosen = (
            [t for t in tasks.values() if self._matches(t, query.get("$filter", ""))]
            if query.get("$filter")
            else list(tasks.values())
        )
        size = min(self.page_size, int(query.get("maxresults", "1000")))
        start = int(base64.urlsafe_b64decode(query["$skiptoken"]).decode()) if "$skiptoken" in query else 0
        page = chosen[start : start + size]
        answer: dict[str, Any] = {
            "odata.metadata": f"{self.endpoint}/$metadata#tasks",
            "value": [self._select(t, query) for t in page],
        }
        if start + size < len(chosen):
            token = base64.urlsafe_b64encode(str(start + size).encode()).decode()
            rest = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items() if k != "$skiptoken")
            answer["odata.nextLink"] = f"{self.endpoint}/jobs/{quote(job_id)}/tasks?{rest}&$skiptoken={token}"
        return answer

    def _terminate(self, task: dict[str, Any]) -> None:
        if task["state"] == "completed":
            raise BatchError(409, "TaskCompleted", "The specified task is already in a completed state.")
        failure = {"category": "usererror", "code": "TaskEnded", "message": "Task Was Ended by User Request"}
        job_id = task["url"].split("/jobs/")[1].split("/")[0]
        self.complete(unquote(job_id), task["id"], exit_code=None, failure=failure)


class FakeBatchTransport(InProcessTransport):
    """azure-core transport that hands each request to ``service`` and never opens a socket.
    Retry back-offs are recorded in ``slept`` instead of waited out."""

    def __init__(self, service: FakeBatchService) -> None:
        super().__init__(service.endpoint, service.handle)
