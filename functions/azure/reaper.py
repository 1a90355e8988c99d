"""The reaper, on a timer: re-queue runs whose lease expired, re-hint queued runs, then the retention sweep."""

import logging
from dataclasses import asdict

import azure.functions as func

from runplane import bootstrap
from runplane.handlers import run_reaper

bp = func.Blueprint()  # type: ignore[no-untyped-call]
log = logging.getLogger("runplane.reaper")


@bp.function_name("reaper")
@bp.timer_trigger(arg_name="timer", schedule="%RunplaneSchedule%")
def reaper(timer: func.TimerRequest) -> None:
    report = asdict(run_reaper(bootstrap.stack().ports))
    if any(report.values()):
        log.info("reaped: %s", report)
