"""The network of runs that ask for one (worker_agent/network.py) without Docker: the rules, the
host's addresses, the gate that holds the command until the rules are in, and how a worker that
gives runs no network is explained. The real thing is tests/security/test_network.py."""

import ipaddress
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runplane.domain.pools import Pool
from runplane.domain.runs import Run, RunSpec
from runplane.domain.workers import Worker, refuses
from runplane.services.dispatch import explain_wait
from worker_agent.container_spec import container_name, container_spec
from worker_agent.netcheck import _subnets, uncontainable
from worker_agent.netrules import CLOSED, METADATA, dns_servers, host_addresses, ruleset
from worker_agent.network import _PROBE_SCRIPT, GATE, GATE_EXIT, GATE_MOUNT, WRAPPER, NetworkError, RunNetwork
from worker_agent.run_config import ExecutorConfig

# /proc/net/fib_trie and /proc/net/if_inet6 of a host with eth0 192.0.2.2 and a bridge
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
     |-- 192.0.2.0
        /24 link UNICAST
     |-- 192.0.2.2
        /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 192.0.2.2
        /32 host LOCAL
     |-- 172.18.0.1
        /32 host LOCAL
     |-- 192.0.2.255
        /32 link BROADCAST
"""
IF_INET6 = """fd000000000000000000000000000002 04 40 00 82     eth0
00000000000000000000000000000001 01 80 10 80       lo
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
"""


def test_host_addresses_are_the_local_ones_but_loopback_and_their_broadcasts():
    assert host_addresses(FIB_TRIE, IF_INET6) == [
        "172.18.0.1",
        "192.0.2.2",
        "192.0.2.255",  # a service of the host's on 0.0.0.0 hears what goes to it
        "fd00::2",
        "fe80::fc:ff:fe00:1",
    ]
    assert host_addresses("", "") == []


ND = "nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert, mld-listener-report, mld2-listener-report"


def test_ruleset_rejects_addresses_and_networks_tcp_with_a_reset():
    blocked = ["fd00:ec2::254", "169.254.169.254", "192.0.2.2", "169.254.169.254", "169.254.0.0/16", "ff00::/8"]
    v4 = "169.254.0.0/16, 192.0.2.2, 198.18.7.0/24, 255.255.255.255"  # the /16 holds 169.254.169.254
    assert ruleset([*blocked, "198.18.7.0/24", "255.255.255.255"]) == (
        "table inet runplane {\n"
        "\tchain output {\n"
        "\t\ttype filter hook output priority 0; policy accept;\n"
        f"\t\ticmpv6 type {{ {ND} }} accept\n"  # the kernel's own neighbour discovery
        f"\t\tip daddr {{ {v4} }} meta l4proto tcp reject with tcp reset\n"
        f"\t\tip daddr {{ {v4} }} reject with icmpx type admin-prohibited\n"
        "\t\tip6 daddr { fd00:ec2::254, ff00::/8 } meta l4proto tcp reject with tcp reset\n"
        "\t\tip6 daddr { fd00:ec2::254, ff00::/8 } reject with icmpx type admin-prohibited\n"
        "\t}\n"
        "}\n"
    )


def test_ruleset_leaves_port_53_of_the_engines_dns_servers_open_before_it_rejects():
    rules = ruleset(["169.254.0.0/16", "168.63.129.16"], dns=["168.63.129.16", "169.254.169.253"]).splitlines()
    accept = "\t\tip daddr { 168.63.129.16, 169.254.169.253 } meta l4proto { tcp, udp } th dport 53 accept"
    reject = "\t\tip daddr { 168.63.129.16, 169.254.0.0/16 } meta l4proto tcp reject with tcp reset"
    assert rules.index(accept) < rules.index(reject)


def test_blocked_holds_metadata_link_local_multicast_broadcast_gateways_subnets_and_this_hosts_addresses():
    network = RunNetwork("runplane-runs", gateways=("10.9.0.1",), subnets=("10.9.0.0/24", "fd00:9::/64"))
    blocked = network.blocked()
    assert set(METADATA) | set(CLOSED) | {"10.9.0.1", "10.9.0.0/24", "fd00:9::/64"} <= set(blocked)
    assert {"169.254.0.0/16", "224.0.0.0/4", "255.255.255.255", "fe80::/10", "ff00::/8"} <= set(blocked)
    assert "127.0.0.1" not in blocked
    rules = ruleset(blocked)
    # EKS Pod Identity, EC2's DNS, all-hosts multicast, the subnet's broadcast, another run on it
    for address in ("169.254.170.23", "169.254.169.253", "224.0.0.1", "10.9.0.255", "10.9.0.77"):
        assert rejected(rules, address), address
    assert not rejected(rules, "10.9.1.1")  # beyond the subnet: the network's business


def rejected(rules: str, address: str) -> bool:
    """Whether ``rules`` (made by ruleset) reject what goes to the IPv4 ``address``."""
    line = next(x for x in rules.splitlines() if x.strip().startswith("ip daddr") and "reject" in x)
    networks = [ipaddress.ip_network(e.strip()) for e in line.split("{")[1].split("}")[0].split(",")]
    return any(ipaddress.ip_address(address) in n for n in networks)


def test_the_run_networks_subnets_are_read_and_a_network_without_one_is_refused():
    class Net:
        name = "n"

        def __init__(self, configs):
            self.attrs = {"IPAM": {"Config": configs}}

    found = Net([{"Subnet": "10.9.0.0/24", "Gateway": "10.9.0.1"}, {"Subnet": "fd00:9::/64"}])
    assert _subnets(found) == ("10.9.0.0/24", "fd00:9::/64")
    with pytest.raises(NetworkError, match="no subnet the agent can read, so runs on it could reach each other"):
        _subnets(Net([]))


def test_dns_servers_are_the_engines_upstreams_but_loopback():
    assert dns_servers("search x\nnameserver 10.0.0.2\nnameserver 127.0.0.1\nnameserver fe80::1%eth0\n") == [
        "10.0.0.2",
        "fe80::1",
    ]
    # systemd-resolved's stub: the engine reads the servers behind it
    azure = "nameserver 168.63.129.16\n"
    assert dns_servers("nameserver 127.0.0.53\noptions edns0\n", azure) == ["168.63.129.16"]
    # daemon.json's dns wins
    assert dns_servers("nameserver 10.0.0.2\n", azure, '{"dns": ["169.254.169.253"]}') == ["169.254.169.253"]
    assert dns_servers("nameserver 10.0.0.2\n", "", "not json") == ["10.0.0.2"]
    assert dns_servers("", "", "") == []


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("host", "--network-mode host puts runs on the host's own network"),
        ("none", "--network-mode none gives runs no network"),
        ("container:abc", "shares another container's network"),
    ],
)
def test_networks_that_cannot_be_contained(mode, why):
    assert why in (uncontainable(mode) or "")


def test_a_bridge_or_a_named_network_can_be_contained():
    assert uncontainable("runplane-runs") is None
    assert uncontainable("bridge") is None


def networked_run():
    return Run(id="r-1", owner="ann", queue="q", created_at=0, spec=RunSpec(command="curl x", network=True))


def test_a_containers_name_holds_no_run_id_yet_the_agent_can_compute_it(tmp_path):
    """Other containers on a run network learn its name from Docker's DNS (a reverse lookup)."""
    run = Run(id="r-0123456789abcdef01234567", owner="ann", queue="q", created_at=0, spec=RunSpec(command="x"))
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path, stack_id="stack1")
    name = container_spec(run, "img", config, tmp_path / "out", None)["name"]
    assert name == container_name("stack1", run.id, run.attempt)
    assert name.startswith("runplane-") and len(name) == len("runplane-") + 32
    assert run.id.removeprefix("r-")[:8] not in name  # not even a part of it
    assert container_name("stack2", run.id, run.attempt) != name != container_name("stack1", run.id, run.attempt + 1)
    assert container_spec(run, "img", config, tmp_path / "out", None)["labels"]["io.runplane.run_id"] == run.id


