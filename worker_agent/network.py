"""Networked runs: a Docker network of the agent's own, from which neither the cloud's metadata
services (all of link-local), the host's own addresses, the run network's own subnet (other runs),
nor broadcast and multicast addresses can be reached.

The guarantee does not depend on what the Docker network is (a bridge, macvlan, ...): the agent
installs nftables rules (netrules.py) *inside the run's own network namespace* that reject
traffic to those addresses, and the run has no CAP_NET_ADMIN, so it cannot take them out. Docker makes the
namespace only when it starts the container, and what runs first in it is the run's image (even
its /bin/sh is the user's), so the container is created without a network (``none``: loopback
only); once it runs, the agent installs the rules in its namespace and only then connects it to
the run network. Nothing in the container ever has a route out before its rules are in.

So that the command does not start before it has its network, it waits behind a gate: the shell
first blocks reading a FIFO mounted read-only, and the agent writes one line to it once the
network is connected. If the agent fails before that, the command never starts and the container
is removed. (The gate is for readiness; the rules and the late connect are what keep runs out.)

At start the agent checks the whole path once (netcheck.py) with a probe container on the same network (same
steps, the pool's image): if the rules cannot be installed, a metadata address answers from inside,
or the gate does not hold, the agent takes no runs that ask for a network, and says why.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from worker_agent.containers import explain
from worker_agent.netrules import CLOSED, METADATA, read_dns_servers, read_host_addresses, ruleset

log = logging.getLogger(__name__)

PROBES = (
    ("169.254.169.254", 80),
    ("169.254.170.2", 80),
    ("168.63.129.16", 80),
    ("168.63.129.16", 32526),
    ("fd00:ec2::254", 80),
)
GATE_MOUNT = "/runplane/net"
GATE = f"{GATE_MOUNT}/go"
GATE_EXIT = 125
"""The exit status of a container whose gate was closed without letting its command start."""
GATE_FIRST_PAUSE, GATE_LONGEST_PAUSE = 0.001, 0.05
"""Until the shell waits at its gate, the agent looks again after 1 ms, 2, 4, ... at most 50 ms."""
WRAPPER = (
    f"read -r _ < {GATE} || {{ echo 'runplane: the network of this run was not made safe; "
    f'its command did not start\' >&2; exit {GATE_EXIT}; }}; exec "$@"'
)
"""Put before a networked container's own entrypoint: ``sh -c WRAPPER runplane ENTRYPOINT...``."""
UNSAFE_CAPABILITIES = frozenset({"ALL", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "BPF"})
"""Capabilities with which a run could change its rules or send past them (packet sockets)."""
# A probe of one (host, port) per thread; prints those that accepted a connection, as JSON.
# Run by this agent's own Python inside the probe container's network namespace (-I -S: no site).
_PROBE_SCRIPT = """
import json, socket, sys, threading
reached = []
def attempt(host, port):
    try:
        socket.create_connection((host, int(port)), timeout=float(sys.argv[1])).close()
        reached.append(host + " port " + port)
    except OSError:
        pass
threads = [threading.Thread(target=attempt, args=a.split(",")) for a in sys.argv[2:]]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(sorted(reached)))
"""


class NetworkError(Exception):
    """A run's network cannot be closed off (the message says why)."""


class ContainerGone(Exception):
    """The container ended before its network was closed off; its command never started."""


