"""``runplane serve`` restarted keeps everything and stops nothing: after a clean stop (SIGTERM)
every record, log, output, token, quota and sweep is back, the queued run runs, and the run that
was running finishes under its agent without a new attempt; after a SIGKILL mid-sweep nothing
recorded as done is lost and every member ends in one state; ``serve backup`` copies the state
while the service runs.

The real CLI runs as a process of its own on a state directory of the test's, with one local pool;
its agents outlive it (that is the point), so the fixture ends them and removes their containers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.bootstrap import build_stack
from runplane.client import Client
from runplane.devstack.stack import free_port
from runplane.domain.states import RunState
from runplane.settings import StackSettings
from tests.conftest import TEST_IMAGE, wait_for
from worker_agent.workdir import sweep_dead

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RUNPLANE = Path(sys.executable).with_name("runplane")
POOLS = f"""pools:
  - name: default
    backend: local
    cpus: 2
    memory: 2g
    disk: 5g
    slots: 2
    max_workers: 1
    idle_seconds: 600
    default_image: {TEST_IMAGE}
    default_time: 10m
"""
TERMINAL = {RunState.SUCCEEDED, RunState.FAILED, RunState.KILLED, RunState.TIMED_OUT}


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Serve:
    """``runplane serve`` on one state directory and port, started and restarted by the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.port = free_port()
        self.pools = tmp_path / "pools.yaml"
        self.pools.write_text(POOLS)
        self.started: list[Service] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
        # loopback only: no bridge for runs, no pulls; a HOME of its own (nothing of the user's is read)
        self.env = env | {
            "HOME": str(tmp_path / "home"),
            "RUNPLANE_AGENT_NETWORK_MODE": "host",
            "RUNPLANE_AGENT_PULL": "never",
        }

    def start(self) -> Service:
        log = self.tmp / f"serve-{len(self.started)}.log"
        where = ["--state-dir", str(self.state), "--listen", f"127.0.0.1:{self.port}", "--pools", str(self.pools)]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(RUNPLANE), "serve", *where],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self.env,
            )
        service = Service(proc, log, f"http://127.0.0.1:{self.port}")
        self.started.append(service)

        def up() -> bool:
            assert proc.poll() is None, f"runplane serve exited {proc.returncode}:\n{service.output()[-3000:]}"
            return "runplane is serving" in service.output()

        wait_for(up, 120, 0.1, "runplane serve to serve")
        return service

    def agents(self) -> list[int]:
        """The pids of the live agents the service launched (their pid records, in the state dir)."""
        pids = []
        for record in (self.state / "workers").glob("*/*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                pid = json.loads(record.read_text())["pid"]
                stat = Path(f"/proc/{pid}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    pids.append(int(pid))
        return pids

    def worker_ids(self) -> set[str]:
        return {path.stem for path in (self.state / "workers").glob("*/*.log")}


@pytest.fixture
def serve(tmp_path: Path, docker_client: Any) -> Iterator[Serve]:
    """A ``Serve``; afterwards nothing of it is left: the service, its agents (which outlive it),
    their runs' containers and their work dirs' mounts."""
    it = Serve(tmp_path)
    yield it
    for service in it.started:
        if service.proc.poll() is None:
            service.proc.kill()
            service.proc.wait()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in it.agents():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not it.agents(), 15, 0.1, "the agents to exit")
    assert not it.agents(), "an agent of the service outlived the test"
    for worker_id in it.worker_ids():  # sparse, by label: other tests' containers come and go meanwhile
        label = f"io.runplane.worker_id={worker_id}"
        for container in docker_client.containers.list(all=True, sparse=True, filters={"label": label}):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
    if (it.state / "agents").exists():
        sweep_dead(it.state / "agents")


def admin_token(service: Service) -> str:
    (line,) = [line for line in service.output().splitlines() if line.strip().startswith("token ")]
    return line.split()[1]


def stop(service: Service, sig: signal.Signals) -> int:
    service.proc.send_signal(sig)
    try:
        return service.proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"runplane serve did not exit within 30 s of {sig.name}:\n{service.output()[-3000:]}")


def outputs(run: Any) -> dict[str, str]:
    return {f.path: urllib.request.urlopen(f.url, timeout=10).read().decode() for f in run.outputs()}


def until(run: Any, state: RunState, timeout: float = 120) -> Any:
    def there() -> bool:
        run.refresh()
        assert run.state == state or not run.done, f"run {run.id} ended {run.state}: {run.failure}"
        return run.state == state

    wait_for(there, timeout, 0.2, f"run {run.id} to be {state}")
    return run


