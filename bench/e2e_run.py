"""End-to-end time of a trivial run on a warm local worker vs the same container run bare.

The embedded local stack (moto in-process, HTTP front, dispatcher, one local worker agent on the
real Docker engine) runs ``sh -c true`` in ``runplane/test-busybox:1``. A run is timed from
POST /v1/runs until GET /v1/runs/{id} (polled every 20 ms with the CLI's client) shows a final
state. The baselines start the same container themselves:

* docker SDK, same isolation: create with the very kwargs the agent uses for the same run
  (``container_spec``: ``sh -c true``, uid 65534, its own core, memory/cpu/pids limits, the
  capabilities the agent keeps, no-new-privileges, a fresh output directory) + start + wait + remove;
* the same, while a thread polls GET /v1/runs/{id} every 20 ms like the e2e path does (on a
  small machine that load alone slows container starts; informational);
* ``docker run --rm --network none`` (the CLI): a user's own way to run the container, the
  RATIO's baseline.

The four are measured in rotating order in every round. RATIO is e2e / ``docker run``; e2e /
docker SDK (the same isolation as the agent's) is printed above it.

    python bench/e2e_run.py [--n 15]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import agent_pids, bare_container, dev_stack, median, ratio_line, table

from runplane import bootstrap
from runplane.domain.states import TERMINAL_STATES

TARGET = 1.2
IMAGE = "runplane/test-busybox:1"
AGENT_ARGS = "--poll-seconds 1 --heartbeat-seconds 1 --lease-seconds 10 --kill-poll-seconds 0.5 --network-mode host"
POOLS_YAML = (
    "pools: [{name: default, backend: local, cpus: 2, memory: 4g, min_workers: 0, max_workers: 1, "
    f"idle_seconds: 600, default_image: '{IMAGE}'}}]\n"
)
SPEC = {"command": "true", "name": "bench-e2e"}  # the agent runs it as /bin/sh -c true
# What worker_agent/executor.py applies to every run container.
POLL_SECONDS = 0.02
RUN_TIMEOUT = 30.0
TERMINAL = TERMINAL_STATES  # RunState is a StrEnum: the API's strings match
STEPS = [  # (label, from event state, to event state)
    ("submitted -> claimed", "queued", "preparing"),
    ("claimed -> started", "preparing", "running"),
    ("started -> uploading", "running", "uploading"),
    ("uploading -> finished", "uploading", "succeeded"),
]


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class E2EBench:
    def __init__(self, api_url: str) -> None:
        import docker

        from runplane.client import Client

        self.client = Client(api_url, "bench")
        self.docker = docker.from_env()
        self.scratch = Path(tempfile.mkdtemp(prefix="runplane-bench-mounts-"))
        self.samples: dict[str, list[float]] = {"e2e": [], "sdk": [], "sdk polled": [], "cli": []}
        self.last_run_id = ""
        self.steps: dict[str, list[float]] = {label: [] for label, _, _ in STEPS}
        self.steps["POST -> submitted (API)"] = []
        self.steps["finished -> seen by client"] = []
        self.timings: dict[str, list[float]] = {}
        self.polls: list[int] = []
        self.sdk_parts: dict[str, list[float]] = {}
        self.template: Any = None

    def e2e(self, record: bool = True) -> float:
        wall = time.time()
        t = time.perf_counter()
        run = self.client.request("POST", "/v1/runs", SPEC)
        self.last_run_id = run["id"]
        polls = 0
        while run["state"] not in TERMINAL:
            if time.perf_counter() - t > RUN_TIMEOUT:
                raise RuntimeError(f"run {run['id']} not finished after {RUN_TIMEOUT:.0f}s: {run['state']}")
            time.sleep(POLL_SECONDS)
            run = self.client.request("GET", f"/v1/runs/{run['id']}")
            polls += 1
        elapsed = time.perf_counter() - t
        seen = time.time()
        if run["state"] != "succeeded":
            raise RuntimeError(f"run {run['id']} ended {run['state']}: {run.get('failure')}")
        if record:
            self._breakdown(run, wall, seen)
            self.polls.append(polls)
        return elapsed

    def _breakdown(self, run: dict[str, Any], posted: float, seen: float) -> None:
        at: dict[str, float] = {}
        for event in run["events"]:
            if event.get("state") and event["state"] not in at:
                at[event["state"]] = _ts(event["at"])
        for label, start, end in STEPS:
            if start in at and end in at:
                self.steps[label].append(at[end] - at[start])
        self.steps["POST -> submitted (API)"].append(at["queued"] - posted)
        self.steps["finished -> seen by client"].append(seen - at["succeeded"])
        for key, value in (run.get("usage") or {}).get("timings", {}).items():
            self.timings.setdefault(key, []).append(value)

    def sdk(self, parts: dict[str, list[float]] | None = None) -> float:
        """create + start + wait + remove with the kwargs the agent uses for the same run."""
        if self.template is None:  # the stored run of the warm-up: container_spec takes a Run
            self.template = bootstrap.stack().store.get(self.last_run_id)
        code, (t, *marks, end) = bare_container(self.docker, self.template, IMAGE, self.scratch)
        assert code == 0, code
        if parts is not None:
            for label, value in zip(
                ("create", "start", "wait", "remove"),
                (marks[0] - t, marks[1] - marks[0], marks[2] - marks[1], end - marks[2]),
                strict=True,
            ):
                parts.setdefault(label, []).append(value)
        return end - t

    def sdk_polled(self) -> float:
        """``sdk`` while another thread polls the API as ``e2e`` does: the load the harness adds."""
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(POLL_SECONDS):
                self.client.request("GET", f"/v1/runs/{self.last_run_id}")

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            return self.sdk()
        finally:
            stop.set()
            poller.join()

    @staticmethod
    def cli() -> float:
        t = time.perf_counter()
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", IMAGE, "sh", "-c", "true"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return time.perf_counter() - t

    def rounds(self, n: int) -> None:
        paths: list[tuple[str, Callable[[], float]]] = [
            ("e2e", self.e2e),
            ("sdk", lambda: self.sdk(self.sdk_parts)),
            ("sdk polled", self.sdk_polled),
            ("cli", self.cli),
        ]
        for i in range(n):
            for label, path in paths[i % len(paths) :] + paths[: i % len(paths)]:
                self.samples[label].append(path())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15, help="measured rounds (default 15)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured runs first (default 2)")
    args = parser.parse_args()
    with dev_stack(POOLS_YAML, AGENT_ARGS, wait_agents=True) as stack:
        bench = E2EBench(stack.api_url)
        try:
            t0 = time.perf_counter()
            first = bench.e2e(record=False)
            print(f"first run (launches the worker agent): {first:.2f}s")
            for _ in range(max(0, args.warmup - 1)):
                bench.e2e(record=False)
            for _ in range(2):
                bench.sdk()
                bench.cli()
            print(f"warm-up done in {time.perf_counter() - t0:.1f}s; measuring {args.n} rounds")
            agents = agent_pids()
            t0 = time.perf_counter()
            bench.rounds(args.n)
            print(
                f"rounds took {time.perf_counter() - t0:.1f}s; {len(agents)} agent process(es); "
                f"{median(bench.polls):.0f} polls per run (median)"
            )
        finally:
            shutil.rmtree(bench.scratch, ignore_errors=True)

    s = bench.samples
    table(
        f"trivial run ({IMAGE}, sh -c true), sequential, warm worker",
        [
            ("e2e: POST -> final state via API", s["e2e"]),
            ("docker SDK create+start+wait+remove, same isolation", s["sdk"]),
            ("  same, while a client polls the API every 20 ms", s["sdk polled"]),
            ("docker run --rm --network none (CLI)", s["cli"]),
        ],
    )
    table("e2e breakdown from the run's events (median of each step)", list(bench.steps.items()))
    if bench.timings:
        table(
            "agent's own timings (usage.timings; run = container start until its exit is handled)",
            sorted(bench.timings.items()),
        )
    table("docker SDK baseline by step", list(bench.sdk_parts.items()))
    total = sum(median(v) for k, v in bench.steps.items() if v)
    print(
        f"\n  sum of step medians {total * 1000:.0f} ms; e2e median {median(s['e2e']) * 1000:.0f} ms; "
        f"e2e - SDK {(median(s['e2e']) - median(s['sdk'])) * 1000:.0f} ms"
    )
    print(f"  e2e / docker SDK same isolation: {median(s['e2e']) / median(s['sdk']):.2f}x")
    print(ratio_line("e2e_run (e2e / docker run --rm --network none)", median(s["e2e"]) / median(s["cli"]), TARGET))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