def test_prepare_puts_the_entrypoint_behind_the_gate(tmp_path):
    run = networked_run()
    spec = container_spec(run, "img", ExecutorConfig(worker_id="w", work_dir=tmp_path), tmp_path / "out", None)
    RunNetwork("runplane-runs").prepare(spec, tmp_path / "run")
    assert spec["network_mode"] == "none"  # connected to runplane-runs once its rules are in
    assert spec["entrypoint"] == ["/bin/sh", "-c", WRAPPER, "runplane", "/bin/sh", "-c"]
    assert spec["command"] == ["curl x"]
    gate_dir = tmp_path / "run" / "net"
    assert spec["volumes"][str(gate_dir.resolve())] == {"bind": GATE_MOUNT, "mode": "ro"}
    fifo = gate_dir / "go"
    assert fifo.is_fifo() and fifo.stat().st_mode & 0o777 == 0o644  # others read it; only root writes
    binds = {v["bind"]: k for k, v in spec["volumes"].items()}
    binds.update({m["Target"]: m["Source"] for m in spec.get("mounts") or []})  # docker.types.Mount
    assert binds["/runplane/output"] == str(tmp_path / "out")  # kept


@pytest.mark.parametrize(
    "unsafe",
    [
        {"privileged": True},
        {"cap_drop": []},  # Docker's default capabilities hold NET_RAW
        {"cap_add": ["NET_ADMIN"]},
        {"cap_add": ["CAP_NET_RAW"]},
        {"cap_add": ["ALL"]},
        {"cap_add": ["sys_admin"]},
    ],
)
def test_prepare_refuses_a_container_that_could_get_around_its_rules(tmp_path, unsafe):
    spec = {"image": "img", "entrypoint": ["/bin/sh", "-c"], "command": ["x"], "cap_drop": ["ALL"], **unsafe}
    with pytest.raises(NetworkError, match="could get around its network rules"):
        RunNetwork("runplane-runs").prepare(spec, tmp_path)


