"""Kill latency: from ``POST /v1/runs/{id}/kill`` to the container stopped, and to the run's
final ``killed`` state, on a warm local worker with the agent's default kill poll (1 s).

The embedded local stack (moto in-process, HTTP front, dispatcher, one local worker agent on the
real Docker engine) runs ``sleep 60`` in ``runplane/test-busybox:1``; once it is ``running``
the client kills it. "Stopped" is the container's exit time as the Docker engine records it
(``State.FinishedAt``, same host clock), read before the agent removes the container — the agent
keeps it until the final state is written, and the client polls every 20 ms. The baseline is the
bare ``docker kill`` of an equivalent running container. Prints medians, p90 and p99 (the
largest of fewer than 100 samples) and ``RESULT kill_latency`` against the target p99 <= 2 s.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime

from _common import dev_stack, median, p90, table

IMAGE = "runplane/test-busybox:1"
AGENT_ARGS = "--poll-seconds 1 --heartbeat-seconds 1 --lease-seconds 10 --network-mode host --pull never"
POOLS_YAML = (
    "pools: [{name: default, backend: local, cpus: 2, memory: 4g, max_workers: 1, "
    f"idle_seconds: 600, default_image: '{IMAGE}'}}]\n"
)
TARGET_P99 = 2.0


def _finished_at(container: object) -> float | None:
    text = container.attrs["State"].get("FinishedAt", "")  # type: ignore[attr-defined]
    if not text or text.startswith("0001"):
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(f"0.{frac or 0}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="measured kills (default 20)")
    args = parser.parse_args()
    import docker

    from runplane.client import Client

    stopped: list[float] = []
    final: list[float] = []
    bare: list[float] = []
    with dev_stack(POOLS_YAML, AGENT_ARGS) as stack:
        engine = docker.from_env()
        client = Client(stack.api_url, "bench")
        for i in range(args.n + 1):
            run = client.request("POST", "/v1/runs", {"command": "sleep 60", "name": f"kill-{i}"})
            while client.request("GET", f"/v1/runs/{run['id']}")["state"] != "running":
                time.sleep(0.02)
            (container,) = engine.containers.list(filters={"label": f"io.runplane.run_id={run['id']}"})
            t_kill = time.time()
            client.request("POST", f"/v1/runs/{run['id']}/kill")
            died = None
            while True:
                with_state = client.request("GET", f"/v1/runs/{run['id']}")
                if died is None:
                    try:
                        container.reload()
                        died = _finished_at(container)
                    except docker.errors.NotFound:
                        pass
                if with_state["state"] == "killed":
                    t_final = time.time()
                    break
                time.sleep(0.02)
            if i == 0:
                continue  # the first run also started the worker
            final.append(t_final - t_kill)
            if died is not None:
                stopped.append(died - t_kill)
        for _ in range(args.n):
            c = engine.containers.run(IMAGE, ["sleep", "60"], detach=True, network_mode="none")
            t = time.perf_counter()
            c.kill()
            c.wait()
            bare.append(time.perf_counter() - t)
            c.remove(force=True)
    table(
        f"kill of a running run ({args.n} kills, agent kill poll 1 s)",
        [
            ("POST kill -> container stopped", stopped),
            ("POST kill -> state killed", final),
            ("bare docker kill + wait", bare),
        ],
    )
    worst = max(stopped) if stopped else float("nan")
    print(f"  container stopped: median {median(stopped):.2f}s, p90 {p90(stopped):.2f}s, p99 (max) {worst:.2f}s")
    print(f"RESULT kill_latency: p99 {worst:.2f}s to container stopped (target <= {TARGET_P99:g}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
