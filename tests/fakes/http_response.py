"""What the in-process fakes of Azure services share: the answer a fake gives azure-core, as its
transport would read it off the wire, and the transport that hands each request to a fake (no
socket is opened; a request for any other host fails as unreachable)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any, Self
from urllib.parse import urlsplit

from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest
from azure.core.rest._http_response_impl import HttpResponseImpl
from azure.core.utils import case_insensitive_dict


class FakeResponse(HttpResponseImpl):
    def __init__(self, request: HttpRequest, status: int, headers: dict[str, str], body: bytes) -> None:
        def chunks(**_: Any) -> Iterator[bytes]:
            yield body

        super().__init__(
            request=request,
            internal_response=io.BytesIO(body),
            status_code=status,
            reason="",
            content_type=headers.get("Content-Type"),
            headers=case_insensitive_dict(headers),
            stream_download_generator=chunks,
        )


Handler = Callable[[str, str, dict[str, str], bytes], tuple[int, dict[str, str], bytes]]
"""A fake service's ``handle(method, url, headers, body) -> (status, headers, body)``."""


class InProcessTransport(HttpTransport[HttpRequest, Any]):
    """azure-core transport that hands each request for ``base_url`` to ``handle``. Retry
    back-offs are recorded in ``slept`` instead of waited out."""

    def __init__(self, base_url: str, handle: Handler) -> None:
        self.base_url = base_url
        self.handle = handle
        self.slept: list[float] = []

    def send(self, request: HttpRequest, **kwargs: Any) -> FakeResponse:
        split = urlsplit(request.url)
        if f"{split.scheme}://{split.netloc}" != self.base_url:
            raise ServiceRequestError(f"cannot reach {split.netloc}: only {self.base_url} is served here")
        content = request.content or b""
        if isinstance(content, str):
            content = content.encode()
        status, headers, body = self.handle(request.method, request.url, dict(request.headers), content)
        return FakeResponse(request, status, headers, body)

    def sleep(self, duration: float) -> None:
        self.slept.append(duration)

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *args: object) -> None:
        return None
