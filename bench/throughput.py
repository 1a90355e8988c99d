"""Many trivial runs at once on a few warm workers vs the same containers run bare, as many at a time.

The embedded local stack (moto's server, the HTTP front, the dispatcher, local worker agents on
the real Docker engine) with one pool of ``--workers`` warm workers of ``--slots`` slots each.
``--runs`` runs of ``sh -c true`` in ``runplane/test-busybox:1`` are submitted at once from
``--clients`` threads (``POST /v1/runs``), and timed until every one is final (read from the store;
each must have succeeded). The baselines run the same number of containers, ``workers x slots``
at a time:

* ``docker run --rm --network none`` (the CLI), the target's baseline;
* the docker SDK with the very kwargs the agent uses (``container_spec``: the same isolation),
  create + start + wait + remove, for reference.

The three alternate over ``--rounds`` rounds (a different one first in each). RATIO is the median
runplane time over the median ``docker run`` time. It also prints the submit phase alone, what
each run waited (submitted -> claimed, from its events) and the agents' CPU-seconds per run.

    python bench/throughput.py [--runs 200] [--workers 4] [--slots 1] [--clients 8] [--rounds 2]
    python bench/throughput.py --runs 1000 --slots 2     # the 1,000-run variant on 8 slots
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import (
    add_dynamodb_option,
    agent_pids,
    bare_container,
    dev_stack,
    median,
    p90,
    ratio_line,
    table,
    tables_on,
)

from runplane import bootstrap
from runplane.devstack.moto_process import COUNTS_ENV
from runplane.domain.states import RunState

TARGET = 1.3
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # no metric line per submit in the output
os.environ[COUNTS_ENV] = os.path.join(tempfile.gettempdir(), f"runplane-bench-moto-{os.getpid()}.json")
IMAGE = "runplane/test-busybox:1"
AGENT_ARGS = "--heartbeat-seconds 5 --lease-seconds 30 --network-mode host"
SPEC = {"command": "true", "name": "bench-throughput"}


def pools_yaml(workers: int, slots: int) -> str:
    return (
        f"pools: [{{name: default, backend: local, cpus: {slots}, memory: {4 * slots}g, slots: {slots}, "
        f"min_workers: {workers}, max_workers: {workers}, idle_seconds: 3600, default_image: '{IMAGE}'}}]\n"
    )


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def engine_pids() -> list[int]:
    """dockerd's and containerd's processes (the shims included)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name = stat.read_text().split("(", 1)[1].split(")", 1)[0]
        except (OSError, IndexError):
            continue
        if name in ("dockerd", "containerd") or name.startswith("containerd-shim"):
            found.append(int(stat.parent.name))
    return found


def moto_pids(marker: bytes = b"runplane.devstack.moto_process") -> list[int]:
    """The local stack's moto server process (runplane/devstack/moto_process.py), or with
    ``marker=b"dynalite"`` the dynalite the tables are on."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def moto_calls(pids: list[int]) -> dict[str, int]:
    """The requests moto's server has answered so far, by service and action (none without one)."""
    if not pids:
        return {}
    path = Path(os.environ[COUNTS_ENV])
    path.unlink(missing_ok=True)
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            time.sleep(0.02)
    return {}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU-seconds of these processes so far (their children not included)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Throughput:
    def __init__(self, api_url: str, runs: int, parallel: int, clients: int) -> None:
        import docker

        from runplane.client import Client

        self.api_url = api_url
        self.runs, self.parallel, self.clients = runs, parallel, clients
        self.local = threading.local()
        self.client_class = Client
        self.docker = docker.from_env()
        self.scratch = Path(tempfile.mkdtemp(prefix="runplane-bench-mounts-"))
        self.template: Any = None
        self.submit_times: list[float] = []
        self.waits: list[float] = []
        self.agent_cpu: list[float] = []
        self.stack_cpu: list[float] = []
        self.engine_cpu: list[float] = []
        self.moto_cpu: list[float] = []
        self.tables_cpu: list[float] = []
        self.calls: list[dict[str, float]] = []

    def _client(self) -> Any:
        if not hasattr(self.local, "client"):
            self.local.client = self.client_class(self.api_url, "bench")
        return self.local.client

    def runplane(self, record: bool = True) -> float:
        store = bootstrap.stack().store
        agents = agent_pids()
        engine, moto, tables = engine_pids(), moto_pids(), moto_pids(b"dynalite")
        cpu0, tables0 = cpu_seconds(agents), cpu_seconds(tables)
        stack0, engine0, moto0 = cpu_seconds([os.getpid()]), cpu_seconds(engine), cpu_seconds(moto)
        calls0 = moto_calls(moto)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.clients) as pool:
            ids = list(pool.map(lambda _: self._client().request("POST", "/v1/runs", SPEC)["id"], range(self.runs)))
        submitted = time.perf_counter() - t0
        left = list(ids)
        final: dict[str, Any] = {}
        while left:
            # runs end roughly in the order they were submitted: read the oldest ones not seen
            # final until one is not, so that watching costs a few reads a poll, not one per run
            time.sleep(0.1)
            while left:
                run = store.get(left[0])
                if not run.state.terminal:
                    break
                final[run.id] = run
                left.pop(0)
            if time.perf_counter() - t0 > 60 + self.runs * 2:
                raise RuntimeError(f"{len(left)} runs not final after {time.perf_counter() - t0:.0f}s")
        elapsed = time.perf_counter() - t0
        bad = [r for r in final.values() if r.state != RunState.SUCCEEDED]
        if bad:
            raise RuntimeError(f"{len(bad)} runs did not succeed, e.g. {bad[0].id}: {bad[0].failure}")
        if record:
            self.submit_times.append(submitted)
            self.agent_cpu.append((cpu_seconds(agents) - cpu0) / self.runs)
            self.stack_cpu.append((cpu_seconds([os.getpid()]) - stack0) / self.runs)
            self.engine_cpu.append((cpu_seconds(engine) - engine0) / self.runs)
            self.moto_cpu.append((cpu_seconds(moto) - moto0) / self.runs)
            self.tables_cpu.append((cpu_seconds(tables) - tables0) / self.runs)
            calls = moto_calls(moto)
            self.calls.append({k: (v - calls0.get(k, 0)) / self.runs for k, v in calls.items()})
            for run in final.values():
                at = {e.state: e.at for e in reversed(run.events) if e.state}
                if RunState.PREPARING in at and RunState.QUEUED in at:
                    self.waits.append(at[RunState.PREPARING] - at[RunState.QUEUED])
        self.template = self.template or next(iter(final.values()))
        return elapsed

    def bare_cli(self) -> float:
        def one(_: int) -> None:
            subprocess.run(
                ["docker", "run", "--rm", "--network", "none", IMAGE, "sh", "-c", "true"],
                check=True,
                stdout=subprocess.DEVNULL,
            )

        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.parallel) as pool:
            list(pool.map(one, range(self.runs)))
        return time.perf_counter() - t0

    def bare_sdk(self) -> float:
        def one(_: int) -> None:
            # a name and labels of its own: the agents sweep away run-labelled containers they do not know
            name = f"runplane-bench-{uuid.uuid4().hex[:12]}"
            code, _marks = bare_container(
                self.docker, self.template, IMAGE, self.scratch, name=name, labels={"io.runplane-bench": "1"}
            )
            assert code == 0, code

        t0 = time.perf_counter()
        with ThreadPoolExecutor(self.parallel) as pool:
            list(pool.map(one, range(self.runs)))
        return time.perf_counter() - t0


