"""The answer an in-process fake service gives azure-core, as its transport would read it off the wire."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

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
