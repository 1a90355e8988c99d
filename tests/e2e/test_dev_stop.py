"""``runplane dev`` stopped by Ctrl-C (SIGINT) or SIGTERM while runs go: within ten seconds the
process has exited, every running run is recorded killed because the local stack stopped (by its
agent, which stops its container), a queued one stays queued for the next start, and nothing of
the stack is left: no agent process, no run container, no work dir mount.

The real CLI runs as a process of its own, with a HOME of its own (it writes its dev.json there).
On its default cloud (local) the records stay in its state dir, read back after it has exited.
On Azure it uses the test session's Azurite (``--azure-connection``), so the records are read back
from there; there it also runs its demo run first (``--demo``, as `make dev` does)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.bootstrap import build_stack
from runplane.cli.dev import dashboard_link
from runplane.client import Client
from runplane.devstack.stack import free_port
from runplane.domain.runs import Run
from runplane.domain.states import FailureReason, RunState
from runplane.settings import StackSettings, parse_connection_string
from tests.conftest import wait_for
from worker_agent.container_spec import container_labels
from worker_agent.workdir import parse_mountinfo, read_mountinfo, sweep_dead

pytestmark = pytest.mark.slow

RUNPLANE = Path(sys.executable).with_name("runplane")
STOPPED = "the local stack stopped"
STOP_DEADLINE = 10.0  # what `runplane dev` promises: stopped within ten seconds of the signal


@dataclass
class Dev:
    """A `runplane dev` process and what it said about itself."""

    proc: subprocess.Popen[bytes]
    log: Path
    state: Path
    """Its stack's directory (agents' records and work dirs)."""
    client: Client | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_dev(tmp_path: Path, docker_client: Any) -> Iterator[Any]:
    """``start_dev(*args)``: `runplane dev` with ``args``, up and serving. Whatever a failing test
    leaves (the process, agents, containers, mounts) is removed afterwards."""
    started: list[Dev] = []

    def start(*args: str) -> Dev:
        home, port = tmp_path / "home", free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
        # loopback only: runs asking for a network are refused, not given a bridge; no pulls
        env |= {"HOME": str(home), "RUNPLANE_AGENT_NETWORK_MODE": "host", "RUNPLANE_AGENT_PULL": "never"}
        log = tmp_path / f"dev-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(RUNPLANE), "dev", "--port", str(port), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                # started as a script's background job is: with SIGINT ignored, which Python keeps
                # unless told otherwise; SIGINT must stop it all the same
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
            )
        dev = Dev(proc, log, home / ".runplane" / "dev" / str(port))
        started.append(dev)
        dev_file = home / ".runplane" / "dev.json"

        def up() -> dict[str, str] | None:
            assert proc.poll() is None, f"runplane dev exited {proc.returncode}:\n{dev.output()[-3000:]}"
            try:
                return json.loads(dev_file.read_text())  # type: ignore[no-any-return]
            except (OSError, ValueError):
                return None

        found = wait_for(up, 120, 0.2, "runplane dev to serve")
        dev.client = Client(found["api_url"], found["token"])
        # the dashboard's link, which signs in with the token in its fragment
        wait_for(lambda: "UI " in dev.output(), 10, 0.05, "runplane dev to print its lines")
        assert f"UI     {dashboard_link(found['api_url'], found['token'])}\n" in dev.output()
        return dev

    yield start
    for dev in started:
        if dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait()
        for pid, _ in agents_of(dev.state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda dev=dev: not agents_of(dev.state), 30, 0.1, "the killed agents to be gone")
        workers = worker_ids(dev.state)
        # a sparse listing: other tests' containers may go between a listing and an inspect
        listed = docker_client.containers.list(all=True, sparse=True, filters={"label": "io.runplane.worker_id"})
        for container in listed:
            if container_labels(container).get("io.runplane.worker_id") in workers:
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)
        if (dev.state / "agents").exists():
            sweep_dead(dev.state / "agents")


def worker_ids(state: Path) -> set[str]:
    """The workers the stack's local backend launched (each has a log there, live or ended)."""
    return {path.stem for path in (state / "workers").glob("*/*.log")}


