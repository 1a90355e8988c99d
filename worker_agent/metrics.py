"""This worker's figures as Prometheus text, on ``--metrics-port`` (``GET /metrics``).

The same figures the functions publish for the whole stack (``runplane.metrics``), for one worker:
its slots and runs under way, the runs it ended by state and failure reason, and how long its runs
waited (submit to first start) and took to claim (hint received to claimed), as summaries (a sum
and a count) that a rate can be read from. Served on loopback unless ``--metrics-address`` says
otherwise: it names runs' states and reasons, not their owners or ids.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runplane.domain.runs import Run

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Gauges:
    """What the worker has now."""

    slots: int
    active: int
    gpus: int


class AgentMetrics:
    """Counters of the runs this worker ended; ``render`` gives them with the gauges of now."""

    def __init__(self, pool: str, worker_id: str) -> None:
        self.labels = f'pool="{_escape(pool)}",worker="{_escape(worker_id)}"'
        self._lock = threading.Lock()
        self.ended: Counter[tuple[str, str]] = Counter()
        self.to_running = [0.0, 0]  # sum, count
        self.claim = [0.0, 0]

    def run_ended(self, run: Run, timings: dict[str, float]) -> None:
        """Count ``run``'s end here, with its waits: an attempt that ended here without ending the
        run (handed back, taken away) is not counted."""
        if not run.state.terminal:
            return
        started = run.started_at  # its timeline may no longer hold its start (records.bound_events)
        with self._lock:
            self.ended[(str(run.state), str(run.failure.reason) if run.failure else "none")] += 1
            if started is not None:
                self.to_running[0] += max(0.0, started - run.created_at)
                self.to_running[1] += 1
            if "claim" in timings:
                self.claim[0] += timings["claim"]
                self.claim[1] += 1

    def render(self, gauges: Gauges) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{{{self.labels}{extra}}} {_number(value)}" for extra, value in samples)

        with self._lock:
            ended = sorted(self.ended.items())
            to_running, claim = list(self.to_running), list(self.claim)
        metric("runplane_worker_slots", "gauge", "Runs this worker may run at once.", [("", gauges.slots)])
        metric("runplane_worker_runs_active", "gauge", "Runs under way on this worker.", [("", gauges.active)])
        metric("runplane_worker_gpus", "gauge", "GPUs this worker offers.", [("", gauges.gpus)])
        metric(
            "runplane_worker_runs_ended_total",
            "counter",
            "Runs this worker ended, by state and failure reason.",
            [(f',state="{state}",reason="{reason}"', count) for (state, reason), count in ended],
        )
        for name, (total, count), help_text in (
            ("runplane_worker_seconds_to_running", to_running, "Seconds from submit to the last start of its runs."),
            ("runplane_worker_claim_seconds", claim, "Seconds from a run's hint received to claimed."),
        ):
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} summary"])
            lines.append(f"{name}_sum{{{self.labels}}} {_number(total)}")
            lines.append(f"{name}_count{{{self.labels}}} {_number(count)}")
        return "\n".join(lines) + "\n"


def serve(metrics: AgentMetrics, gauges: Callable[[], Gauges], address: str, port: int) -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` on ``address:port`` from a daemon thread; the server is returned
    (its ``server_address`` names the port taken when ``port`` is 0)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = metrics.render(gauges()).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("metrics: " + format, *args)

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def _number(value: float) -> str:
    """A sample's value in full: a whole number without a point, else every digit a float has."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
