"""Upgrading a stack from the previous release (CHANGELOG.md names its commit) to this tree, in the
order the README gives: the functions first, then the agents; runs in flight keep going through
both steps.

The previous release is built from its commit in git history into a virtualenv of its own (its
wheel, installed with uv ``--offline`` from the cache ``scripts/setup.sh --test`` fills, as
tests/integration/test_packaging.py installs this tree's) and its programs run from there: its
local stack's functions (the API front, the dispatcher and the reaper, ``python -m
runplane.devstack``) and its worker agents. Both releases share one stack's stores (the moto server
of the test session) and one pools file that both read.

1. The previous functions and a previous agent: a run running, a run waiting on it, two runs
   queued in a pool with no worker yet.
2. The functions change: this tree's start on the same stores, and while both serve it (the
   overlap of a deploy) the previous ones list every worker (no pool given, a scan of what this
   tree keeps there too); then the previous ones are killed (as a deploy replaces them: nothing of
   them is left to tidy up). This tree's API lists the
   previous agent with its version, and its pools view counts it without refusing it (it is within
   the skew window); a run with a field added since the previous release (``labels``) is refused
   while the previous agent serves its pool. The running run ends on the previous agent and this
   tree's dispatcher releases the waiting one, which the previous agent runs; a run submitted now
   reaches the previous agent too. The queued runs gain a field of a later release (as the next
   upgrade's functions may write it), one beside its spec, the other in its spec too, and this
   tree's functions then write both specs back whole (a new priority): the field stays. An agent
   of this tree takes the first; the second, whose spec it does not understand, waits and says why.
3. The agents change: the previous agent is told to stop (SIGTERM) while it runs a run; an agent
   of this tree takes the next run meanwhile, and the previous agent finishes its run, then exits.
   With this release's agents alone in the pool, the run with labels is taken.

Every run succeeds but the one that waits for a later release's agent (killed at the end), and
their logs and outputs are read through this tree's API.

The stores are AWS's alone (moto). On DynamoDB a write of a run sets only the attributes it
changes, so a field beside the spec would survive any writer; the spec is written whole, which is
what the later field in it checks. The code that differs between the clouds is the stores': each
store's reading and writing of another release's records is covered on both clouds by the store
contract suites (tests/integration/contracts/test_future_records.py and test_previous_release.py);
what this test adds, the two releases' programs side by side, does not depend on the cloud, and
the previous release's Azure functions on Azurite would double the test's time in ``make test``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker.errors
import httpx
import pytest

from runplane import __version__
from runplane.bootstrap import aws_clients, aws_names, build_stack
from runplane.client import Client, InvalidRequest
from runplane.devstack.process import config_json
from runplane.devstack.stack import DevConfig, free_port
from runplane.services import skew
from runplane.settings import StackSettings
from tests.conftest import FAST, ROOT, TEST_IMAGE, wait_for
from tests.releases import CHANGELOG, Release, previous_release
from worker_agent.workdir import parse_mountinfo, read_mountinfo, unmount

pytestmark = pytest.mark.slow

UV = Path(sys.executable).with_name("uv")
PACKAGING = ROOT / ".venv" / "packaging"  # scripts/setup.sh --test fills it
RELEASES = ROOT / ".venv" / "releases"  # the previous releases' virtualenvs, once built
ADMIN_TOKEN = "upgrade-admin-token"
# Both releases read this pools file: the fields of the previous release only. No pool gets workers
# from the dispatcher (the test starts every agent itself); "old" runs one run at a time.
SHAPE = {"backend": "local", "cpus": 2, "memory": "1g", "disk": "2g", "max_workers": 0, "default_time": "5m"}
POOLS = {
    "pools": [
        {"name": name, "slots": slots, "default_image": TEST_IMAGE, **SHAPE} for name, slots in (("old", 1), ("new", 2))
    ]
}
# The previous release's agent flags (those of FAST it knows: a flag added since would stop it).
PREVIOUS_AGENT_FLAGS = ["--lease-seconds", "60", "--heartbeat-seconds", "2", "--poll-seconds", "1"]
PREVIOUS_AGENT_FLAGS += ["--kill-poll-seconds", "0.5", "--pull", "never", "--network-mode", "host"]
# A field of a later release, as DynamoDB holds it (a map: what is nested in it is kept too)
LATER_FIELD = "added_by_a_later_release"
LATER = {"M": {"kept": {"BOOL": True}, "note": {"S": "unknown to this release"}}}
# Runs the test holds running (through a change of functions or agents) wait for a file it makes in
# their working directory (/runplane/output, on the agent's host), then remove it.
GATE = "until [ -e go ]; do sleep 0.1; done; rm -f go; "


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without runplane's settings or Python's paths, plus ``extra``."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPLANE_", "PYTHON", "VIRTUAL_ENV"))}
    return {**keep, **extra}


def _uv(*args: str | Path) -> None:
    env = _clean_env(UV_CACHE_DIR=str(PACKAGING / "cache"), UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1")
    done = subprocess.run([str(UV), *map(str, args)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"uv {' '.join(map(str, args))} failed:\n{done.stderr[-4000:]}"


@dataclass(frozen=True)
class Installed:
    release: Release
    python: Path
    home: Path
    """A directory outside the checkout: its programs run there, so that ``python -m`` never finds
    this tree's packages in the working directory."""


