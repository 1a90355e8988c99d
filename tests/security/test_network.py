"""Runs that ask for a network reach neither the cloud's metadata services nor the host, nor
each other, and send nothing to broadcast or multicast addresses.

Each test builds its own test hosts (RECIPES.md, "Test hosts in network namespaces"): a network
namespace holding 169.254.169.254, 169.254.170.2 and 169.254.170.23 (a stand-in metadata server
answers on port 80 and records UDP datagrams on port 9999) and addresses of its own, joined to a
Docker network the test makes on a veth it made. The run network's /24 is picked at random in
198.18.0.0/15 (a benchmarking range: neither private nor public) with an IPv6 /64 of the
documentation range 2001:db8::/32; the namespace's "other" addresses lie outside it, reached
through the network's gateway. A real agent process serves the "manual" pool of a fresh stack on
the moto server with that Docker network as its ``--network-mode``. Traffic stays in these
namespaces and on these links: never Docker's default bridge, nor a real address.
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
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services.dispatch import alive_workers, explain_wait
from runplane.services.logs import read_logs
from runplane.services.runs import kill_run, submit_run
from tests.conftest import POOLS_FILE, AgentProcess, wait_for

pytestmark = pytest.mark.docker

# argv: the address to serve HTTP on (and, optionally, a file to which each UDP datagram that
# arrives on port 9999, any address, is appended as a line)
SERVER = """
import http.server, socket, sys, threading
host = sys.argv[1]
family = socket.AF_INET6 if ":" in host else socket.AF_INET
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"stand-in metadata: iam/security-credentials/worker-role\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    address_family = family
    def server_bind(self):
        if family == socket.AF_INET6:  # IPv4 too
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
def record(family, address):
    s = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((address, 9999))
    while True:
        data = s.recv(512)
        with open(sys.argv[2], "a") as f:
            f.write(data.decode(errors="replace") + "\\n")
server = Server((host, 80), Handler)
if len(sys.argv) > 2:
    for args in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        threading.Thread(target=record, args=args, daemon=True).start()
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


LINK_LOCAL_SERVICES = ("169.254.169.254", "169.254.170.2", "169.254.170.23")
"""EC2 metadata, ECS task credentials, EKS Pod Identity: the stand-in answers on each (macvlan)."""


@dataclass
class StandIn:
    netns: str
    network: str  # the Docker network runs join
    n: int  # the run network is 198.18.n.0/24 (and, on macvlan, 2001:db8:n::/64)
    datagrams: Path  # what the stand-in received on UDP port 9999, a line each

    @property
    def prefix(self) -> str:
        return f"198.18.{self.n}"

    @property
    def gateway(self) -> str:
        """The run network's gateway: the namespace (macvlan), or this host's address (bridge)."""
        return f"{self.prefix}.1"

    @property
    def peer(self) -> str:
        """The namespace's own address on a bridge run network (a host on the runs' subnet)."""
        return f"{self.prefix}.7"

    @property
    def other(self) -> str:
        """An address of the test's namespace outside the run network, reached through its gateway:
        neither metadata nor the host's."""
        return f"198.19.{self.n}.7"

    @property
    def other6(self) -> str:
        return f"2001:db8:ffff:{self.n:x}::7"

    def received(self) -> list[str]:
        return self.datagrams.read_text().splitlines() if self.datagrams.exists() else []


