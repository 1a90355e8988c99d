"""Small helpers shared by the benchmark scripts: the local stack, percentiles, a table, the RATIO line."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runplane.devstack.stack import DevStack

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/<name>.py` from anywhere
    sys.path.insert(0, str(ROOT))

from runplane.devstack.stack import free_port as stack_free_port  # noqa: E402


def local_aws_env() -> None:
    """Credentials and region for the local AWS APIs (moto); nothing here reaches AWS."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )


free_port = stack_free_port  # one place picks a free loopback port
DYNAMODB_ENDPOINT = "RUNPLANE_DYNAMODB_ENDPOINT_URL"
"""Where ``tables_on`` says the tables are; ``dev_stack`` hands it to its stack's settings."""
_ON_AWS: list[bool] = []
"""Set inside ``tables_on``: the stacks ``dev_stack`` starts there are the AWS local stack's."""


def agent_pids() -> list[int]:
    """Process ids of the worker agents the running stack's local backend has started."""
    from runplane import bootstrap

    stack = bootstrap.stack()
    return [
        int(job.detail["pid"])
        for pool in stack.pools.pools
        if pool.backend == "local"
        for job in stack.backend(pool).list(pool)
    ]


def wait_exit(pids: Sequence[int], timeout: float = 10.0) -> None:
    """Wait (at most ``timeout`` seconds in all) until each process is gone or a zombie."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                break
            if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                break
            time.sleep(0.05)


@contextlib.contextmanager
def dev_stack(
    pools_yaml: str, agent_args: str = "", token: str = "bench", wait_agents: bool = False, **config: Any
) -> Iterator[DevStack]:
    """The embedded local stack on a free port with ``pools_yaml``, started; stopped on exit.

    Sets the local AWS credentials, quiets werkzeug, and keeps the pools file and the stack's
    state in a temp dir (``stack.config.state_dir.parent``, free for the script's own files too)
    that is removed on exit. ``config`` goes to ``DevConfig`` as is (``schedule_seconds=...``).
    With ``wait_agents`` the exit also waits until the agent processes the local backend started
    (which ``stop`` only signals) have exited, so none is left running into the next benchmark.
    """
    local_aws_env()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from runplane.devstack.stack import DevConfig, DevStack

    tmp = Path(tempfile.mkdtemp(prefix="runplane-bench-"))
    try:
        pools_file = tmp / "pools.yaml"
        pools_file.write_text(pools_yaml)
        tables = os.environ.get(DYNAMODB_ENDPOINT)  # set by tables_on
        if _ON_AWS:  # a benchmark of the cloud path (--dynamodb): the AWS local stack
            config.setdefault("cloud", "aws")
        if tables:
            config["settings"] = {"dynamodb_endpoint_url": tables, **config.get("settings", {})}
        stack = DevStack(
            DevConfig(
                port=free_port(),
                token=token,
                write_dev_file=False,
                pools_file=str(pools_file),
                agent_args=agent_args,
                state_dir=tmp / "state",
                **config,
            )
        )
        t0 = time.perf_counter()
        stack.start()
        print(f"stack up in {time.perf_counter() - t0:.2f}s: api {stack.api_url}, {stack.services} {stack.endpoint}")
        try:
            yield stack
        finally:
            agents = agent_pids() if wait_agents else []
            stack.stop()
            wait_exit(agents)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def dynalite(work: Path) -> Iterator[str]:
    """A dynalite of this script's own on a free loopback port (scripts/start-dynalite.sh, which
    installs it into .dynalite/ first if needed), stopped on exit; yields its endpoint."""
    state = work / "dynalite"
    done = subprocess.run(
        [str(ROOT / "scripts" / "start-dynalite.sh"), str(state)],
        env={**os.environ, "DYNALITE_PORT": "0"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"dynalite did not start (or run with --dynamodb moto):\n{done.stderr}")
    pid = int((state / "dynalite.pid").read_text())
    try:
        yield done.stdout.strip().splitlines()[-1]
    except BaseException:  # whether it still runs, and what it said: a benchmark that fails on it shows both
        alive = Path(f"/proc/{pid}").exists()
        tail = (state / "dynalite.log").read_text(errors="replace")[-3000:] if (state / "dynalite.log").exists() else ""
        print(f"dynalite (pid {pid}) {'is running' if alive else 'has exited'}; its log ends:\n{tail}", file=sys.stderr)
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def add_dynamodb_option(parser: Any) -> None:
    """``--dynamodb dynalite|moto``: where a benchmark's tables are (see ``tables_on``)."""
    parser.add_argument(
        "--dynamodb",
        choices=("dynalite", "moto"),
        default="dynalite",
        help="where the tables are (default dynalite: moto's queries read whole tables, see bench/README.md)",
    )


