"""Networked runs: a Docker network of the agent's own, from which neither the cloud's metadata
services (all of link-local), the host's own addresses, the run network's own subnet (other runs),
nor broadcast and multicast addresses can be reached.

The guarantee does not depend on what the Docker network is (a bridge, macvlan, ...): the agent
installs nftables rules *inside the run's own network namespace* that reject traffic to those
addresses, and the run has no CAP_NET_ADMIN, so it cannot take them out. Docker makes the
namespace only when it starts the container, and what runs first in it is the run's image (even
its /bin/sh is the user's), so the container is created without a network (``none``: loopback
only); once it runs, the agent installs the rules in its namespace and only then connects it to
the run network. Nothing in the container ever has a route out before its rules are in.

So that the command does not start before it has its network, it waits behind a gate: the shell
first blocks reading a FIFO mounted read-only, and the agent writes one line to it once the
network is connected. If the agent fails before that, the command never starts and the container
is removed. (The gate is for readiness; the rules and the late connect are what keep runs out.)

At start the agent checks the whole path once with a probe container on the same network (same
steps, the pool's image): if the rules cannot be installed, a metadata address answers from inside,
or the gate does not hold, the agent takes no runs that ask for a network, and says why.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

log = logging.getLogger(__name__)

DEFAULT_NETWORK = "runplane-runs"
"""The network the agent creates when missing: a bridge without inter-container traffic."""
BRIDGE_DEVICE = "rp-runs0"
"""The host's interface of DEFAULT_NETWORK (infra/ami/install.sh's host rules name it)."""
METADATA = ("169.254.169.254", "169.254.170.2", "168.63.129.16", "fd00:ec2::254")
"""EC2/Azure instance metadata, ECS task credentials, Azure's WireServer, EC2 metadata on IPv6."""
CLOSED = ("169.254.0.0/16", "224.0.0.0/4", "255.255.255.255", "fe80::/10", "ff00::/8")
"""Besides METADATA, closed to every run: all of link-local (the cloud's other services live there:
EKS Pod Identity at 169.254.170.23, EC2's DNS and time at 169.254.169.253 and 169.254.169.123, ...,
and so do the link-local addresses of the run network's hosts), IPv4 multicast and broadcast, IPv6
multicast (host services bound to 0.0.0.0 or :: hear these). The run network's own subnets (its
directed broadcast included) are closed too (RunNetwork.blocked)."""
NEIGHBOUR_DISCOVERY = (
    "nd-router-solicit",
    "nd-neighbor-solicit",
    "nd-neighbor-advert",
    "mld-listener-report",
    "mld2-listener-report",
)
"""ICMPv6 that IPv6 needs on a link (to link-local and multicast addresses): sent by the kernel
only, since a run without CAP_NET_RAW cannot send ICMPv6 of these types itself."""
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
NFT_TABLE = "runplane"
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


def uncontainable(mode: str) -> str | None:
    """Why runs on Docker network ``mode`` cannot be kept from the metadata services and the host
    whatever rules are installed, or None."""
    if mode == "host":
        return (
            "--network-mode host puts runs on the host's own network, where nothing can keep them "
            "from the cloud's metadata service and the host"
        )
    if mode == "none":
        return "--network-mode none gives runs no network"
    if mode.startswith("container:"):
        return f"--network-mode {mode} shares another container's network"
    return None


def host_addresses(fib_trie: str, if_inet6: str) -> list[str]:
    """The host's own addresses but loopback, and the broadcast addresses of its networks (the host
    hears those too), from /proc/net/fib_trie and /proc/net/if_inet6."""
    found: set[str] = set()
    last = ""
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith("|--"):
            last = text[3:].strip()
        elif text in ("/32 host LOCAL", "/32 link BROADCAST") and last:
            found.add(last)
    for line in if_inet6.splitlines():
        fields = line.split()
        if fields and len(fields[0]) == 32:
            found.add(str(ipaddress.IPv6Address(int(fields[0], 16))))
    addresses = [ipaddress.ip_address(a) for a in found]
    return [str(a) for a in sorted(addresses, key=lambda a: (a.version, a)) if not a.is_loopback]


def read_host_addresses() -> list[str]:
    texts = []
    for name in ("/proc/net/fib_trie", "/proc/net/if_inet6"):
        try:
            texts.append(Path(name).read_text())
        except OSError:  # no IPv6 in this kernel: no file
            texts.append("")
    return host_addresses(*texts)