def test_a_restart_keeps_every_record_and_the_running_run_finishes_without_a_new_attempt(serve):
    first = serve.start()
    token = admin_token(first)
    admin = Client(first.url, token)
    alice_token = admin.create_token("alice").token
    alice = Client(first.url, alice_token)
    admin.set_quota("alice", max_running=3)
    finished = alice.submit("echo hello; echo 42 > answer", name="finished").wait(timeout=120)
    assert finished.state == RunState.SUCCEEDED, finished.failure
    sweep = alice.submit_sweep('echo "x=$X" > point', parameters={"X": [1, 2]}).wait(timeout=120)
    assert sweep.view.counts == {"succeeded": 2}, sweep.view
    running = until(alice.submit("sleep 6; echo done", name="running"), RunState.RUNNING)
    queued = alice.submit("echo later > later", name="queued", after=[running])  # released by the service
    assert queued.refresh().state == RunState.QUEUED
    agents = serve.agents()
    assert agents

    assert stop(first, signal.SIGTERM) == 0

    # stopped, it left the runs going: the agent lives and the run is still running, unrepeated
    assert serve.agents() == agents
    second = serve.start()
    assert "token  rp_" not in second.output()  # a restart makes no admin token
    assert "runplane token create --direct" in second.output()
    admin, alice = Client(second.url, token), Client(second.url, alice_token)
    # every record, log and output is there
    assert "alice" in {t.user for t in admin.tokens()}
    assert admin.quota("alice").max_running == 3
    again = alice.get(finished.id)
    assert (again.state, again.logs(), outputs(again)) == (RunState.SUCCEEDED, "hello\n", {"answer": "42\n"})
    swept = alice.sweep(sweep.id)
    assert swept.view.counts == {"succeeded": 2}
    assert sorted(outputs(m)["point"] for m in swept.members()) == ["x=1\n", "x=2\n"]
    # the running run finishes under the agent that had it, at attempt 1
    ran = alice.get(running.id).wait(timeout=120)
    assert ran.state == RunState.SUCCEEDED, ran.failure
    assert (ran.view.attempt, ran.view.worker_id) == (1, running.view.worker_id)
    assert ran.logs() == "done\n"
    # and the queued one runs
    later = alice.get(queued.id).wait(timeout=120)
    assert later.state == RunState.SUCCEEDED, later.failure
    assert outputs(later) == {"later": "later\n"}
    assert "Traceback" not in first.output() + second.output()


def test_a_sigkill_mid_sweep_loses_nothing_done_and_a_backup_taken_while_it_runs_holds_the_runs(serve, tmp_path):
    first = serve.start()
    admin = Client(first.url, admin_token(first))
    sweep = admin.submit_sweep('sleep 1; echo "$I" > i', parameters={"I": list(range(8))})

    def some_done() -> list[Any] | None:
        members = list(admin.members(sweep.id))
        done = [m for m in members if m.state == RunState.SUCCEEDED]
        return done if len(done) >= 2 and len(done) < 8 else None

    done_before = {m.id: (m.view.attempt, outputs(m)) for m in wait_for(some_done, 120, 0.2, "two members done")}

    assert stop(first, signal.SIGKILL) == -signal.SIGKILL

    second = serve.start()
    admin = Client(second.url, admin_token(first))
    # a backup while the service runs (and its agents write): the copy opens and holds the runs
    dest = tmp_path / "backup"
    copied = subprocess.run(
        [str(RUNPLANE), "serve", "backup", str(dest), "--state-dir", str(serve.state)],
        capture_output=True,
        text=True,
        timeout=60,
        env=serve.env,
    )
    assert copied.returncode == 0, copied.stderr
    assert oct(dest.stat().st_mode & 0o777) == "0o700"
    copy = build_stack(StackSettings(cloud="local", state_dir=str(dest)))
    for run_id in done_before:
        assert copy.store.get(run_id).state == RunState.SUCCEEDED

    finished = admin.sweep(sweep.id).wait(timeout=180, poll=0.5)
    members = list(finished.members())
    assert len(members) == 8
    assert {m.state for m in members} <= TERMINAL
    assert sum(finished.view.counts.values()) == 8
    assert finished.view.counts == {"succeeded": 8}, finished.view
    for member in members:
        if member.id in done_before:  # what was recorded done is still done, as it was
            assert (member.view.attempt, outputs(member)) == done_before[member.id]
        assert outputs(member)["i"] == f"{member.view.sweep_index}\n"
    assert "Traceback" not in second.output()
