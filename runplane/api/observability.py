"""Powertools Tracer for the functions, without paying for X-Ray when tracing is off.

Powertools' Tracer imports the X-Ray SDK (about 200 ms) even when tracing is disabled, because
it builds its default provider eagerly. When tracing is off (outside Lambda, or by
POWERTOOLS_TRACE_DISABLED) we hand it a provider that does nothing, so the SDK is never loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Generator, Sequence
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.tracing.base import BaseProvider, BaseSegment


class _NullSegment(BaseSegment):
    def close(self, end_time: int | None = None) -> None:
        return None

    def add_subsegment(self, subsegment: Any) -> None:
        return None

    def remove_subsegment(self, subsegment: Any) -> None:
        return None

    def put_annotation(self, key: str, value: Any) -> None:
        return None

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        return None

    def add_exception(self, exception: BaseException, stack: Any, remote: bool = False) -> None:
        return None


class _NoTracing(BaseProvider):
    @contextlib.contextmanager
    def in_subsegment(self, name: str | None = None, **kwargs: Any) -> Generator[BaseSegment, None, None]:
        yield _NullSegment()

    @contextlib.asynccontextmanager
    async def in_subsegment_async(self, name: str | None = None, **kwargs: Any) -> AsyncGenerator[BaseSegment, None]:
        yield _NullSegment()

    def put_annotation(self, key: str, value: Any) -> None:
        return None

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        return None

    def patch(self, modules: Sequence[str]) -> None:
        return None

    def patch_all(self) -> None:
        return None


def make_tracer(service: str) -> Tracer:
    if Tracer._is_tracer_disabled():
        return Tracer(service=service, disabled=True, auto_patch=False, provider=_NoTracing())
    return Tracer(service=service)
