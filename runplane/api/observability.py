"""Powertools Metrics and Tracer for the functions, without paying for X-Ray when tracing is off.

Metrics leave as CloudWatch embedded metric format (EMF) documents on stdout, one per metric, at
once (``emit``): nothing is kept between calls, so threads serving requests side by side never
publish each other's figures, and a metric is never lost to a handler that raised.

Powertools' Tracer imports the X-Ray SDK (about 200 ms) even when tracing is disabled, because
it builds its default provider eagerly. When tracing is off (outside Lambda, or by
POWERTOOLS_TRACE_DISABLED) we hand it a provider that does nothing, so the SDK is never loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Generator, Sequence
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.metrics.functions import is_metrics_disabled
from aws_lambda_powertools.tracing.base import BaseProvider, BaseSegment

NAMESPACE = "runplane"

UNITS = {"count": MetricUnit.Count, "seconds": MetricUnit.Seconds, "milliseconds": MetricUnit.Milliseconds}


def emit(name: str, value: float, service: str, unit: str = "count", **dimensions: str) -> None:
    """Publish one metric of ``service`` (api, dispatcher, reaper) with ``dimensions`` (pool,
    state, reason...) as its own EMF document (none with POWERTOOLS_METRICS_DISABLED set)."""
    if is_metrics_disabled():
        return
    with single_metric(
        name=name,
        unit=UNITS[unit],
        value=value,
        namespace=NAMESPACE,
        default_dimensions={"service": service, **dimensions},
    ):
        pass


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
