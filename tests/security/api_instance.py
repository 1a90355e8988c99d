"""One API instance in a process of its own, as a Lambda sandbox or an Azure Functions worker is:
``python -m tests.security.api_instance aws|azure`` with the stack's ``RUNPLANE_*`` settings in its
environment. It builds its stack and warms up, prints ``ready``, then serves one request per line
of stdin (``{"method", "path", "headers", "body"}``) through that cloud's own entry point, and
answers each with one line (``{"status", "body"}``). Several of them released together race
each other in the stores, which requests through one local front never do (a front resolves one
request at a time, as one sandbox does)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any


def _aws() -> Callable[[str, str, dict[str, str], bytes], tuple[int, bytes]]:
    from functions.aws import api
    from runplane.api.gateway import http_event, response_parts
    from runplane.devstack.lambda_shim import LambdaContext

    def call(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        event = http_event(method, path, "", headers, body, "127.0.0.1")
        status, _, data = response_parts(api.lambda_handler(event, LambdaContext(function_name="runplane-api")))
        return status, data

    return call


def _azure() -> Callable[[str, str, dict[str, str], bytes], tuple[int, bytes]]:
    import azure.functions as func

    from runplane.api.azure_front import handle

    def call(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        answer = handle(func.HttpRequest(method=method, url=f"http://127.0.0.1{path}", headers=headers, body=body))
        return answer.status_code, answer.get_body()

    return call


def caller(cloud: str) -> Callable[[str, str, dict[str, str], bytes], tuple[int, bytes]]:
    """``call(method, path, headers, body) -> (status, body)`` through ``cloud``'s own entry point
    (``aws`` or ``azure``), on this process's stack (``bootstrap.stack()``)."""
    return {"aws": _aws, "azure": _azure}[cloud]()


def main(cloud: str) -> None:
    # The answers keep stdout to themselves: what the functions log there (Powertools logs JSON
    # lines to stdout, as Lambda wants) goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from runplane import bootstrap

    call = caller(cloud)
    bootstrap.stack()
    status, _ = call("GET", "/v1/health", {}, b"")
    if status != 200:
        raise SystemExit(f"the API instance does not answer its health check: {status}")
    answers.write("ready\n")
    answers.flush()
    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        body = json.dumps(request["body"]).encode() if request.get("body") is not None else b""
        status, data = call(request["method"], request["path"], request.get("headers") or {}, body)
        answers.write(json.dumps({"status": status, "body": json.loads(data) if data else None}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main(sys.argv[1])
