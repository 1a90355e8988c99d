"""What a networked run may not reach, and the nftables rules that close it off inside the run's
own network namespace (network.py installs them). Pure, but for reading the host's addresses and
its DNS configuration from /proc and /etc."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from pathlib import Path

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
NFT_TABLE = "runplane"


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