@contextlib.contextmanager
def stand_in(docker_client, driver: str, tmp_path: Path) -> Iterator[StandIn]:
    """A namespace with the stand-in metadata server, on a new Docker network: ``macvlan`` on a
    veth into it (IPv4 and IPv6; the namespace is the runs' gateway), or a ``bridge`` whose
    gateway is this host's address and which the namespace joins by a veth (IPv4; this host
    routes the namespace's ``other`` address to it)."""
    tag = os.urandom(3).hex()
    netns, outer, inner = f"rpt-{tag}", f"rpt{tag}a", f"rpt{tag}b"
    bridge = f"rptbr{tag}"
    server = network = None
    n = 0
    sh("ip", "netns", "add", netns)
    try:
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", netns)
        for attempt in range(8):  # a /24 no other Docker network of this engine uses
            n = random.randint(0, 255)
            prefix = f"198.18.{n}"
            pools = [_pool(f"{prefix}.0/24", f"{prefix}.128/25", f"{prefix}.1")]
            if driver == "macvlan":
                pools.append(_pool(f"2001:db8:{n:x}::/64", None, f"2001:db8:{n:x}::1"))
            options = {"parent": outer} if driver == "macvlan" else {"com.docker.network.bridge.name": bridge}
            try:
                network = docker_client.networks.create(
                    f"rpt-{tag}-{driver}",
                    driver=driver,
                    options=options,
                    ipam=_ipam(pools),
                    enable_ipv6=driver == "macvlan",
                )
                break
            except docker.errors.APIError:  # that /24 is taken
                if attempt == 7:
                    raise
        host = StandIn(netns, network.name, n, tmp_path / f"datagrams-{tag}")
        if driver == "macvlan":
            # the runs' gateway is the namespace: what is not on the subnet is routed to it
            own = [f"{host.gateway}/24", f"{host.other}/32", *(f"{a}/32" for a in LINK_LOCAL_SERVICES)]
            own += [f"2001:db8:{n:x}::1/64", f"{host.other6}/128"]
        else:
            # the gateway is this host's address on the bridge; the namespace is a host on it
            own = [f"{host.peer}/24", f"{host.other}/32"]
            sh("ip", "link", "set", outer, "master", bridge)
        sh("ip", "link", "set", outer, "up")
        for address in own:
            sh("ip", "-n", netns, "addr", "add", address, "dev", inner, *(["nodad"] if ":" in address else []))
        sh("ip", "-n", netns, "link", "set", inner, "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        if driver == "bridge":
            sh("ip", "route", "add", f"{host.other}/32", "via", host.peer, "dev", bridge)
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-u", "-c", SERVER, "::", str(host.datagrams)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield host
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
        # The low-level list does not inspect each container, which would race with its removal.
        for container in docker_client.api.containers(all=True, quiet=True, filters={"network": network.id}):
            with contextlib.suppress(docker.errors.APIError):
                docker_client.api.remove_container(container["Id"], force=True)
        try:
            network.remove()
            return
        except docker.errors.APIError:  # a container is still leaving it
            time.sleep(0.1)
    network.remove()


def _pool(subnet: str, ip_range: str | None, gateway: str):
    from docker.types import IPAMPool

    return IPAMPool(subnet=subnet, iprange=ip_range, gateway=gateway)


def _ipam(pools):
    from docker.types import IPAMConfig

    return IPAMConfig(pool_configs=pools)


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


def submit(stack, command: str, network: bool, image: str | None = None, user: str = "alice") -> Run:
    spec = RunSpec(command=command, queue="manual", network=network, image=image)
    return submit_run(stack.ports, Principal(user=user), spec, None).run


def finished(stack, run: Run, timeout: float = 60) -> Run:
    return wait_for(lambda: (r := stack.store.get(run.id)).state.terminal and r, timeout, 0.1, f"run {run.id} to end")


def running(stack, run: Run, timeout: float = 60) -> Run:
    """The run once its command runs: its rules are in and its network connected."""
    return wait_for(
        lambda: (r := stack.store.get(run.id)).state == RunState.RUNNING and r, timeout, 0.1, f"run {run.id} to run"
    )


def stdout(stack, run: Run) -> str:
    return read_logs(stack.objects, run, "stdout", 0).data


def container_of(docker_client, run: Run):
    """The run's container, found as the agent finds it: by its labels (its name says nothing)."""
    (container,) = docker_client.containers.list(filters={"label": f"io.runplane.run_id={run.id}"})
    return container


def test_networked_run_reaches_neither_metadata_nor_ecs_credentials(
    docker_client, aws_stack, start_agent, early_image, tmp_path
):
    with stand_in(docker_client, "macvlan", tmp_path) as host:
        agent = start_agent("--network-mode", host.network)
        assert _worker(aws_stack, agent.id).network_refused is None, agent.log.read_text()[-2000:]
        # every link-local service, the run network's own subnet (here its gateway: a router's own
        # address is no destination of a run's), and what lies beyond the gateway, over IPv4 and 6
        targets = [*LINK_LOCAL_SERVICES, host.gateway, host.other, host.other6]
        run = finished(aws_stack, submit(aws_stack, PROBE.format(targets=" ".join(targets)), network=True))
        assert run.state == RunState.SUCCEEDED, run.failure
        assert stdout(aws_stack, run).splitlines() == [
            "169.254.169.254 blocked",
            "169.254.170.2 blocked",
            "169.254.170.23 blocked",
            f"{host.gateway} blocked",
            f"{host.other} reached",  # the network itself works: only the rules stop the others
            f"{host.other6} reached",  # IPv6 too, so neighbour discovery works
        ]
        assert run.usage.timings["network"] > 0  # how long is bench/network_cost.py's business
        # code of the run's own image that runs before the gate has no way out either
        early = finished(aws_stack, submit(aws_stack, "cat early.txt", network=True, image=early_image))
        assert early.state == RunState.SUCCEEDED, early.failure
        assert stdout(aws_stack, early) == "blocked\n"
    log = agent.log.read_text()
    assert f"get Docker network {host.network}, closed off from metadata and this host" in log


# Sent from inside a run's network namespace: one UDP datagram "to LABEL" per argument LABEL=ADDRESS
# (an IPv6 multicast address is sent out of eth0), with SO_BROADCAST, as any run may set it.
SENDER = """
import socket, sys
for arg in sys.argv[1:]:
    label, address = arg.split("=")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    target = (address, 9999, 0, socket.if_nametoindex("eth0")) if family == socket.AF_INET6 else (address, 9999)
    try:
        s.sendto(f"to {label}".encode(), target)
        print(label, "sent")
    except OSError as e:
        print(label, "refused:", e)
"""


def test_networked_run_sends_nothing_to_broadcast_or_multicast(docker_client, aws_stack, start_agent, tmp_path):
    """Host services bound to 0.0.0.0 or :: hear broadcast and multicast: a run's are dropped."""
    with stand_in(docker_client, "macvlan", tmp_path) as host:
        agent = start_agent("--network-mode", host.network)
        assert _worker(aws_stack, agent.id).network_refused is None, agent.log.read_text()[-2000:]
        run = running(aws_stack, submit(aws_stack, "sleep 60", network=True))
        pid = container_of(docker_client, run).attrs["State"]["Pid"]
        targets = {
            "subnet-broadcast": f"{host.prefix}.255",
            "broadcast": "255.255.255.255",
            "all-hosts": "224.0.0.1",
            "all-nodes": "ff02::1",
            "gateway": host.gateway,
            "other": host.other,  # controls: what is not closed arrives
            "other6": host.other6,
        }
        sent = subprocess.run(
            ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-I", "-S", "-c", SENDER]
            + [f"{label}={address}" for label, address in targets.items()],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert sent.returncode == 0, sent.stderr
        wait_for(lambda: len(host.received()) >= 2, 10, 0.1, "the controls to arrive")
        time.sleep(0.5)  # anything sent with them has arrived by now
        assert sorted(host.received()) == ["to other", "to other6"], sent.stdout
        kill_run(aws_stack.ports, Principal(user="alice"), run.id)
        assert finished(aws_stack, run).state == RunState.KILLED


def test_networked_runs_reach_neither_each_other_nor_each_others_run_ids(
    docker_client, aws_stack, start_agent, tmp_path
):
    """On a network where Docker does not keep containers apart (macvlan), bob's run listens on a
    port; alice's run cannot reach it, and Docker's DNS tells her its name, which holds no run id."""
    with stand_in(docker_client, "macvlan", tmp_path) as host:
        agent = start_agent("--network-mode", host.network, "--slots", "2")
        assert _worker(aws_stack, agent.id).network_refused is None, agent.log.read_text()[-2000:]
        listening = "while true; do echo secret-of-bob | nc -l -p 8080; done"
        bobs = running(aws_stack, submit(aws_stack, listening, network=True, user="bob"))
        container = container_of(docker_client, bobs)
        address = container.attrs["NetworkSettings"]["Networks"][host.network]["IPAddress"]

        def from_outside() -> bool:
            """Bob's port answers from beyond the gateway (the namespace's other address)."""
            script = (
                "import socket, sys; "
                f"c = socket.create_connection(('{address}', 8080), timeout=3, source_address=('{host.other}', 0)); "
                "sys.exit(b'secret-of-bob' not in c.recv(100))"
            )
            probe = ["ip", "netns", "exec", host.netns, sys.executable, "-I", "-c", script]
            return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0

        wait_for(from_outside, 20, 0.2, "bob's run to listen")
        probe = (
            f"if timeout 5 nc {address} 8080 </dev/null | grep -q secret; then echo port reached; "
            "else echo port blocked; fi; "
            f"echo == reverse; nslookup {address} 2>&1; echo == forward; nslookup {container.name} 2>&1"
        )
        alices = finished(aws_stack, submit(aws_stack, probe, network=True))
        assert alices.state == RunState.SUCCEEDED, alices.failure
        seen = stdout(aws_stack, alices)
        assert seen.splitlines()[0] == "port blocked", seen
        reverse, forward = seen.split("== reverse\n", 1)[1].split("== forward\n")
        # Docker's DNS on the run network works under the rules, and names bob's container ...
        assert f"name = {container.name}.{host.network}" in reverse, seen
        assert f"Address: {address}" in forward, seen
        # ... by a name that says nothing of his run
        assert bobs.id not in seen and bobs.id.removeprefix("r-") not in seen, seen
        wait_for(from_outside, 10, 0.2, "bob's port to answer again")  # it was open all along
        assert bobs.id not in container.name
        kill_run(aws_stack.ports, Principal(user="bob"), bobs.id)
        assert finished(aws_stack, bobs).state == RunState.KILLED


def test_networked_run_on_a_bridge_does_not_reach_the_host(docker_client, aws_stack, start_agent, tmp_path):
    with stand_in(docker_client, "bridge", tmp_path) as host:
        agent = start_agent("--network-mode", host.network)
        assert _worker(aws_stack, agent.id).network_refused is None, agent.log.read_text()[-2000:]
        listener = subprocess.Popen(  # a service of the host's, on its address on the bridge only
            [sys.executable, "-c", SERVER, host.gateway],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
            targets = f"{host.gateway} {host.peer} {host.other}"
            run = finished(aws_stack, submit(aws_stack, PROBE.format(targets=targets), True))
        finally:
            listener.kill()
            listener.wait(10)
        assert run.state == RunState.SUCCEEDED, run.failure
        assert stdout(aws_stack, run).splitlines() == [
            f"{host.gateway} blocked",  # this host
            f"{host.peer} blocked",  # a host on the runs' own subnet (another run, say)
            f"{host.other} reached",  # through the gateway, beyond the subnet
        ]


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
            host = stack.enter_context(stand_in(docker_client, "macvlan", tmp_path))
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
        workers = alive_workers(aws_stack.ports, "manual")
        reason = explain_wait(aws_stack.pools.get("manual"), workers, waiting.waiting_reason, None, waiting)
        assert reason == f"no live worker of pool manual takes runs that ask for a network: {worker.network_refused}"
        assert "runs that ask for a network are refused: " + why in agent.log.read_text()
        kill_run(aws_stack.ports, Principal(user="alice"), networked.id)