def _build(commit: str, venv: Path, work: Path) -> None:
    """The release at ``commit`` (its wheel) with the ``local`` extra, in a new virtualenv ``venv``."""
    source, wheels = work / "source", work / "wheels"
    source.mkdir(parents=True)
    paths = ["pyproject.toml", "README.md", "runplane", "worker_agent", "functions"]
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, *paths], capture_output=True, check=True, timeout=60
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True, timeout=60)
    # an absolute path: pip reads a bare word as the name of a package to fetch
    wheel_of = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels)]
    built = subprocess.run([*wheel_of, str(source.resolve())], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-4000:]
    (wheel,) = wheels.glob("runplane-*.whl")
    _uv("venv", "-q", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    _uv("pip", "install", "-q", "--offline", "--python", python, "-c", PACKAGING / "constraints.txt", f"{wheel}[local]")


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The previous release of CHANGELOG.md, from its commit, in a virtualenv of its own with the
    ``local`` extra (its local stack and its agent). The virtualenv is kept in .venv/releases, under
    a name made of the commit, the packages' versions and this Python, for the next session (the
    only one kept)."""
    release = previous_release(CHANGELOG.read_text())
    assert release.commit is not None
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{release.commit}^{{commit}}"], check=False)
    if known.returncode != 0:
        pytest.fail(f"commit {release.commit} of release {release.version} is not in this clone's history")
    stamp = PACKAGING / "cache" / f".primed-{hashlib.sha256((ROOT / 'pyproject.toml').read_bytes()).hexdigest()[:12]}"
    if not stamp.exists() or not UV.exists():
        pytest.fail("the package cache is missing or older than pyproject.toml: run scripts/setup.sh --test")
    key = hashlib.sha256(
        b"\0".join([release.commit.encode(), (PACKAGING / "constraints.txt").read_bytes(), sys.version.encode()])
    ).hexdigest()[:16]
    venv = RELEASES / f"{release.version}-{key}"
    RELEASES.mkdir(parents=True, exist_ok=True)
    with (RELEASES / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building the same one: wait for it
        if not (venv / ".built").exists():
            for stale in RELEASES.iterdir():  # other releases', older packages', and a build that was stopped
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
            _build(release.commit, venv, tmp_path_factory.mktemp(f"release-{release.version}"))
            (venv / ".built").touch()
    python = venv / "bin" / "python"
    home = tmp_path_factory.mktemp("home")
    shown = subprocess.run(
        [str(python), "-c", "import runplane, worker_agent; print(runplane.__version__, runplane.__file__)"],
        cwd=home,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert shown[0] == release.version, f"the build of {release.commit} says it is {shown[0]}"
    assert Path(shown[1]).is_relative_to(venv), f"the previous release imported this tree's runplane: {shown[1]}"
    return Installed(release, python, home)


class Functions:
    """A local stack's functions (front, dispatcher, reaper) in a process of its own, started by
    ``command`` (``python -m runplane.devstack CONFIG_JSON``), which prints one JSON line once it
    serves."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out
            )
        assert self.proc.stdout is not None
        line, deadline = b"", time.monotonic() + 120
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.proc.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                self.kill()
                raise AssertionError(f"the stack did not come up:\n{log.read_text(errors='replace')[-4000:]}")
            line += chunk
        self.api_url: str = json.loads(line)["api_url"]

    def kill(self) -> None:
        """SIGKILL: gone at once, as a deploy replaces a function, leaving runs and workers as they are."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


class Agent:
    """A worker agent of ``python`` (either release's) serving ``pool`` of the stack in ``env``."""

    def __init__(self, python: Path, flags: list[str], pool: str, tmp: Path, cwd: Path, env: dict[str, str]) -> None:
        self.id = f"{pool}-{uuid.uuid4().hex[:6]}"
        self.work = tmp / "work" / self.id
        self.log = tmp / f"{self.id}.log"
        command = [str(python), "-m", "worker_agent", "--pool", pool, "--id", self.id, "--work-dir", str(self.work)]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([*command, *flags], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def open_gate(self, run_id: str) -> None:
        """Let ``run_id``, running on this agent behind GATE, go on."""
        found = wait_for(lambda: list(self.work.glob(f"**/runs/{run_id}-*/output")), 30, 0.1, f"{run_id}'s directory")
        (found[0] / "go").write_text("")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


Started = TypeVar("Started", Functions, Agent)


@pytest.fixture
def upgrade(previous: Installed, moto_endpoint: str, docker_client: Any, tmp_path: Path) -> Iterator[Any]:
    """What the test starts (stacks, agents) is stopped afterwards, with the containers of its agents."""
    prefix = f"up{uuid.uuid4().hex[:8]}"
    pools = tmp_path / "pools.json"
    pools.write_text(json.dumps(POOLS))
    stores = {"RUNPLANE_CLOUD": "aws", "RUNPLANE_PREFIX": prefix, "RUNPLANE_AWS_ENDPOINT_URL": moto_endpoint}
    env = _clean_env(**stores, RUNPLANE_POOLS=str(pools))
    started: list[Functions | Agent] = []
    settings = StackSettings(prefix=prefix, aws_endpoint_url=moto_endpoint, pools=str(pools))
    clients = aws_clients(settings)
    dynamodb, runs_table, stack = clients["dynamodb"], aws_names(settings).runs_table, build_stack(settings, clients)

    def keep(thing: Started) -> Started:
        started.append(thing)
        return thing

    def config(state: str) -> dict[str, Any]:
        """The local stack's settings, in the fields of the previous release's DevConfig."""
        return {
            "port": free_port(),
            "token": ADMIN_TOKEN,
            "user": "admin",
            "pools_file": str(pools),
            "cloud": "aws",
            "aws_endpoint_url": moto_endpoint,
            "prefix": prefix,
            "schedule_seconds": 1,
            "state_dir": str(tmp_path / state),
            "write_dev_file": False,
        }

    class Upgrade:
        previous_version = previous.release.version

        def previous_functions(self) -> Functions:
            command = [str(previous.python), "-m", "runplane.devstack", json.dumps(config("previous"))]
            return keep(Functions(command, previous.home, _clean_env(), tmp_path / "previous-functions.log"))

        def current_functions(self) -> Functions:
            settings = DevConfig(**{**config("current"), "state_dir": tmp_path / "current"})
            command = [sys.executable, "-m", "runplane.devstack", config_json(settings)]
            return keep(Functions(command, ROOT, _clean_env(), tmp_path / "current-functions.log"))

        def previous_agent(self, pool: str) -> Agent:
            return keep(Agent(previous.python, PREVIOUS_AGENT_FLAGS, pool, tmp_path, previous.home, env))

        def current_agent(self, pool: str) -> Agent:
            return keep(Agent(Path(sys.executable), FAST, pool, tmp_path, ROOT, env))

        def add_later_field(self, run_id: str, spec: bool) -> None:
            """LATER_FIELD on the run's item, and in its spec if ``spec``."""
            dynamodb.update_item(
                TableName=runs_table,
                Key={"id": {"S": run_id}},
                UpdateExpression="SET #later = :later" + (", #spec.#later = :later" if spec else ""),
                ExpressionAttributeNames={"#later": LATER_FIELD, **({"#spec": "spec"} if spec else {})},
                ExpressionAttributeValues={":later": LATER},
            )

        def stack_is_ours(self) -> bool:
            """Whether the record agents check their version against holds this tree's version."""
            record = skew.stack_record(stack.objects)
            return record is not None and record.version == __version__

        def stack_recorded(self) -> bool:
            """Whether a control plane has written the record agents check their version against."""
            return skew.stack_record(stack.objects) is not None

        def later_field(self, run_id: str) -> tuple[Any, Any]:
            """LATER_FIELD as the run's item and its spec hold it now."""
            item = dynamodb.get_item(TableName=runs_table, Key={"id": {"S": run_id}}, ConsistentRead=True)["Item"]
            return item.get(LATER_FIELD), item["spec"]["M"].get(LATER_FIELD)

    yield Upgrade()
    for thing in reversed(started):
        thing.stop()
    for agent in started:
        if isinstance(agent, Agent):
            for container in docker_client.containers.list(
                all=True, sparse=True, filters={"label": f"io.runplane.worker_id={agent.id}"}
            ):
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)
    _unmount_under(tmp_path / "work")


def _unmount_under(root: Path) -> None:
    """Remove the mounts under ``root``, where the agents the test stopped worked: one stopped
    while it ran a run (the test failed) leaves its mounts, and the previous release's agents take
    no lock that worker_agent.workdir.sweep_dead could check."""
    under = f"{root.resolve()}/"
    for mount in reversed(parse_mountinfo(read_mountinfo())):
        if mount.mount_point.startswith(under):
            with contextlib.suppress(OSError):
                unmount(Path(mount.mount_point))


def _submit(client: Client, command: str, queue: str, **more: Any) -> str:
    """A run submitted as any release's API takes it (its fields, nothing newer); returns its id."""
    return str(client.request("POST", "/v1/runs", {"command": command, "queue": queue, **more})["id"])


def _view(client: Client, run_id: str) -> dict[str, Any]:
    view: dict[str, Any] = client.request("GET", f"/v1/runs/{run_id}")
    return view


def _wait_state(client: Client, run_id: str, state: str, timeout: float, log: Path) -> dict[str, Any]:
    """The run's view once it is in ``state``; fails with the end of ``log`` (an agent's) if it ends
    otherwise or does not get there in ``timeout`` seconds."""
    last: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        last.update(_view(client, run_id))
        if last["state"] != state and last["state"] in ("succeeded", "failed", "killed", "timed_out"):
            raise AssertionError(f"run {run_id} ended {last['state']} ({last.get('failure')}), not {state}")
        return last if last["state"] == state else None

    try:
        found: dict[str, Any] = wait_for(reached, timeout, 0.2, f"run {run_id} to be {state}")
    except AssertionError as e:
        seen = {key: last.get(key) for key in ("state", "worker_id", "waiting_reason", "waiting_on")}
        raise AssertionError(f"{e}; it is {seen}\n{log.name}:\n{log.read_text(errors='replace')[-3000:]}") from None
    return found


def _agent_versions(client: Client) -> dict[str, str]:
    """Each live worker's agent version, as this tree's API lists workers."""
    listed = client.request("GET", "/v1/workers", query={"limit": 500})["workers"]
    return {worker["id"]: worker["agent_version"] for worker in listed if worker["status"] != "offline"}


def _pool_agents(client: Client) -> dict[str, tuple[dict[str, int], dict[str, str]]]:
    """Each pool's live agents by version and the workers it refuses, as this tree's API shows them."""
    pools = client.request("GET", "/v1/pools")["pools"]
    return {pool["name"]: (pool["agent_versions"], pool["refused_workers"]) for pool in pools}


def test_the_functions_then_the_agents_move_to_this_release_while_runs_go_on(upgrade: Any) -> None:
    old = upgrade.previous_functions()
    client = Client(old.api_url, ADMIN_TOKEN)
    first = upgrade.previous_agent("old")
    running = _submit(client, GATE + "echo one; echo one > one.txt", "old")
    waiting = _submit(client, "echo two", "old", after=[running])
    queued = _submit(client, "echo three", "new")
    future = _submit(client, "echo never", "new")
    _wait_state(client, running, "running", 60, first.log)
    assert (_view(client, waiting)["state"], _view(client, waiting)["waiting_on"]) == ("queued", [running])
    assert _view(client, queued)["state"] == "queued"

    # the functions change (this tree's serve before the previous ones go, as in a deploy); the runs go on
    new = upgrade.current_functions()
    wait_for(upgrade.stack_recorded, 30, 0.2, "this tree's functions to write the stack's record")
    # while both serve one stack, the previous functions still list every worker (no pool given)
    listed = httpx.get(f"{old.api_url}/v1/workers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    assert listed.status_code == 200, f"the previous functions listed workers: {listed.status_code} {listed.text}"
    assert [worker["id"] for worker in listed.json()["workers"]] == [first.id]
    old.kill()
    # the previous functions' last pass may have written their version over this tree's record:
    # this tree's next scheduled pass writes it back, before this tree's agents register
    wait_for(upgrade.stack_is_ours, 60, 0.2, "this tree's functions to write their version in the stack's record")
    client = Client(new.api_url, ADMIN_TOKEN)
    assert [_view(client, run)["state"] for run in (running, waiting, queued)] == ["running", "queued", "queued"]
    # runs the previous functions wrote gain a field of a later release: beside the spec, and in it
    upgrade.add_later_field(queued, spec=False)
    upgrade.add_later_field(future, spec=True)
    # this tree writes their specs back whole (a new priority): the later field must stay in the spec
    for run in (queued, future):
        assert client.request("POST", f"/v1/runs/{run}/priority", {"priority": 60})["priority"] == 60
    assert upgrade.later_field(future) == (LATER, LATER), "the later release's field was not kept in the spec"
    taker = upgrade.current_agent("new")
    later = _submit(client, "echo four", "old")
    wait_for(lambda: _agent_versions(client).get(taker.id), 30, 0.2, "this tree's agent to register")
    assert {first.id: upgrade.previous_version, taker.id: __version__}.items() <= _agent_versions(client).items()
    # the previous release's agents are within the skew window: counted, none refused
    agents = {"old": ({upgrade.previous_version: 1}, {}), "new": ({__version__: 1}, {})}
    wait_for(lambda: _pool_agents(client) == agents, 30, 0.5, f"the pools to show their agents as {agents}")
    # a field the previous agents cannot read is refused while one serves the pool
    # (secrets: a field of this release, on a stack the previous functions made, whose secrets table
    # and key this tree's functions add)
    client.set_secret("upgrade-token", "a value")
    refused = rf"secrets need agents .*; pool 'old' has agents {upgrade.previous_version}"
    with pytest.raises(InvalidRequest, match=refused):
        _submit(client, "echo secret", "old", secrets={"TOKEN": "upgrade-token"})
    first.open_gate(running)
    for run in (running, waiting, queued, later):
        _wait_state(client, run, "succeeded", 90, first.log)
    # a run whose spec holds a field this release does not know waits, and says why; nothing runs it
    assert (_view(client, future)["state"], _view(client, future)["worker_id"]) == ("queued", None)
    assert LATER_FIELD in _view(client, future)["waiting_reason"]

    # the agents change: the previous one finishes its run before it exits
    draining = _submit(client, GATE + "echo five", "old")
    _wait_state(client, draining, "running", 60, first.log)
    first.proc.send_signal(signal.SIGTERM)
    second = upgrade.current_agent("old")
    last = _submit(client, "echo six", "old")
    _wait_state(client, last, "succeeded", 60, second.log)
    assert (first.proc.poll(), _view(client, draining)["state"]) == (None, "running")
    first.open_gate(draining)
    assert first.proc.wait(60) == 0, first.log.read_text(errors="replace")[-3000:]
    _wait_state(client, draining, "succeeded", 60, first.log)
    # with this release's agents alone in the pool, a run with labels is taken
    agents = {"old": ({__version__: 1}, {}), "new": ({__version__: 1}, {})}
    wait_for(lambda: _pool_agents(client) == agents, 30, 0.5, f"the pools to show their agents as {agents}")
    labelled = _submit(client, "echo seven", "old", labels={"step": "agents"})
    assert _wait_state(client, labelled, "succeeded", 60, second.log)["spec"]["labels"] == {"step": "agents"}

    runs = (running, waiting, queued, later, draining, last, labelled)
    workers = {run: _view(client, run)["worker_id"] for run in runs}
    assert workers == {
        running: first.id,
        waiting: first.id,  # released by this release's dispatcher, run by the previous agent
        queued: taker.id,  # written by the previous functions, run by this release's agent
        later: first.id,  # written by this release's functions, run by the previous agent
        draining: first.id,
        last: second.id,
        labelled: second.id,
    }
    said = {run: client.logs(run).data for run in workers}
    assert said == {
        running: "one\n",
        waiting: "two\n",
        queued: "three\n",
        later: "four\n",
        draining: "five\n",
        last: "six\n",
        labelled: "seven\n",
    }
    (output,) = client.outputs(running)
    assert (output.path, httpx.get(output.url, timeout=30).text) == ("one.txt", "one\n")
    assert upgrade.later_field(queued) == (LATER, None), "the later release's field was not kept"
    assert client.request("POST", f"/v1/runs/{future}/kill")["state"] == "killed"
