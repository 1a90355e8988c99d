"""What closing a networked run's network off costs the worker agent, on the real Docker engine.

For each run the agent installs nftables rules in the container's own network namespace, connects
it to the run network and opens the gate its command waits behind (``RunNetwork.release``, the
run's ``timings["network"]``). This script times that step, and a whole networked run (create,
start, release, wait, remove) against the same run without a network, with the agent's own
``container_spec``. The run network is a macvlan on a veth into a network namespace the script
makes, as the tests do, or a bridge (``--driver bridge``), on 198.18.N.0/24 (a benchmarking range;
the runs send nothing). Needs root, ``nft``, ``nsenter`` and the local test image.

    python bench/network_cost.py [--n 30] [--driver macvlan|bridge]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
from _common import median, table
from docker.types import IPAMConfig, IPAMPool

from runplane.domain.runs import Run, RunSpec
from worker_agent.executor import ExecutorConfig, container_spec
from worker_agent.netcheck import check_network
from worker_agent.network import RunNetwork

IMAGE = "runplane/test-busybox:1"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def run_network(client: docker.DockerClient, driver: str = "macvlan") -> Iterator[str]:
    """A macvlan Docker network on a veth whose other end is in a namespace of this script's, or
    a bridge of its own."""
    tag = os.urandom(3).hex()
    netns, outer, inner = f"rpb-{tag}", f"rpb{tag}a", f"rpb{tag}b"
    network = None
    sh("ip", "netns", "add", netns)
    try:
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", netns)
        prefix = f"198.18.{random.randint(0, 255)}"
        pool = IPAMPool(subnet=f"{prefix}.0/24", iprange=f"{prefix}.128/25", gateway=f"{prefix}.1")
        options = {"parent": outer} if driver == "macvlan" else {"com.docker.network.bridge.name": f"rpbbr{tag}"}
        network = client.networks.create(
            f"rpb-{tag}", driver=driver, options=options, ipam=IPAMConfig(pool_configs=[pool])
        )
        sh("ip", "link", "set", outer, "up")
        if driver == "macvlan":  # the namespace is the runs' gateway
            sh("ip", "-n", netns, "addr", "add", f"{prefix}.1/24", "dev", inner)
            sh("ip", "-n", netns, "link", "set", inner, "up")
        yield network.name
    finally:
        if network is not None:
            network.remove()
        subprocess.run(["ip", "link", "del", outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def one_run(client: docker.DockerClient, scratch: Path, network: RunNetwork | None, i: int) -> tuple[float, float]:
    """(seconds of the whole run, seconds of release) for one ``sh -c true`` run."""
    run = Run(id=f"r-bench{i}", owner="bench", queue="q", created_at=0, spec=RunSpec(command="true", network=True))
    config = ExecutorConfig(worker_id="bench", work_dir=scratch)
    run_dir = scratch / f"run{i}"
    output = run_dir / "output"
    output.mkdir(parents=True)
    os.chown(output, 65534, 65534)
    t0 = time.perf_counter()
    spec = container_spec(run, IMAGE, config, output, None)
    if network is None:
        spec["network_mode"] = "none"
    else:
        network.prepare(spec, run_dir)
    container = client.containers.create(**spec)
    released = 0.0
    try:
        container.start()
        if network is not None:
            t1 = time.perf_counter()
            network.release(container, run_dir, lambda: False)
            released = time.perf_counter() - t1
        status = container.wait(timeout=30)["StatusCode"]
    finally:
        container.remove(force=True)
    total = time.perf_counter() - t0
    shutil.rmtree(run_dir, ignore_errors=True)
    if status != 0:
        raise SystemExit(f"the run exited with {status}")
    return total, released


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--driver", choices=["macvlan", "bridge"], default="macvlan")
    args = parser.parse_args()
    client = docker.from_env()
    scratch = Path(tempfile.mkdtemp(prefix="rp-bench-net-"))
    try:
        with run_network(client, args.driver) as name:
            check = check_network(
                client, name, IMAGE, scratch, pull=False, name=f"rpb-netcheck-{os.getpid()}", labels={}
            )
            if check.network is None:
                raise SystemExit(f"the network check failed: {check.refused}")
            print(f"network check (probe container) in {check.seconds:.2f}s")
            for i in range(3):  # warm-up
                one_run(client, scratch, check.network, i)
                one_run(client, scratch, None, i)
            plain, networked, release = [], [], []
            for i in range(args.n):
                networked_total, released = one_run(client, scratch, check.network, i)
                networked.append(networked_total)
                release.append(released)
                plain.append(one_run(client, scratch, None, i)[0])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table(
        f"a networked run ({args.driver}) against the same run without a network",
        [
            ("no network: create, start, wait, remove", plain),
            ("networked: the same + release", networked),
            ("release: rules, connect, gate", release),
        ],
    )
    print(f"RESULT network_release_{args.driver}: {median(release) * 1000:.1f} ms (median)")


if __name__ == "__main__":
    main()
