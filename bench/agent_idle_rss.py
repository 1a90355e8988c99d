"""Resident memory of an idle worker agent, with a bare ``import boto3, docker`` for reference.

Starts the embedded local stack (moto in-process, provisioned tables, queues and bucket) with a
pool that launches no workers (``max_workers: 0``), then starts one agent itself, as the local
backend would: ``python -m worker_agent --pool default --pull never`` with the stack's
environment and default timings. Once the agent's worker record is in the registry (it writes it
at start-up, before it waits on the queue) and a settling pause has passed, its RSS (VmRSS from
/proc, its child processes included; it has none) is sampled every 0.5 s for 10 s while it long-
polls the empty queue and heartbeats.

For reference, the same is measured for a bare ``python -c "import boto3, docker; ..."``; then one
fresh interpreter does what the agent does at start-up, step by step, printing how much RSS each
step adds. MB here are MiB (2**20 bytes).

The last line is ``RESULT agent_idle_rss: <median> MB (target < 80 MB)``.

    python bench/agent_idle_rss.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, dev_stack, median, table

TARGET_MB = 80
POOLS_YAML = (
    "pools: [{name: default, backend: local, cpus: 2, memory: 4g, max_workers: 0, "
    "default_image: runplane/test-busybox:1}]\n"
)
SAMPLE_SECONDS = 0.5
SETTLE_SECONDS = 2.0
BASELINE = "import boto3, docker, time; print('ready', flush=True); time.sleep(30)"
# What ``python -m worker_agent`` does before it waits on the queue, one step at a time.
STEPS = """
import os, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
last = rss()
def step(label):
    global last
    now = rss()
    print(f"{label}\\t{now - last:.2f}\\t{now:.2f}", flush=True)
    last = now
step("interpreter")
import worker_agent.main
step("import worker_agent.main (logging, urllib.request + ssl)")
import docker
step("import docker (requests, urllib3)")
import runplane.bootstrap
step("import runplane.bootstrap (pydantic, runplane.domain.runs)")
import worker_agent.agent, worker_agent.executor
step("import worker_agent.agent + executor")
client = docker.from_env(max_pool_size=64); client.ping()
step("docker.from_env() + ping")
import boto3, botocore
step("import boto3")
stack = runplane.bootstrap.build_stack()
step("build_stack() (DynamoDB, SQS, S3 clients, a boto3 session each)")
stack.workers.list()
stack.queue.receive("default", 1, 0, 10)
step("first DynamoDB and SQS calls")
"""
# The same three clients built as build_stack() does (a boto3 session each) vs from one session.
CLIENTS = """
import sys
from runplane.adapters.aws.clients import AwsConfig, make_client
import boto3
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
config = AwsConfig(endpoint_url="http://127.0.0.1:9")
before = rss()
session = boto3.session.Session(region_name=config.region) if sys.argv[1] == "shared" else None
clients = [make_client(name, config, session=session) for name in ("dynamodb", "sqs", "s3")]
print(f"{rss() - before:.2f}")
"""


def rss_mb(pid: int) -> float | None:
    """VmRSS of ``pid`` and all its descendants, in MiB; None once ``pid`` is gone."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            if p == pid:
                return None
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return total / 1024


def sample(pid: int, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = rss_mb(pid)
        if value is None:
            raise RuntimeError(f"process {pid} exited while being sampled")
        out.append(value)
        time.sleep(SAMPLE_SECONDS)
    return out


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure_agent(tmp: Path, seconds: float, env: dict[str, str]) -> tuple[list[float], float]:
    from runplane import bootstrap
    from runplane.domain.errors import NotFound

    worker_id = "bench-rss"
    log_path = tmp / "agent.log"
    command = [
        sys.executable,
        "-m",
        "worker_agent",
        "--pool",
        "default",
        "--pull",
        "never",
        "--id",
        worker_id,
        "--work-dir",
        str(tmp / "agent"),
    ]
    t0 = time.perf_counter()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        registry = bootstrap.stack().workers
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                registry.get(worker_id)
                break
            except NotFound:
                pass
            if time.perf_counter() - t0 > 30:
                raise RuntimeError("agent did not register within 30 s")
            time.sleep(0.1)
        registered = time.perf_counter() - t0
        time.sleep(SETTLE_SECONDS)
        samples = sample(proc.pid, seconds)
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited with {proc.returncode}")
    finally:
        stop(proc)
    return samples, registered


def measure_baseline() -> list[float]:
    proc = subprocess.Popen([sys.executable, "-c", BASELINE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("baseline interpreter did not start")
        time.sleep(0.5)
        return sample(proc.pid, 3.0)
    finally:
        stop(proc)


def import_steps() -> list[tuple[str, float, float]]:
    out = subprocess.run([sys.executable, "-c", STEPS], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        print(f"  (start-up steps failed: {out.stderr.strip()[-500:]})")
        return []
    rows = []
    for line in out.stdout.splitlines():
        label, delta, total = line.split("\t")
        rows.append((label, float(delta), float(total)))
    return rows


def clients_reference() -> dict[str, float]:
    out: dict[str, float] = {}
    for mode in ("own", "shared"):
        run = subprocess.run(
            [sys.executable, "-c", CLIENTS, mode], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        if run.returncode == 0:
            out[mode] = float(run.stdout.strip())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to sample the idle agent (default 10)")
    args = parser.parse_args()
    with dev_stack(POOLS_YAML) as stack:
        agent, registered = measure_agent(
            stack.config.state_dir.parent, args.seconds, {**os.environ, **stack.environment}
        )
        print(
            f"agent registered {registered:.2f}s after launch; sampled {len(agent)} times "
            f"every {SAMPLE_SECONDS:g}s after {SETTLE_SECONDS:g}s more"
        )
        baseline = measure_baseline()
        steps = import_steps()
        clients = clients_reference()

    table(
        "resident memory (VmRSS, children included)",
        [("idle agent (python -m worker_agent)", agent), ('bare python -c "import boto3, docker"', baseline)],
        unit="MB",
        scale=1.0,
    )
    extra = median(agent) - median(baseline)
    print(f"  idle agent max {max(agent):.1f} MB; agent - bare imports {extra:.1f} MB (medians)")
    if steps:
        width = max(len(label) for label, _, _ in steps)
        print("\nwhat the agent's start-up adds, step by step (one fresh interpreter, one pass)")
        print(f"  {'step':<{width}}  {'+MB':>7}  {'RSS MB':>7}")
        for label, delta, total in steps:
            print(f"  {label:<{width}}  {delta:>7.1f}  {total:>7.1f}")
    if len(clients) == 2:
        print(
            f"  for reference, DynamoDB+SQS+S3 clients via make_client: {clients['own']:.1f} MB with a session "
            f"each, {clients['shared']:.1f} MB from one shared session (as build_stack does)"
        )
    print(f"RESULT agent_idle_rss: {median(agent):.1f} MB (target < {TARGET_MB} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