def gated_shell(fifo: Path) -> subprocess.Popen[str]:
    """What a networked container runs, with the gate at ``fifo``: sh -c WRAPPER runplane /bin/sh -c CMD."""
    wrapper = WRAPPER.replace(GATE, str(fifo))
    return subprocess.Popen(
        ["/bin/sh", "-c", wrapper, "runplane", "/bin/sh", "-c", "echo the command ran"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("line", "status", "out", "refused"),
    [(b"go\n", 0, "the command ran\n", False), (b"", GATE_EXIT, "", True)],
)
def test_the_command_starts_only_on_the_agents_line(tmp_path, line, status, out, refused):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    shell = gated_shell(fifo)
    assert RunNetwork("n")._open_gate(fifo, shell.pid, lambda: False, line) is True
    stdout, stderr = shell.communicate(timeout=10)
    assert (shell.returncode, stdout) == (status, out)
    assert ("its command did not start" in stderr) is refused, stderr


def test_a_gate_nobody_waits_at_times_out_or_stops(tmp_path):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    network = RunNetwork("n", gate_seconds=1, clock=lambda: now[0], sleep=sleep)
    with pytest.raises(NetworkError, match="did not wait at its gate within 1s"):
        network._open_gate(fifo, os.getpid(), lambda: False, b"go\n")
    assert network._open_gate(fifo, os.getpid(), lambda: True, b"go\n") is False  # killed meanwhile


def test_waiting_at_a_gate_backs_off():
    """Looking again every 2 ms for up to 30 s costs a core; the pauses grow to 50 ms instead."""
    now, pauses = [0.0], []

    def sleep(seconds):
        pauses.append(seconds)
        now[0] += seconds

    network = RunNetwork("n", gate_seconds=30, clock=lambda: now[0], sleep=sleep)
    with pytest.raises(NetworkError, match="cannot open the gate /nonexistent-fifo: No such file or directory"):
        network._open_gate(Path("/nonexistent-fifo"), os.getpid(), lambda: False, b"go\n")
    assert pauses == []  # not a FIFO at all: fails at once
    fifo = Path(f"/tmp/rp-gate-{os.getpid()}")
    os.mkfifo(fifo)
    try:
        with pytest.raises(NetworkError, match="within 30s"):
            network._open_gate(fifo, os.getpid(), lambda: False, b"go\n")
    finally:
        fifo.unlink()
    assert pauses[:3] == [0.001, 0.002, 0.004]  # a shell that is nearly there is not kept waiting
    assert max(pauses) == 0.05 and len(pauses) < 30 / 0.05 + 10


def test_the_probe_reports_what_answers():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]  # bound, never listening: refused
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _PROBE_SCRIPT, "2", f"127.0.0.1,{port}", f"127.0.0.1,{closed_port}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        server.close()
        closed.close()
    assert done.stdout.strip() == f'["127.0.0.1 port {port}"]'


def test_a_worker_without_a_network_refuses_only_networked_runs_and_says_why():
    why = "--network-mode host puts runs on the host's own network"
    plain = Run(id="r-2", owner="ann", queue="p", created_at=0, spec=RunSpec(command="x"))
    assert refuses(None, False, None, networked_run(), network_refused=why) == (
        f"this worker takes no runs that ask for a network: {why}"
    )
    assert refuses(None, False, None, plain, network_refused=why) is None
    worker = Worker(id="w1", pool="p", started_at=0, heartbeat_at=0, network_refused=why)
    pool = Pool(name="p", backend="local", cpus=2, memory="2g", disk="5g", default_image="img")
    assert explain_wait(pool, [worker], None, None, networked_run()) == (
        f"no live worker of pool p takes runs that ask for a network: {why}"
    )
    assert explain_wait(pool, [worker], None, None, plain).startswith("1 free slot(s) on 1 worker(s)")
    # a worker that refuses it for another reason first (its group) is explained by that
    grouped = Worker(id="w2", pool="p", started_at=0, heartbeat_at=0, network_refused=why, group="vision")
    assert explain_wait(pool, [grouped], None, None, networked_run()) == (
        "no live worker of pool p takes this run: this worker serves group vision only and ann is not in it"
    )
