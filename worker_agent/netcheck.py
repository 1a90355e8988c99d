"""The start-up check of networked runs: find or make the Docker network runs join, and prove
once, with a probe container of the pool's image, that runs on it cannot reach what they must not
(network.py). Its outcome says which network runs get, or why runs that ask for one are refused."""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from worker_agent.containers import explain
from worker_agent.network import NetworkError, RunNetwork

DEFAULT_NETWORK = "runplane-runs"
"""The network the agent creates when missing: a bridge without inter-container traffic."""
BRIDGE_DEVICE = "rp-runs0"
"""The host's interface of DEFAULT_NETWORK (infra/ami/install.sh's host rules name it)."""


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
        return NetworkCheck(None, f"the network check failed: {explain(e)}", clock() - t0)
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
        raise NetworkError(f"cannot create Docker network {DEFAULT_NETWORK}: {explain(e)}") from e


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