@contextlib.contextmanager
def tables_on(where: str) -> Iterator[None]:
    """The stacks ``dev_stack`` starts inside are the AWS local stack's (moto), not the embedded
    default: with ``where`` "dynalite" they keep their DynamoDB tables on a dynalite of their own
    (``RUNPLANE_DYNAMODB_ENDPOINT_URL``), their queues and bucket on moto; with "moto" all on moto."""
    _ON_AWS.append(True)
    try:
        if where != "dynalite":
            yield
            return
        with tempfile.TemporaryDirectory(prefix="runplane-bench-") as work, dynalite(Path(work)) as endpoint:
            os.environ[DYNAMODB_ENDPOINT] = endpoint
            try:
                yield
            finally:
                os.environ.pop(DYNAMODB_ENDPOINT, None)
    finally:
        _ON_AWS.pop()


def p90(samples: Sequence[float]) -> float:
    """The 90th percentile (nearest rank), so small samples still give an observed value."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def table(title: str, rows: Sequence[tuple[str, Sequence[float]]], unit: str = "ms", scale: float = 1000.0) -> None:
    """Print ``label  n  median  p90`` rows; samples are in seconds, shown in ``unit``."""
    width = max(len(label) for label, _ in rows)
    print(f"\n{title}")
    print(f"  {'path':<{width}}  {'n':>4}  {'median ' + unit:>12}  {'p90 ' + unit:>12}")
    for label, samples in rows:
        if not samples:
            print(f"  {label:<{width}}  {0:>4}  {'-':>12}  {'-':>12}")
            continue
        print(f"  {label:<{width}}  {len(samples):>4}  {median(samples) * scale:>12.2f}  {p90(samples) * scale:>12.2f}")


def ratio_line(name: str, ratio: float, target: float, op: str = "<=") -> str:
    """``op`` is ``<=`` for a slowdown (lower is better), ``>=`` for a throughput ratio."""
    return f"RATIO {name}: {ratio:.2f}x (target {op} {target:g})"


def bare_container(
    docker_client: Any,
    run: Any,
    image: str,
    scratch: Path,
    name: str | None = None,
    labels: dict[str, str] | None = None,
) -> tuple[int, list[float]]:
    """The baseline for a run: create + start + wait + remove of its container with the very
    kwargs the agent uses (``container_spec``: user, cores, limits, capabilities, mounts), a fresh
    output directory included. Returns the exit status and the times [begin, created, started,
    exited, removed] (``time.perf_counter``)."""
    from worker_agent.executor import ExecutorConfig, container_spec
    from worker_agent.resources import Allocator, host_cpus

    res = run.spec.resources
    config = ExecutorConfig(worker_id="bench-bare", work_dir=scratch)
    allocation = Allocator(list(host_cpus())).allocate("bare", res.cpus, res.gpus)
    marks = [time.perf_counter()]
    mount = Path(tempfile.mkdtemp(dir=scratch))
    os.chown(mount, 65534, 65534)  # as the agent does: the run's own directory, 0700
    kwargs = container_spec(run, image, config, mount, allocation)
    if name is not None:
        kwargs["name"] = name
    if labels is not None:
        kwargs["labels"] = labels
    container = docker_client.containers.create(**kwargs)
    marks.append(time.perf_counter())
    try:
        container.start()
        marks.append(time.perf_counter())
        status = container.wait()
        marks.append(time.perf_counter())
    finally:
        container.remove(force=True)
    marks.append(time.perf_counter())
    shutil.rmtree(mount, ignore_errors=True)
    return int(status["StatusCode"]), marks
