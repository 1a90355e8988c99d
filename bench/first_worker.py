"""Submit -> first worker registered, on a pool with no worker, for the local and Slurm backends.

The embedded local stack runs with one pool per backend (``min_workers: 0``). Each round starts
with no worker alive, submits a trivial run, and times until ``GET /v1/workers`` shows a live
worker of the pool (the agent's first heartbeat); the run then finishes and the worker exits
when idle before the next round. Along the way: API -> events queue -> dispatcher -> backend
launch (a process, or an sbatch job that Slurm schedules) -> the agent starts and registers.

The baseline for each backend is the bare start underneath it, timed the same way (until the
started process has written a line): a ``python -c`` process that imports nothing of ours, and
an ``sbatch --wrap`` job of the same shape on the same Slurm. RATIO is stack / bare for local;
the Slurm figure is printed as RESULT.

Slurm is started with scripts/start-slurm.sh if needed (as root); without Slurm only local runs.

    python bench/first_worker.py [--n 5] [--backend local|slurm|both]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, dev_stack, median, ratio_line, table

from runplane.domain.states import TERMINAL_STATES

IMAGE = "runplane/test-busybox:1"
AGENT_ARGS = "--poll-seconds 1 --heartbeat-seconds 1 --lease-seconds 10"
POOLS_YAML = f"""pools:
  - {{name: local, backend: local, cpus: 1, memory: 1g, max_workers: 1, idle_seconds: 2, default_image: '{IMAGE}'}}
  - {{name: slurm, backend: slurm, cpus: 1, memory: 1g, max_workers: 1, idle_seconds: 2, default_image: '{IMAGE}'}}
"""
POLL = 0.02


def live_worker(client, pool: str) -> bool:
    return any(
        w["pool"] == pool and w["status"] != "offline"
        for w in client.request("GET", "/v1/workers", query={"pool": pool})["workers"]
    )


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(POLL)
    raise SystemExit(f"timed out waiting for {what}")


def stack_round(client, pool: str) -> float:
    wait(lambda: not live_worker(client, pool), 60, f"the {pool} workers to exit")
    t0 = time.perf_counter()
    run = client.request("POST", "/v1/runs", {"command": "true", "queue": pool})
    wait(lambda: live_worker(client, pool), 120, f"a {pool} worker to register")
    elapsed = time.perf_counter() - t0
    wait(lambda: client.request("GET", f"/v1/runs/{run['id']}")["state"] in TERMINAL_STATES, 120, "the run to end")
    return elapsed


def bare_process(scratch: Path) -> float:
    marker = scratch / f"p-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    subprocess.Popen([sys.executable, "-c", f"open({str(marker)!r}, 'w').write('up')"])
    wait(marker.exists, 30, "the bare process")
    return time.perf_counter() - t0


def bare_sbatch(scratch: Path) -> float:
    marker = scratch / f"s-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    subprocess.run(
        ["sbatch", "--parsable", "--cpus-per-task=1", "--mem=1G", f"--output={scratch}/slurm-%j.out",
         "--wrap", f"echo up > {marker}"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    wait(marker.exists, 120, "the bare sbatch job")
    return time.perf_counter() - t0


def ensure_slurm() -> bool:
    if shutil.which("sbatch") is None and os.geteuid() != 0:
        return False
    done = subprocess.run([str(ROOT / "scripts" / "start-slurm.sh")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f"Slurm not available, skipping it:\n{done.stderr[-500:]}")
        return False
    os.environ["SLURM_CONF"] = done.stdout.strip().splitlines()[-1]
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--backend", choices=["local", "slurm", "both"], default="both")
    args = parser.parse_args()
    backends = ["local", "slurm"] if args.backend == "both" else [args.backend]
    if "slurm" in backends and not ensure_slurm():
        backends.remove("slurm")
    scratch = Path(tempfile.mkdtemp(prefix="runplane-bench-first-", dir="/tmp"))
    scratch.chmod(0o777)
    samples: dict[str, list[float]] = {}
    with dev_stack(POOLS_YAML, agent_args=AGENT_ARGS, wait_agents=True, schedule_seconds=1.0) as stack:
        from runplane.client import Client

        client = Client(stack.api_url, "bench")
        for backend in backends:
            stack_round(client, backend)  # warm up: images, imports, Slurm's first job
            for _ in range(args.n):
                samples.setdefault(f"{backend}: submit -> worker registered", []).append(stack_round(client, backend))
                bare = bare_process(scratch) if backend == "local" else bare_sbatch(scratch)
                samples.setdefault(f"{backend}: bare start (baseline)", []).append(bare)
    shutil.rmtree(scratch, ignore_errors=True)
    table("submit -> first worker registered (pool with no worker)", list(samples.items()), unit="s", scale=1.0)
    if "local" in backends:
        local = median(samples["local: submit -> worker registered"])
        base = median(samples["local: bare start (baseline)"])
        print(f"RESULT first_worker_local: {local:.2f} s median")
        print(ratio_line("first_worker_local", local / base, 40.0))
    if "slurm" in backends:
        slurm = median(samples["slurm: submit -> worker registered"])
        base = median(samples["slurm: bare start (baseline)"])
        print(f"RESULT first_worker_slurm: {slurm:.2f} s median (bare sbatch job started: {base:.2f} s)")


if __name__ == "__main__":
    main()
