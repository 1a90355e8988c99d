"""What run containment costs the worker agent, on the real Docker engine.

* USER resolution (``worker_agent.users.ImageUsers``): the first run of an image on an agent
  creates a container (never started), reads ``/etc/passwd``, ``/etc/group`` and the home's tar
  header, and removes it; later runs of that image hit the cache.
* Disk sampling (``RunExecutor._check_disk``): a walk of the output directory and of the
  container's overlay upper directory, for a run that wrote N files to ``/tmp`` and N to its
  output, against Docker's own count of the writable layer (``SizeRw``, from the container list
  with ``size=true``, and from inspect with ``size=true``).

Medians and p90 over ``--n`` samples, in milliseconds.

    python bench/containment_costs.py [--n 15]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import docker
from _common import table

from worker_agent.usage import walk
from worker_agent.users import ImageUsers

IMAGE = "runplane/test-busybox:1"


def user_resolution(client: docker.DockerClient, n: int) -> list[tuple[str, list[float]]]:
    image = client.images.get(IMAGE)
    cold, warm = [], []
    for _ in range(n):
        users = ImageUsers(client)
        t0 = time.perf_counter()
        users.run_as(image, "nobody", False)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        users.run_as(image, "nobody", False)
        warm.append(time.perf_counter() - t0)
    return [("first run of an image (create, 3 reads, remove)", cold), ("later runs (cached)", warm)]


def disk_sampling(client: docker.DockerClient, files: int, n: int) -> list[tuple[str, list[float]]]:
    scratch = Path(tempfile.mkdtemp(prefix="rp-bench-"))
    output = scratch / "output"
    output.mkdir()
    output.chmod(0o777)
    script = (
        f"i=0; while [ $i -lt {files} ]; do echo x > /tmp/f$i; echo y > /o/f$i; i=$((i+1)); done; "
        "touch /o/done; sleep 600"
    )
    container = client.containers.run(
        IMAGE, ["sh", "-c", script], detach=True, network_mode="none", volumes={str(output): {"bind": "/o"}}
    )
    try:
        while not (output / "done").exists():
            time.sleep(0.05)
        upper = container.attrs["GraphDriver"]["Data"]["UpperDir"]
        ours, listed, inspected = [], [], []
        for _ in range(n):
            t0 = time.perf_counter()
            walk(output)
            walk(upper)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            client.api.containers(all=True, filters={"id": container.id}, size=True)
            listed.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            client.api._result(client.api._get(client.api._url("/containers/{0}/json", container.id),
                                               params={"size": True}), True)  # fmt: skip
            inspected.append(time.perf_counter() - t0)
    finally:
        container.remove(force=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return [
        (f"{files} + {files} files: walk output + upper dir", ours),
        (f"{files} files in /tmp: SizeRw, container list size=true", listed),
        (f"{files} files in /tmp: SizeRw, inspect size=true", inspected),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15)
    args = parser.parse_args()
    client = docker.from_env()
    table("USER resolution per run", user_resolution(client, args.n), scale=1000, unit="ms")
    for files in (10, 2000, 20000):
        table("disk sample of a running run", disk_sampling(client, files, args.n), scale=1000, unit="ms")


if __name__ == "__main__":
    main()