def agents_of(state: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every live worker agent whose work dir is under ``state``: the
    stack's agents (their command lines name neither the stack nor its port; their environment
    does)."""
    work_dir = f"RUNPLANE_AGENT_WORK_DIR={state / 'agents'}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        alive = stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        if alive and work_dir in environ and "worker_agent" in cmdline:
            found.append((int(proc.name), cmdline))
    return found


def mounts_under(state: Path) -> list[str]:
    return [m.mount_point for m in parse_mountinfo(read_mountinfo()) if m.mount_point.startswith(f"{state}/")]


def stop_with(dev: Dev, sig: signal.Signals) -> int:
    """Send ``sig`` and wait for the process to exit; fails if it has not within STOP_DEADLINE."""
    dev.proc.send_signal(sig)
    try:
        return dev.proc.wait(STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"runplane dev did not exit within {STOP_DEADLINE:g} s of {sig.name}:\n{dev.output()[-3000:]}")


@dataclass
class Going:
    running: str
    queued: str
    stack_id: str


def runs_going(dev: Dev, docker_client: Any) -> Going:
    """A run sleeping in its container and one that stays queued (no worker has its tag)."""
    assert dev.client is not None
    running = dev.client.submit("sleep 600", name="sleeper")
    queued = dev.client.submit("sleep 600", name="waiter", tag="nobody-has-this-tag")

    def is_running() -> bool:
        assert not running.refresh().done, f"run {running.id} ended {running.state}: {running.failure}"
        return running.state == RunState.RUNNING

    wait_for(is_running, 120, 0.2, f"run {running.id} to run")
    assert queued.refresh().state == RunState.QUEUED
    containers = docker_client.containers.list(filters={"label": f"io.runplane.run_id={running.id}"})
    assert len(containers) == 1, "the running run has no container"
    assert agents_of(dev.state), "no agent of the stack was found: the scan would miss them"
    assert mounts_under(dev.state), "no work dir mount was found: the scan would miss them"
    return Going(running.id, queued.id, containers[0].labels["io.runplane.stack"])


def assert_nothing_left(dev: Dev, going: Going, docker_client: Any) -> None:
    assert agents_of(dev.state) == []
    assert docker_client.containers.list(all=True, filters={"label": f"io.runplane.stack={going.stack_id}"}) == []
    assert mounts_under(dev.state) == []


def test_ctrl_c_kills_the_runs_and_leaves_nothing_behind_even_when_pressed_twice(start_dev, docker_client):
    dev = start_dev("--fresh")
    assert "  fresh  emptied first: " in dev.output() and "the admin token above is a new one" in dev.output()
    going = runs_going(dev, docker_client)
    dev.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "stopping:" in dev.output(), STOP_DEADLINE, 0.05, "runplane dev to start stopping")

    assert stop_with(dev, signal.SIGINT) == 0  # the impatient second Ctrl-C

    assert_nothing_left(dev, going, docker_client)
    said = dev.output()
    assert "still stopping" in said
    assert f"stopping 1 active run(s): {going.running}" in said
    assert "Traceback" not in said
    # the agent that held the run recorded its end (its log is kept in the stack's directory)
    agent_logs = "".join(path.read_text() for path in (dev.state / "workers").glob("*/*.log"))
    assert f"run {going.running} ended killed" in agent_logs
    store = build_stack(StackSettings(cloud="local", state_dir=str(dev.state))).store
    assert_stopped(store.get(going.running))
    assert store.get(going.queued).state == RunState.QUEUED  # it runs at the next start


def test_sigterm_records_every_run_killed_on_an_existing_azure_storage(start_dev, docker_client, azurite):
    dev = start_dev("--azure-connection", azurite, "--demo")
    # --demo (what `make dev` runs): one run, followed to its end, with its output named
    wait_for(lambda: "; outputs: " in dev.output(), 120, 0.1, "the demo run to end")
    said = dev.output()
    demo = re.search(r"^demo run (r-[0-9a-f]+)$", said, re.MULTILINE)
    assert demo is not None, said[-3000:]
    assert "hello from runplane\n" in said and "demo run succeeded; outputs: answer\n" in said
    assert dev.client is not None
    run = dev.client.get(demo.group(1))
    assert (run.state, [f.path for f in run.outputs()]) == (RunState.SUCCEEDED, ["answer"])
    going = runs_going(dev, docker_client)

    assert stop_with(dev, signal.SIGTERM) == 0

    assert_nothing_left(dev, going, docker_client)
    key = parse_connection_string(azurite)["AccountKey"]
    assert "AccountKey=***" in dev.output() and key not in dev.output()
    store = build_stack(StackSettings(cloud="azure", azure_storage_connection_string=azurite)).store
    assert_stopped(store.get(going.running))
    assert store.get(going.queued).state == RunState.QUEUED


def assert_stopped(run: Run) -> None:
    assert run.state == RunState.KILLED
    assert run.failure is not None and run.failure.reason == FailureReason.KILLED
    assert STOPPED in run.failure.message
    assert run.finished_at is not None
