"""The Batch data-plane REST calls the backend makes, through an azure-core pipeline.

One ``BatchClient`` per account. Requests go through a retry policy (throttling, server
errors and lost connections, honouring ``Retry-After``; calls that add tasks are sent once, so a
task is never added twice by a retry) and then the authentication policy, so that each retry is
signed afresh. The
transport is azure-core's requests transport unless one is given: tests pass their own.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from azure.core import PipelineClient
from azure.core.credentials import TokenCredential
from azure.core.exceptions import AzureError
from azure.core.pipeline.policies import BearerTokenCredentialPolicy, RetryPolicy, UserAgentPolicy
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest, HttpResponse

from runplane.compute.azure_batch.auth import BatchSharedKeyPolicy
from runplane.domain.errors import BackendError, InvalidRequest

API_VERSION = "2024-07-01.20.0"
JSON_CONTENT = "application/json; odata=minimalmetadata"
BATCH_SCOPE = "https://batch.core.windows.net/.default"


class BatchServiceError(BackendError):
    """The Batch service refused a request: the HTTP ``status``, the service's error ``batch_code``
    (e.g. ``TaskNotFound``) and its message, read from the JSON error body."""

    def __init__(self, what: str, status: int, batch_code: str, batch_message: str, request_id: str = "") -> None:
        first_line = batch_message.splitlines()[0] if batch_message else "no message"
        super().__init__(
            f"Azure Batch {what} failed: HTTP {status} {batch_code or 'error'}: {first_line}",
            status=status,
            batch_code=batch_code,
            batch_message=batch_message,
            request_id=request_id,
        )
        self.status = status
        self.batch_code = batch_code
        self.batch_message = batch_message


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


def service_error(what: str, status: int, content: bytes, request_id: str = "") -> BatchServiceError:
    """The error a non-2xx answer carries: ``{"code", "message": {"lang", "value"}, "values"}``."""
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("code") or "")
    message = body.get("message")
    text = str(message.get("value", "")) if isinstance(message, dict) else str(message or "")
    if not body:
        text = content[:200].decode("utf-8", "replace").strip()
    for item in body.get("values") or []:
        if isinstance(item, dict) and item.get("key"):
            text += f"\n{item['key']}: {item.get('value', '')}"
    return BatchServiceError(what, status, code, text, request_id)


def _account_from(endpoint: str) -> tuple[str, str]:
    parts = urlsplit(endpoint)
    if parts.scheme != "https" or not parts.hostname or parts.path.strip("/") or parts.query:
        raise InvalidRequest(
            f"the Azure Batch account URL must look like https://<account>.<region>.batch.azure.com, got {endpoint!r}"
        )
    return f"https://{parts.netloc}", parts.hostname.split(".")[0]


class BatchClient:
    """Calls to one Batch account's data plane, authenticated with the account's shared key or,
    without one, with ``credential`` (a bearer token for ``BATCH_SCOPE``)."""

    def __init__(
        self,
        endpoint: str,
        *,
        account_key: str | None = None,
        credential: TokenCredential | None = None,
        transport: HttpTransport[Any, Any] | None = None,
        clock: Callable[[], float] = time.time,
        retry_total: int = 3,
    ) -> None:
        self.endpoint, self.account = _account_from(endpoint)
        auth: BatchSharedKeyPolicy | BearerTokenCredentialPolicy[HttpRequest, HttpResponse]
        if account_key:
            auth = BatchSharedKeyPolicy(self.account, account_key, clock)
        elif credential is not None:
            auth = BearerTokenCredentialPolicy(credential, BATCH_SCOPE)
        else:
            raise InvalidRequest("Azure Batch needs an account key or a token credential")
        if transport is None:
            from azure.core.pipeline.transport import RequestsTransport

            transport = RequestsTransport(connection_timeout=10, read_timeout=60)
        policies = [
            UserAgentPolicy("runplane-azure-batch", user_agent_use_env=False),
            RetryPolicy(retry_total=retry_total, retry_backoff_factor=0.8, retry_backoff_max=30),
            auth,
        ]
        self._client: PipelineClient[HttpRequest, HttpResponse] = PipelineClient(
            self.endpoint, policies=policies, transport=transport
        )

    def url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """``path`` under the account, with the API version and ``query`` (names sent as they are:
        Batch spells them ``$filter``, ``$select``)."""
        params = {"api-version": API_VERSION, **(query or {})}
        return f"{self.endpoint}{path}?" + "&".join(f"{name}={quote(value, safe='')}" for name, value in params.items())

    def call(self, what: str, method: str, url: str, body: Any = None, *, retry: bool = True) -> Reply:
        """Send one request; return the 2xx answer with its JSON body (None when empty).
        ``retry=False`` sends it once (for requests that must not be repeated).

        Raises BatchServiceError for an error answer and BackendError when the service cannot
        be reached or answers something unreadable.
        """
        target = urlsplit(url)
        if f"{target.scheme}://{target.netloc}" != self.endpoint:
            raise BackendError(f"Azure Batch {what}: refusing to send a signed request to {url!r}")
        headers = {"Accept": "application/json", "client-request-id": str(uuid.uuid4())}
        content: bytes | None = None
        if method != "GET":
            content = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = JSON_CONTENT
            headers["Content-Length"] = str(len(content))
        try:
            request = HttpRequest(method, url, headers=headers, content=content)
            if retry:
                response = self._client.send_request(request)
            else:
                response = self._client.send_request(request, retry_total=0)
            data = response.read()
        except AzureError as e:
            raise BackendError(f"Azure Batch {what} failed: {e.message}") from e
        if not 200 <= response.status_code < 300:
            raise service_error(what, response.status_code, data, response.headers.get("request-id", ""))
        try:
            parsed = json.loads(data) if data else None
        except ValueError as e:
            raise BackendError(f"Azure Batch {what}: the answer is not JSON") from e
        return Reply(response.status_code, parsed, dict(response.headers))