def wait_workers(api_url: str, count: int, timeout: float = 60) -> None:
    from runplane.client import Client

    client = Client(api_url, "bench")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for w in client.workers() if w.status in ("idle", "busy")) >= count:  # every page
            return
        time.sleep(0.2)
    raise RuntimeError(f"fewer than {count} workers up after {timeout:.0f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per round (default 200)")
    parser.add_argument("--workers", type=int, default=4, help="warm workers (default 4)")
    parser.add_argument("--slots", type=int, default=1, help="slots per worker (default 1)")
    parser.add_argument("--clients", type=int, default=8, help="threads submitting (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds (default 2)")
    add_dynamodb_option(parser)
    args = parser.parse_args()
    with tables_on(args.dynamodb):
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    parallel = args.workers * args.slots
    samples: dict[str, list[float]] = {"runplane": [], "cli": [], "sdk": []}
    with dev_stack(pools_yaml(args.workers, args.slots), AGENT_ARGS, wait_agents=True) as stack:
        bench = Throughput(stack.api_url, args.runs, parallel, args.clients)
        try:
            t0 = time.perf_counter()
            wait_workers(stack.api_url, args.workers)
            warm = Throughput(stack.api_url, parallel * 2, parallel, args.clients)
            warm.runplane(record=False)
            bench.template = warm.template
            print(f"{args.workers} workers x {args.slots} slots up and warm in {time.perf_counter() - t0:.1f}s")
            paths = [("runplane", bench.runplane), ("cli", bench.bare_cli), ("sdk", bench.bare_sdk)]
            for i in range(args.rounds):
                for label, path in paths[i % 3 :] + paths[: i % 3]:
                    samples[label].append(path())
                    print(f"  round {i + 1}: {label} {samples[label][-1]:.1f}s", flush=True)
        finally:
            shutil.rmtree(bench.scratch, ignore_errors=True)

    n = args.runs
    print(f"\n{n} trivial runs ({IMAGE}, sh -c true) on {args.workers} warm workers x {args.slots} slot(s)")
    print(f"  {'path':<52}  {'median s':>9}  {'runs/s':>7}")
    for label, name in (
        ("runplane", f"runplane: {args.clients} clients submit, until all final"),
        ("cli", f"docker run --rm --network none, {parallel} at a time"),
        ("sdk", f"docker SDK, same isolation, {parallel} at a time"),
    ):
        m = median(samples[label])
        print(f"  {name:<52}  {m:>9.2f}  {n / m:>7.1f}")
    rows = [("submit phase (all POSTs answered)", bench.submit_times), ("each run: submitted -> claimed", bench.waits)]
    table("within the runplane rounds", rows, unit="s", scale=1.0)
    print(
        f"\n  CPU-seconds per run (user + system): agents {median(bench.agent_cpu):.3f}, this process (the API, "
        f"the dispatcher) {median(bench.stack_cpu):.3f}, moto's server {median(bench.moto_cpu):.3f}, "
        f"dynalite {median(bench.tables_cpu):.3f}, "
        f"dockerd + containerd {median(bench.engine_cpu):.3f}"
    )
    print(f"  submit rate: {n / median(bench.submit_times):.1f} runs/s; p90 wait {p90(bench.waits):.1f}s")
    calls = bench.calls[-1]
    print(f"  moto requests per run: {sum(calls.values()):.1f}; by action (last round):")
    for action, count in sorted(calls.items(), key=lambda kv: -kv[1]):
        if count >= 0.05:
            print(f"    {action:<40} {count:6.2f}")
    ratio = median(samples["runplane"]) / median(samples["cli"])
    print(ratio_line(f"throughput_{n} (runplane / docker run, {parallel} at a time)", ratio, TARGET))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