# DNS under these rules. On a user-defined Docker network (the agent's runplane-runs, a macvlan,
# ...) a run's resolver is Docker's embedded one at 127.0.0.11: loopback, which no rule touches
# (nor the DNAT to dockerd's port behind it), and dockerd answers the names of the network's
# containers itself, so closing link-local breaks none of that. Other names dockerd forwards to
# the engine's upstream servers (daemon.json "dns", else the host's resolv.conf, where
# systemd-resolved's stub 127.0.0.53 stands for the servers in /run/systemd/resolve/resolv.conf),
# and it dials them from inside the run's namespace (only a loopback upstream from the host's), so
# the rules do see those queries; on Docker's default bridge (no embedded resolver) the run asks
# those servers itself. So port 53 of those servers stays open (``dns_servers``): where the
# upstream is link-local (EC2's 169.254.169.253 on hosts set up so, GCP's metadata server), Azure's
# 168.63.129.16 (always, on Azure) or in the run network's own subnet (a LAN's resolver, on a
# macvlan), runs still resolve names, and reach on those addresses nothing but the DNS service
# they reach through 127.0.0.11 anyway. What breaks, on any network: an upstream that is an address of this
# host (a resolver on the docker0 address, say) stays closed, so runs resolve only their own
# network's container names (on the default bridge, none); give the engine another resolver
# (daemon.json "dns") there.
def dns_servers(resolv_conf: str, systemd_resolv_conf: str = "", daemon_json: str = "") -> list[str]:
    """The non-loopback DNS servers the Docker engine sends runs' queries to, as it picks them."""
    try:
        configured = json.loads(daemon_json).get("dns") if daemon_json.strip() else None
    except (ValueError, AttributeError):
        configured = None
    if isinstance(configured, list) and configured:
        servers = [str(s) for s in configured]
    else:
        servers = _nameservers(resolv_conf)
        if servers == ["127.0.0.53"] and systemd_resolv_conf:  # the engine's own rule for systemd-resolved
            servers = _nameservers(systemd_resolv_conf)
    found: list[str] = []
    for server in servers:
        try:
            address = ipaddress.ip_address(server.split("%")[0])
        except ValueError:
            continue
        if not address.is_loopback and str(address) not in found:
            found.append(str(address))
    return found


def _nameservers(resolv_conf: str) -> list[str]:
    return [f[1] for f in (line.split() for line in resolv_conf.splitlines()) if len(f) >= 2 and f[0] == "nameserver"]


def read_dns_servers() -> list[str]:
    texts = []
    for name in ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf", "/etc/docker/daemon.json"):
        try:
            texts.append(Path(name).read_text())
        except (OSError, UnicodeDecodeError):  # no such file (or not this agent's to read)
            texts.append("")
    return dns_servers(*texts)


def ruleset(blocked: Iterable[str], dns: Iterable[str] = ()) -> str:
    """nftables rules for a run's network namespace: reject whatever goes to ``blocked``
    (addresses and networks) but port 53 of the ``dns`` servers and the kernel's own neighbour
    discovery. TCP gets a reset (at once, where an ICMP error may be rate-limited and leave
    connect() waiting)."""
    networks = [ipaddress.ip_network(a, strict=False) for a in blocked]
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    closed: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = [
        *ipaddress.collapse_addresses(v4),
        *ipaddress.collapse_addresses(v6),
    ]
    servers = sorted({ipaddress.ip_address(a) for a in dns}, key=lambda a: (a.version, a))
    lines = [f"table inet {NFT_TABLE} {{", "\tchain output {", "\t\ttype filter hook output priority 0; policy accept;"]
    lines.append(f"\t\ticmpv6 type {{ {', '.join(NEIGHBOUR_DISCOVERY)} }} accept")
    for family, version in (("ip", 4), ("ip6", 6)):
        chosen = ", ".join(str(a) for a in servers if a.version == version)
        if chosen:
            lines.append(f"\t\t{family} daddr {{ {chosen} }} meta l4proto {{ tcp, udp }} th dport 53 accept")
    for family, version in (("ip", 4), ("ip6", 6)):
        chosen = ", ".join(_element(n) for n in closed if n.version == version)
        if chosen:
            lines.append(f"\t\t{family} daddr {{ {chosen} }} meta l4proto tcp reject with tcp reset")
            lines.append(f"\t\t{family} daddr {{ {chosen} }} reject with icmpx type admin-prohibited")
    lines += ["\t}", "}", ""]
    return "\n".join(lines)


