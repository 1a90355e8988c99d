"""Lambda on a schedule: re-queue runs whose lease expired, re-hint queued runs, then the retention sweep."""

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Logger

from runplane import bootstrap
from runplane.handlers import run_reaper

logger = Logger(service="runplane-reaper")


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    report = asdict(
        run_reaper(bootstrap.stack().ports, time_left=lambda: context.get_remaining_time_in_millis() / 1000)
    )
    if any(report.values()):
        logger.info("reaped", extra=report)
    return report
