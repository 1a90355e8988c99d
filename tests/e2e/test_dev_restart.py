"""``runplane dev`` on its default cloud (local: SQLite and files in its state dir) keeps what it
had across a restart: users and tokens, quotas, finished runs with their logs and outputs, and
queued runs and sweeps, which run once it is back; ``--fresh`` starts it empty. Its directory and
files are its own (0700/0600), and an object URL it signs downloads through its front while an
altered one is refused.

Each start is a stack in a process of its own (DevStackProcess), stopped as Ctrl-C stops it."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runplane.client import Client
from runplane.client.errors import ApiError
from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig, free_port
from runplane.domain.states import RunState
from tests.conftest import AGENT_ARGS, TEST_IMAGE, sweep_agent_mounts

pytestmark = pytest.mark.slow

POOLS = """pools:
  - {{name: default, backend: local, cpus: 2, memory: 2g, disk: 5g, max_workers: 1, idle_seconds: 30,
     default_image: {image}}}
  - {{name: parked, backend: local, cpus: 2, memory: 2g, disk: 5g, max_workers: {parked},
     idle_seconds: 30, default_image: {image}}}
"""


@pytest.fixture
def dev(tmp_path: Path, docker_client: Any) -> Iterator[Any]:
    """``dev(parked=0, fresh=False)``: a local-cloud stack on ``tmp_path``'s state dir (the same
    port each time, so the same stack directory), up; the one before is stopped first."""
    port, state = free_port(), tmp_path / "dev"
    running: list[DevStackProcess] = []

    def start(parked: int = 0, fresh: bool = False) -> DevStackProcess:
        for before in running:
            before.stop()
        pools = tmp_path / f"pools-{parked}.yaml"
        pools.write_text(POOLS.format(image=TEST_IMAGE, parked=parked))
        config = DevConfig(
            port=port,
            state_dir=state,
            pools_file=str(pools),
            agent_args=AGENT_ARGS,
            schedule_seconds=1,
            write_dev_file=False,
            fresh=fresh,
        )
        stack = DevStackProcess(config, tmp_path / "dev.log")
        running.append(stack)
        stack.start()
        return stack

    yield start
    for stack in running:
        stack.stop()
    sweep_agent_mounts(state)


def test_a_restart_keeps_every_record_and_runs_what_was_queued_and_fresh_starts_empty(dev, tmp_path):
    first = dev()
    admin = Client(first.api_url, first.token)
    alice = Client(first.api_url, admin.create_token("alice", groups=["vision"]).token)
    admin.set_quota("alice", max_running=3, gpu_hours=12.5)
    done = alice.submit("echo hello from before; echo 42 > answer", name="done").wait(120)
    assert done.state == RunState.SUCCEEDED, done.failure
    queued = alice.submit("echo queued ran > q", queue="parked", name="queued")
    sweep = alice.submit_sweep("echo $I", parameters={"I": [1, 2]}, queue="parked", sweep_name="kept")
    assert queued.refresh().state == RunState.QUEUED

    second = dev(parked=1)  # the same stack directory; the parked pool gets a worker now

    assert second.token == first.token  # the admin token is kept with the stack
    admin, alice = Client(second.api_url, second.token), Client(second.api_url, alice.token)
    assert alice.me().groups == ["vision"]
    quota = admin.quota("alice")
    assert (quota.max_running, quota.gpu_hours) == (3, 12.5)
    kept = alice.get(done.id)
    assert (kept.state, kept.logs()) == (RunState.SUCCEEDED, "hello from before\n")
    (output,) = kept.outputs()
    download = httpx.get(output.url)
    assert (download.status_code, download.content) == (200, b"42\n")
    assert download.headers["content-disposition"].startswith("attachment")
    altered = httpx.get(output.url.replace("/answer?", "/answe?").replace("signature=", "signature=0"))
    assert altered.status_code == 403 and b"42" not in altered.content
    # what was queued when the stack stopped runs now
    ran = alice.get(queued.id).wait(120)
    assert ran.state == RunState.SUCCEEDED, ran.failure
    assert [f.path for f in ran.outputs()] == ["q"]
    finished = alice.sweep(sweep.id).wait(timeout=120)
    assert (finished.name, sorted(m.state for m in finished.members())) == ("kept", [RunState.SUCCEEDED] * 2)

    third = dev(fresh=True)

    fresh = Client(third.api_url, third.token)
    assert third.token != first.token
    assert list(fresh.runs(owner="alice")) == []
    with pytest.raises(ApiError) as refused:
        Client(third.api_url, alice.token).me()
    assert refused.value.status == 401


def test_the_stack_directory_and_its_files_are_its_own(dev, tmp_path):
    stack = dev()
    client = Client(stack.api_url, stack.token)
    run = client.submit("echo secret > out; echo logged", name="private").wait(120)
    assert run.state == RunState.SUCCEEDED, run.failure
    home = next((tmp_path / "dev").iterdir())

    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    files = [home / "state.db", home / "admin-token", *(p for p in (home / "objects").rglob("*") if p.is_file())]
    assert len(files) > 3, "no log or output was written: the check would miss them"
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (p for p in (home / "objects").rglob("*") if p.is_dir()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
