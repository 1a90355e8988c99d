"""Runs that ask for a network reach neither the cloud's metadata service nor the host.

Each test builds its own test hosts (RECIPES.md, "Test hosts in network namespaces"): a network
namespace holding 169.254.169.254 and 169.254.170.2 (a stand-in metadata server answers on port
80) and an address of its own, joined to a Docker network the test makes on a veth it made,
with a link-local /24 picked at random. A real agent process serves the "manual" pool of a fresh
stack on the moto server with that Docker network as its ``--network-mode``. Traffic stays in
these namespaces and on these links: never Docker's default bridge, nor a real address.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import pytest

from runplane.adapters.aws.sqs import pool_queue_name
from runplane.domain.models import Principal, Run, RunSpec, RunState
from runplane.services.dispatch import alive_workers, explain_wait
from runplane.services.logs import read_logs
from runplane.services.runs import kill_run, submit_run
from tests.conftest import POOLS_FILE, AgentProcess, wait_for

pytestmark = pytest.mark.docker

SERVER = """
import http.server
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"stand-in metadata: iam/security-credentials/worker-role\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", 80), Handler)
print("ready", flush=True)
server.serve_forever()
"""
# One line per address: "ADDRESS reached" when the stand-in answered, else "ADDRESS blocked".
PROBE = (
    "for target in {targets}; do "
    "if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 $target 80 2>/dev/null | grep -q stand-in; "
    'then echo "$target reached"; else echo "$target blocked"; fi; done'
)


# A user's image runs its own /bin/sh before anything of the agent's: this one tries to reach the
# stand-in metadata server for two seconds before the gate, then writes what it saw to early.txt.
EARLY_SH = """#!/bin/busybox sh
if [ ! -e early.txt ]; then
  seen=blocked
  end=$(( $(date +%s) + 2 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 1 169.254.169.254 80 2>/dev/null | grep -q stand-in; then
      seen=reached
      break
    fi
  done
  echo "$seen" > early.txt
fi
exec /bin/busybox sh "$@"
"""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


@dataclass
class StandIn:
    netns: str
    network: str  # the Docker network runs join
    prefix: str  # its link-local /24, e.g. "169.254.57"

    @property
    def other(self) -> str:
        """An address of the test's namespace that is neither metadata nor the host's."""
        return f"{self.prefix}.7"


@contextlib.contextmanager
def stand_in(docker_client, driver: str) -> Iterator[StandIn]:
    """A namespace with the stand-in metadata server, on a new Docker network (``macvlan`` on a
    veth into it, or a ``bridge`` whose gateway is this host's address and which the namespace
    joins by a veth)."""
    tag = os.urandom(3).hex()
    netns, outer, inner = f"rpt-{tag}", f"rpt{tag}a", f"rpt{tag}b"
    bridge = f"rptbr{tag}"
    server = network = None
    sh("ip", "netns", "add", netns)
    try:
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", netns)
        for attempt in range(8):  # a /24 no other Docker network of this engine uses
            prefix = f"169.254.{random.randint(32, 160)}"
            options = {"parent": outer} if driver == "macvlan" else {"com.docker.network.bridge.name": bridge}
            gateway = f"{prefix}.1"
            try:
                network = docker_client.networks.create(
                    f"rpt-{tag}-{driver}",
                    driver=driver,
                    options=options,
                    ipam=_ipam(f"{prefix}.0/24", f"{prefix}.128/25", gateway),
                )
                break
            except docker.errors.APIError:  # that /24 is taken
                if attempt == 7:
                    raise
        if driver == "macvlan":
            # the runs' gateway is the namespace: metadata addresses are routed to it
            own = [f"{gateway}/24", f"{prefix}.7/24", "169.254.169.254/32", "169.254.170.2/32"]
        else:
            # the gateway is this host's address on the bridge; the namespace is a host on it
            own = [f"{prefix}.7/24"]
            sh("ip", "link", "set", outer, "master", bridge)
        sh("ip", "link", "set", outer, "up")
        for address in own:
            sh("ip", "-n", netns, "addr", "add", address, "dev", inner)
        sh("ip", "-n", netns, "link", "set", inner, "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-u", "-c", SERVER],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield StandIn(netns, network.name, prefix)
    finally:
        if server is not None:
            server.kill()
            server.wait(10)
        if network is not None:
            _remove_network(docker_client, network)
        subprocess.run(["ip", "link", "del", outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def _remove_network(docker_client, network) -> None:
    """Remove the network and what is still on it (an agent may be removing it at the same time)."""
    for _ in range(50):
        for container in docker_client.containers.list(all=True, filters={"network": network.id}):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        try:
            network.remove()
            return
        except docker.errors.APIError:  # a container is still leaving it
            time.sleep(0.1)
    network.remove()


def _ipam(subnet: str, ip_range: str, gateway: str):
    from docker.types import IPAMConfig, IPAMPool

    return IPAMConfig(pool_configs=[IPAMPool(subnet=subnet, iprange=ip_range, gateway=gateway)])


@pytest.fixture
def early_image(docker_client) -> Iterator[str]:
    """The test image with EARLY_SH as its /bin/sh (made by commit: no build, no network)."""
    tag = f"runplane/test-early-sh:{os.urandom(3).hex()}"
    base = docker_client.containers.create("runplane/test-busybox:1", ["true"], network_mode="none")
    try:
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            info = tarfile.TarInfo("sh")
            info.size, info.mode = len(EARLY_SH), 0o755
            tar.addfile(info, io.BytesIO(EARLY_SH.encode()))
        base.put_archive("/bin", data.getvalue())
        base.commit(*tag.split(":"))
    finally:
        base.remove(force=True)
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.fixture
def start_agent(aws_stack, tmp_path):
    """``start_agent(*flags, env=...)``: an agent process on this test's stack, pool "manual"."""
    started: list[AgentProcess] = []
    env = {
        **os.environ,
        "RUNPLANE_CLOUD": "aws",
        "RUNPLANE_PREFIX": aws_stack.settings.prefix,
        "RUNPLANE_AWS_ENDPOINT_URL": aws_stack.settings.aws_endpoint_url or "",
        "RUNPLANE_POOLS": str(POOLS_FILE),
    }

    def start(*flags: str, path: str | None = None) -> AgentProcess:
        agent = AgentProcess(tmp_path, "--idle-seconds", "60", *flags, env={**env, "PATH": path or env["PATH"]})
        started.append(agent)
        wait_for(lambda: _worker(aws_stack, agent.id), 30, 0.1, f"agent {agent.id} to register")
        return agent

    yield start
    for agent in started:
        agent.stop()


def _worker(stack, worker_id):
    return next((w for w in stack.workers.list("manual") if w.id == worker_id), None)


def _in_flight(stack) -> int:
    """Messages of the "manual" queue that a worker received and has not deleted."""
    sqs = stack.queue.client
    url = sqs.get_queue_url(QueueName=pool_queue_name(stack.settings.prefix, "manual"))["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessagesNotVisible"])


def submit(stack, command: str, network: bool, image: str | None = None) -> Run:
    spec = RunSpec(command=command, queue="manual", network=network, image=image)
    return submit_run(stack.store, stack.queue, stack.pools, Principal(user="alice"), spec, None, time.time).run


def finished(stack, run: Run, timeout: float = 60) -> Run:
    return wait_for(lambda: (r := stack.store.get(run.id)).state.terminal and r, timeout, 0.1, f"run {run.id} to end")


def stdout(stack, run: Run) -> str:
    return read_logs(stack.objects, run, "stdout", 0).data


def test_networked_run_reaches_neither_metadata_nor_ecs_credentials(docker_client, aws_stack, start_agent, early_image):
    with stand_in(docker_client, "macvlan") as host:
        agent = start_agent("--network-mode", host.network)
        assert _worker(aws_stack, agent.id).network_refused is None, agent.log.read_text()[-2000:]
        targets = f"169.254.169.254 169.254.170.2 {host.other}"
        run = finished(aws_stack, submit(aws_stack, PROBE.format(targets=targets), network=True))
        assert run.state == RunState.SUCCEEDED, run.failure
        assert stdout(aws_stack, run).splitlines() == [
            "169.254.169.254 blocked",
            "169.254.170.2 blocked",
            f"{host.other} reached",  # the network itself works: only the rule stops the others
        ]
        assert run.usage.timings["network"] < 1
        # code of the run's own image that runs before the gate has no way out either
        early = finished(aws_stack, submit(aws_stack, "cat early.txt", network=True, image=early_image))
        assert early.state == RunState.SUCCEEDED, early.failure
        assert stdout(aws_stack, early) == "blocked\n"
    log = agent.log.read_text()
    assert f"get Docker network {host.network}, closed off from metadata and this host" in log


def test_networked_run_on_a_bridge_does_not_reach_the_host(docker_client, aws_stack, start_agent):
    with stand_in(docker_client, "bridge") as host:
        agent = start_agent("--network-mode", host.network)
        assert _worker(aws_stack, agent.id).network_refused is None, agent.log.read_text()[-2000:]
        gateway = f"{host.prefix}.1"  # this host's own address on the bridge
        listener = subprocess.Popen(  # a service of the host's, on that address only
            [sys.executable, "-c", SERVER.replace('"0.0.0.0", 80', f'"{gateway}", 80')],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
            run = finished(aws_stack, submit(aws_stack, PROBE.format(targets=f"{gateway} {host.other}"), True))
        finally:
            listener.kill()
            listener.wait(10)
        assert run.state == RunState.SUCCEEDED, run.failure
        assert stdout(aws_stack, run).splitlines() == [f"{gateway} blocked", f"{host.other} reached"]


def _path_without_nft(tmp_path: Path) -> str:
    """A PATH with what the agent may call (nsenter) but not nft."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nsenter").symlink_to(shutil.which("nsenter") or "/usr/bin/nsenter")
    return str(tools)


@pytest.mark.parametrize("case", ["host-mode", "no-nft"])
def test_an_agent_that_cannot_contain_a_network_takes_no_networked_runs(
    case, docker_client, aws_stack, start_agent, tmp_path
):
    with contextlib.ExitStack() as stack:
        if case == "host-mode":
            agent = start_agent("--network-mode", "host")
            why = "--network-mode host puts runs on the host's own network"
        else:
            host = stack.enter_context(stand_in(docker_client, "macvlan"))
            agent = start_agent("--network-mode", host.network, path=_path_without_nft(tmp_path))
            why = "nft (nftables) is not installed on this worker"
        networked = submit(aws_stack, "echo reached the network", network=True)
        wait_for(
            lambda: _in_flight(aws_stack) == 1 or aws_stack.store.get(networked.id).state != RunState.QUEUED,
            30,
            0.1,
            "the agent to receive the networked run's hint",
        )
        # the agent handles what it received before it polls again: once the plain run is done,
        # it has decided about the networked one
        plain = submit(aws_stack, "echo no network needed", network=False)
        done = finished(aws_stack, plain)
        assert done.state == RunState.SUCCEEDED and stdout(aws_stack, done) == "no network needed\n"
        waiting = aws_stack.store.get(networked.id)
        assert waiting.state == RunState.QUEUED and waiting.worker_id is None  # not taken
        worker = _worker(aws_stack, agent.id)
        assert worker.network_refused and worker.network_refused.startswith(why), worker.network_refused
        workers = alive_workers(aws_stack.workers, "manual", time.time(), aws_stack.settings.worker_stale_seconds)
        reason = explain_wait(aws_stack.pools.get("manual"), workers, waiting.waiting_reason, None, waiting)
        assert reason == f"no live worker of pool manual takes runs that ask for a network: {worker.network_refused}"
        assert "runs that ask for a network are refused: " + why in agent.log.read_text()
        kill_run(aws_stack.store, Principal(user="alice"), networked.id, time.time)
