"""The figures the functions publish, each one CloudWatch embedded metric format (EMF) document on
stdout (Powertools ``single_metric``): Lambda's log stream turns them into CloudWatch metrics in
the ``runplane`` namespace, with no call to CloudWatch and nothing kept between requests, so
threads serving requests side by side never publish each other's figures.

| metric | unit | dimensions | published by, when |
| --- | --- | --- | --- |
| RunsSubmitted | Count | service | the API, each run submitted |
| SweepsCreated | Count | service | the API, each sweep made |
| QueueDepth | Count | service, pool | the dispatcher, each pass over a pool: its queued runs |
| Workers | Count | service, pool, status | the dispatcher, each pass: starting, idle, busy, draining, offline |
| WorkersLaunched | Count | service, pool | the dispatcher, each launch |
| LaunchFailures | Count | service, pool | the dispatcher, each launch the backend refused |
| RunsEnded | Count | service, pool, state, reason | the dispatcher, each run's end event |
| SecondsToRunning | Seconds | service, pool | the dispatcher, each run's end event: submit to its first start |

Set POWERTOOLS_METRICS_DISABLED=true to publish none (the benchmarks do). On Azure the same lines
reach the function's logs, where they are log lines, not metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

if TYPE_CHECKING:
    from runplane.services.dispatch import PoolFigures

NAMESPACE = "runplane"
WORKER_STATES = ("starting", "idle", "busy", "draining", "offline")


def emit(name: str, value: float, service: str, unit: MetricUnit = MetricUnit.Count, **dimensions: str) -> None:
    """Publish one metric of ``service`` (api, dispatcher) with ``dimensions`` as its own document."""
    if is_metrics_disabled():
        return
    with single_metric(
        name=name,
        unit=unit,
        value=value,
        namespace=NAMESPACE,
        default_dimensions={"service": service, **dimensions},
    ):
        pass


def pool_figures(pool: str, figures: PoolFigures) -> None:
    emit("QueueDepth", figures.backlog, "dispatcher", pool=pool)
    for status in WORKER_STATES:
        emit("Workers", figures.workers.get(status, 0), "dispatcher", pool=pool, status=status)
    if figures.launched:
        emit("WorkersLaunched", figures.launched, "dispatcher", pool=pool)
    if figures.launch_failed:
        emit("LaunchFailures", 1, "dispatcher", pool=pool)


def run_ended(pool: str, state: str, reason: str | None, to_running: float | None) -> None:
    emit("RunsEnded", 1, "dispatcher", pool=pool, state=state, reason=reason or "none")
    if to_running is not None:
        emit("SecondsToRunning", round(to_running, 3), "dispatcher", MetricUnit.Seconds, pool=pool)