@dataclass(frozen=True)
class RunNetwork:
    """The Docker network networked runs join, and how each run's namespace is closed off."""

    name: str
    gateways: tuple[str, ...] = ()
    subnets: tuple[str, ...] = ()
    nsenter: str = "nsenter"
    nft: str = "nft"
    gate_seconds: float = 30.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def blocked(self) -> list[str]:
        """What runs must not reach: the metadata services and the rest of CLOSED, this host's
        addresses (read again for each run: a bridge made since has one more), and the run
        network's own subnets. Docker keeps containers on its bridges apart only where it manages
        iptables (enable_icc false), and a macvlan or ipvlan network never: so these rules keep
        runs, of one user or several, from each other, and from the network's other hosts, on
        any network. A run needs nothing on its subnet as a destination: its gateway is a next
        hop (ARP and neighbour discovery pass), its resolver is 127.0.0.11."""
        return sorted({*METADATA, *CLOSED, *self.gateways, *self.subnets, *read_host_addresses()})

    def dns_servers(self) -> list[str]:
        """Where port 53 stays open (see the note above ``dns_servers``): the engine's upstream
        servers, unless one is an address of this host."""
        host = {*read_host_addresses(), *self.gateways}
        return [a for a in read_dns_servers() if a not in host]

    def prepare(self, spec: dict[str, Any], run_dir: Path) -> None:
        """Make a container spec (``containers.create`` keywords) one for this network: created
        with none (``release`` connects it), its entrypoint behind the gate, a FIFO made in
        ``run_dir`` and mounted read-only. Raises NetworkError for a spec whose run could get
        around its rules: privileged, or with any of UNSAFE_CAPABILITIES (Docker's default set
        has NET_RAW, whose packet sockets pass by netfilter: all must be dropped)."""
        dropped = {str(c).upper().removeprefix("CAP_") for c in spec.get("cap_drop") or []}
        added = {str(c).upper().removeprefix("CAP_") for c in spec.get("cap_add") or []}
        if spec.get("privileged") or "ALL" not in dropped or added & UNSAFE_CAPABILITIES:
            raise NetworkError(
                "a container that is privileged, or keeps any of "
                f"{', '.join(sorted(UNSAFE_CAPABILITIES - {'ALL'}))}, could get around its network rules"
            )
        gate_dir = run_dir / "net"
        gate_dir.mkdir(parents=True, exist_ok=True)
        gate_dir.chmod(0o755)
        fifo = gate_dir / "go"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        fifo.chmod(0o644)  # the run's user opens it to read
        spec["network_mode"] = "none"  # until its rules are in: release() connects it to self.name
        spec["volumes"] = {**(spec.get("volumes") or {}), str(gate_dir.resolve()): {"bind": GATE_MOUNT, "mode": "ro"}}
        spec["entrypoint"] = ["/bin/sh", "-c", WRAPPER, "runplane", *(spec.get("entrypoint") or [])]

    def release(self, container: Any, run_dir: Path, stopping: Callable[[], bool]) -> None:
        """Install the rules in the started ``container``'s namespace, connect it to this network,
        then let its command start. Returns without starting it when the container ended meanwhile
        or ``stopping()`` says so (the caller sees how it ended). Raises NetworkError when the
        rules cannot be installed, the network not connected, or the container does not reach its
        gate in time; its command has not started then either."""
        try:
            netns = self._enter(container)
            try:
                self._install(netns)
            finally:
                os.close(netns.fd)
            self._connect(container)
        except ContainerGone:
            return
        self._open_gate(run_dir / "net" / "go", netns.pid, stopping, b"go\n")

    # -- the steps ------------------------------------------------------------------------

    def _enter(self, container: Any) -> _Netns:
        """The network namespace of a started container, held open by a file descriptor."""
        try:
            container.reload()
        except docker.errors.NotFound as e:
            raise ContainerGone from e
        except (docker.errors.APIError, requests.RequestException) as e:
            raise NetworkError(f"cannot inspect the container: {e}") from e
        state = container.attrs.get("State") or {}
        pid = int(state.get("Pid") or 0)
        if not state.get("Running") or pid <= 0:
            raise ContainerGone
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise ContainerGone from e
        except OSError as e:
            raise NetworkError(f"cannot open the network namespace of process {pid}: {e.strerror}") from e
        try:
            # after opening: a pid taken over by another process meanwhile fails here, never passes
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            if container.id not in cgroup:
                raise NetworkError(
                    f"process {pid} is not the container's: this agent must share the Docker engine's PID namespace"
                )
            theirs, ours = os.fstat(fd), Path("/proc/self/ns/net").stat()
            if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
                raise NetworkError("the container shares this agent's network namespace")
        except FileNotFoundError as e:
            os.close(fd)
            raise ContainerGone from e
        except BaseException:
            os.close(fd)
            raise
        return _Netns(pid, fd)

    def _inside(self, netns: _Netns, argv: list[str], stdin: str = "", timeout: float = 10) -> str:
        command = [self.nsenter, f"--net=/proc/self/fd/{netns.fd}", "--", *argv]
        try:
            done = subprocess.run(
                command, input=stdin, capture_output=True, text=True, timeout=timeout, pass_fds=(netns.fd,)
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NetworkError(f"{Path(argv[0]).name} in the container's network namespace failed: {e}") from e
        if done.returncode != 0:
            detail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise NetworkError(f"{Path(argv[0]).name} in the container's network namespace failed: {detail}")
        return done.stdout

    def _install(self, netns: _Netns) -> None:
        self._inside(netns, [self.nft, "-f", "-"], ruleset(self.blocked(), self.dns_servers()))

    def _connect(self, container: Any) -> None:
        """From none to this network, in the namespace that already has its rules."""
        api = container.client.api
        try:
            api.disconnect_container_from_network(container.id, "none")
            api.connect_container_to_network(container.id, self.name)
        except (docker.errors.APIError, requests.RequestException) as e:
            with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                container.reload()
                if not (container.attrs.get("State") or {}).get("Running"):
                    raise ContainerGone from e
            raise NetworkError(f"cannot connect the container to Docker network {self.name}: {explain(e)}") from e

    def _open_gate(self, fifo: Path, pid: int, stopping: Callable[[], bool], line: bytes) -> bool:
        """Write ``line`` (b"" closes the gate without it) once the container's shell waits on it.
        False if the container ended or ``stopping()`` first."""
        deadline = self.clock() + self.gate_seconds
        pause = GATE_FIRST_PAUSE
        while True:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                    raise NetworkError(f"cannot open the gate {fifo}: {e.strerror}") from e
                if not Path(f"/proc/{pid}").exists() or stopping():
                    return False
                if self.clock() >= deadline:
                    raise NetworkError(f"the container did not wait at its gate within {self.gate_seconds:g}s") from e
                self.sleep(pause)  # usually never: the shell is at its gate before the rules are in
                pause = min(pause * 2, GATE_LONGEST_PAUSE)
                continue
            try:
                if line:
                    os.write(fd, line)
            finally:
                os.close(fd)
            return True

    # -- the start-up check ---------------------------------------------------------------

    def probe(self, client: docker.DockerClient, image: str, run_dir: Path, name: str, labels: dict[str, str]) -> None:
        """Check the whole path once: a container like a run's (``image``, the gate) gets the
        rules and this network; nothing of PROBES may answer inside it; closing its gate without
        the line must end it with GATE_EXIT, its command not started. Raises NetworkError."""
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        spec: dict[str, Any] = {
            "image": image,
            "entrypoint": ["/bin/sh", "-c"],
            "command": ["exit 0"],
            "name": name,
            "user": "65534:65534",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "mem_limit": 64 * 1024**2,
            "pids_limit": 16,
            "labels": labels,
            "detach": True,
        }
        self.prepare(spec, run_dir)
        container = _create(client, spec)
        try:
            container.start()
            try:
                netns = self._enter(container)
                try:
                    self._install(netns)
                    self._connect(container)
                    targets = [f"{host},{port}" for host, port in PROBES]
                    probe = [sys.executable, "-I", "-S", "-c", _PROBE_SCRIPT, "1.5", *targets]
                    out = self._inside(netns, probe, timeout=15)
                finally:
                    os.close(netns.fd)
            except ContainerGone as e:
                raise NetworkError("the probe container ended early (does the image have /bin/sh?)") from e
            reached = json.loads(out)
            if reached:
                raise NetworkError(f"{', '.join(reached)} answered on network {self.name} despite the rules")
            if not self._open_gate(run_dir / "net" / "go", netns.pid, lambda: False, b""):
                raise NetworkError("the probe container ended before it waited at its gate")
            status = container.wait(timeout=10).get("StatusCode")
            if status != GATE_EXIT:
                raise NetworkError(f"the gate did not hold: the probe's command ran (exit status {status})")
        except (docker.errors.APIError, requests.RequestException) as e:
            raise NetworkError(f"the probe container failed: {explain(e)}") from e
        finally:
            with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                container.remove(force=True, v=True)
            shutil.rmtree(run_dir, ignore_errors=True)


@dataclass(frozen=True)
class _Netns:
    pid: int
    fd: int


def _create(client: docker.DockerClient, spec: dict[str, Any]) -> Any:
    try:
        return client.containers.create(**spec)
    except docker.errors.APIError as e:
        if e.status_code != 409:
            raise
        client.containers.get(spec["name"]).remove(force=True, v=True)  # left by an earlier life of this worker
        return client.containers.create(**spec)
