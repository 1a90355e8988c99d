"""The local stack's dispatcher or reaper in a process of its own (AWS terms), for a stack started
with ``DevConfig(functions=False)``: as on Lambda, each is its own program that can die at any
moment (the soak kills them with SIGKILL) and comes back as a fresh invocation. A batch of events
a killed dispatcher held comes back once its visibility timeout (30 s) runs out, as with SQS.

    python -m runplane.devstack.functions_process dispatcher [--schedule-seconds 5]
    python -m runplane.devstack.functions_process reaper [--schedule-seconds 5]

It reads the stack's settings from its environment (the stack's ``DevStack.environment``:
RUNPLANE_AWS_ENDPOINT_URL, RUNPLANE_PREFIX, RUNPLANE_POOLS, ...) and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from runplane import bootstrap
from runplane.devstack.aws import AwsCloud
from runplane.settings import StackSettings

log = logging.getLogger(__name__)


def serve(role: str, schedule_seconds: float, stop: threading.Event) -> None:
    settings = StackSettings.from_env()
    cloud = AwsCloud(settings.aws_endpoint_url)
    bootstrap.use(cloud.build(settings))  # what the functions of this process serve
    next_schedule = time.monotonic() + schedule_seconds
    while not stop.is_set():
        if role == "reaper":
            stop.wait(schedule_seconds)
            cloud.fire("reaper")
            continue
        try:  # the events queue (a long poll of 1 s), then the schedule when it is due
            cloud.poll_events(stop)
        except Exception:  # as the platform's trigger does: the next poll comes all the same
            log.exception("dispatcher poll failed")
            stop.wait(1)
        if time.monotonic() >= next_schedule:
            next_schedule = time.monotonic() + schedule_seconds
            cloud.fire("dispatcher")


def main() -> int:
    parser = argparse.ArgumentParser(description="the local stack's dispatcher or reaper")
    parser.add_argument("role", choices=("dispatcher", "reaper"))
    parser.add_argument("--schedule-seconds", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {args.role} %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.role, args.schedule_seconds, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