def _element(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    single = network.num_addresses == 1
    return str(network.network_address) if single else str(network)


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
            raise NetworkError(f"cannot connect the container to Docker network {self.name}: {_explain(e)}") from e

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
            raise NetworkError(f"the probe container failed: {_explain(e)}") from e
        finally:
            with contextlib.suppress(docker.errors.APIError, requests.RequestException):
                container.remove(force=True, v=True)
            shutil.rmtree(run_dir, ignore_errors=True)


@dataclass(frozen=True)
class _Netns:
    pid: int
    fd: int


@dataclass(frozen=True)
class NetworkCheck:
    """The outcome of the start-up check: the network runs get, or why they get none."""

    network: RunNetwork | None
    refused: str | None
    seconds: float = 0.0


def check_network(
    client: docker.DockerClient,
    mode: str,
    image: str,
    work_dir: Path,
    *,
    pull: bool,
    name: str,
    labels: dict[str, str],
    clock: Callable[[], float] = time.monotonic,
) -> NetworkCheck:
    """Find or make Docker network ``mode`` and prove that runs on it cannot reach the metadata
    services (RunNetwork.probe, with the pool's ``image``, pulled if missing when ``pull``). Never
    raises: what fails is the NetworkCheck's ``refused``."""
    t0 = clock()
    refused = uncontainable(mode) or _not_on_host_network()
    if refused is not None:
        return NetworkCheck(None, refused, clock() - t0)
    nsenter, nft = shutil.which("nsenter"), shutil.which("nft")
    try:
        if nft is None:
            raise NetworkError("nft (nftables) is not installed on this worker")
        if nsenter is None:
            raise NetworkError("nsenter (util-linux) is not installed on this worker")
        found = _docker_network(client, mode)
        network = RunNetwork(mode, gateways=_gateways(found), subnets=_subnets(found), nsenter=nsenter, nft=nft)
        _ensure_image(client, image, pull)
        network.probe(client, image, work_dir / "netcheck", name, labels)
    except NetworkError as e:
        return NetworkCheck(None, str(e), clock() - t0)
    except (docker.errors.DockerException, requests.RequestException) as e:
        return NetworkCheck(None, f"the network check failed: {_explain(e)}", clock() - t0)
    return NetworkCheck(network, None, clock() - t0)


def _not_on_host_network() -> str | None:
    """Why this agent cannot tell the host's addresses (it is not in the network namespace of
    PID 1, the host's init when it shares the host's PID namespace), or None. Unreadable: None
    (an agent that cannot see the host's PIDs fails the probe anyway)."""
    try:
        ours, init = Path("/proc/self/ns/net").stat(), Path("/proc/1/ns/net").stat()
    except OSError:
        return None
    if (ours.st_dev, ours.st_ino) != (init.st_dev, init.st_ino):
        return "this agent is not on the host's network, so it cannot tell which addresses are the host's"
    return None


def _docker_network(client: docker.DockerClient, name: str) -> Any:
    try:
        network = client.networks.get(name)
    except docker.errors.NotFound:
        if name != DEFAULT_NETWORK:
            raise NetworkError(
                f"Docker network {name} does not exist (create it, or use the default {DEFAULT_NETWORK}, "
                "which the agent creates)"
            ) from None
        network = _create_default(client)
    driver = network.attrs.get("Driver")
    if driver in ("host", "null"):
        raise NetworkError(f"Docker network {name} has driver {driver}: it cannot be contained")
    return network


def _create_default(client: docker.DockerClient) -> Any:
    try:
        return client.networks.create(
            DEFAULT_NETWORK,
            driver="bridge",
            check_duplicate=True,
            options={"com.docker.network.bridge.name": BRIDGE_DEVICE, "com.docker.network.bridge.enable_icc": "false"},
            labels={"io.runplane.network": "runs"},
        )
    except docker.errors.APIError as e:
        if e.status_code == 409:  # another agent on this host made it first
            return client.networks.get(DEFAULT_NETWORK)
        raise NetworkError(f"cannot create Docker network {DEFAULT_NETWORK}: {_explain(e)}") from e


def _gateways(network: Any) -> tuple[str, ...]:
    """A bridge's gateway is this host's address on it."""
    if network.attrs.get("Driver") != "bridge":
        return ()
    configs = (network.attrs.get("IPAM") or {}).get("Config") or []
    return tuple(str(c["Gateway"]).split("/")[0] for c in configs if c.get("Gateway"))


def _subnets(network: Any) -> tuple[str, ...]:
    """The network's own subnets (other runs live there). None known: NetworkError (runs on it
    could reach each other)."""
    configs = (network.attrs.get("IPAM") or {}).get("Config") or []
    subnets = []
    for config in configs:
        with contextlib.suppress(ValueError, TypeError):
            subnets.append(str(ipaddress.ip_network(config.get("Subnet"), strict=False)))
    if not subnets:
        raise NetworkError(
            f"Docker network {network.name} has no subnet the agent can read, so runs on it could reach each other"
        )
    return tuple(subnets)


def _ensure_image(client: docker.DockerClient, image: str, pull: bool) -> None:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        if not pull:
            raise NetworkError(f"the probe needs image {image}, which is not on this worker (pulling is off)") from None
        client.images.pull(image)


def _create(client: docker.DockerClient, spec: dict[str, Any]) -> Any:
    try:
        return client.containers.create(**spec)
    except docker.errors.APIError as e:
        if e.status_code != 409:
            raise
        client.containers.get(spec["name"]).remove(force=True, v=True)  # left by an earlier life of this worker
        return client.containers.create(**spec)


def _explain(e: Exception) -> str:
    if isinstance(e, docker.errors.APIError):
        return str(e.explanation or e)
    return str(e)
