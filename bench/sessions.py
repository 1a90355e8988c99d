"""Sessions into a live run (docs/sessions.md) on the stack ``runplane dev`` starts: exec's time to
its first byte, a terminal's keystroke round trip, and port-forward's throughput.

The embedded local stack (``cloud: local``, the relay at ``/v1/relay`` on its front), one warm
local worker agent on the real Docker engine, and one run of ``runplane/test-busybox:1`` without
network that serves a 64 MiB file of random bytes (nothing on the way can compress it) with busybox
``httpd`` on ``127.0.0.1:8000`` inside it. Through the client's own path
(``Client.open_session``, then ``dial``, ``meet`` and the frame pumps of
``runplane.client.sessions``: what ``Run.exec`` and ``runplane exec`` do):

* exec: from the ``POST`` that opens the session to the first byte of ``echo hi``'s output (and,
  beside it, the answer, the worker's HELLO, the EXIT). The worker takes a session when its
  one-second look at the run's control state sees ``sessions_asked`` change, so up to a second
  of it is that look (about half a second on average; each exec waits a random 0-1 s first, or
  back-to-back execs fall in step with the look). Reference: ``docker exec`` of the same.
* keystroke: one session, ``cat`` on a terminal in raw mode, one byte sent and its echo back.
* port-forward: 64 MiB fetched through ``Run.port_forward`` against the same fetched over a
  connection the benchmark makes itself in the run's network namespace (the agent's own
  ``setns`` dial, worker_agent/sessions/netns.py: no relay, no frames); reference: the same
  through a ``docker exec`` of busybox ``nc`` (the engine's stream).

Prints medians, p90 and p95, the machine's load average, ``RESULT sessions_exec`` (p95 against
1.5 s) and ``RATIO sessions_port_forward`` (throughput through the forward over the direct one,
target >= 0.5).

With ``--cloud aws`` (or ``azure``) the same runs on that cloud's dev stack, whose relay is a fake
of the cloud's (API Gateway's WebSocket API: every frame a call of the relay function and a
``PostToConnection``, the connections in DynamoDB on moto; Web PubSub's stand-in): a report, with
no target, and no RESULT or RATIO line.

    python bench/sessions.py [--n 15] [--keys 200] [--rounds 5] [--cloud local|aws|azure]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import docker
from _common import dev_stack, median, ratio_line
from throughput import wait_workers

from runplane.client import Client, InvalidRequest, Run
from runplane.client.sessions import Access, meet, open_link, pump_exec
from runplane.domain.session_wire import STDIN, STDOUT, FrameType
from worker_agent.sessions import netns

IMAGE = "runplane/test-busybox:1"
AGENT_ARGS = "--network-mode host --pull never"
POOLS_YAML = (
    "pools: [{name: default, backend: local, cpus: 2, memory: 4g, min_workers: 1, max_workers: 1, "
    f"idle_seconds: 600, max_sessions_per_run: 16, default_image: '{IMAGE}'}}]\n"
)
PORT = 8000
SIZE = 64 << 20
SERVE = (
    f"mkdir -p /tmp/www && head -c {SIZE} /dev/urandom > /tmp/www/blob && exec httpd -f -p 127.0.0.1:{PORT} -h /tmp/www"
)
REQUEST = b"GET /blob HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
TARGET_EXEC_P95 = 1.5
TARGET_FORWARD = 0.5


def pct(samples: Sequence[float], q: float) -> float:
    """The ``q`` percentile (nearest rank)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def show(title: str, rows: Sequence[tuple[str, Sequence[float]]], unit: str = "ms", scale: float = 1000.0) -> None:
    width = max(len(label) for label, _ in rows)
    print(f"\n{title}")
    print(f"  {'path':<{width}}  {'n':>4}  {'median ' + unit:>12}  {'p90 ' + unit:>12}  {'p95 ' + unit:>12}")
    for label, s in rows:
        cells = [median(s) * scale, pct(s, 0.9) * scale, pct(s, 0.95) * scale] if s else []
        text = "".join(f"  {c:>12.2f}" for c in cells) if cells else f"  {'-':>12}" * 3
        print(f"  {label:<{width}}  {len(s):>4}{text}")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def open_session(client: Client, run: Run, kind: str, **fields: Any) -> Access:
    """A new session; while the worker is still ending the last ones (every slot taken), again."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return Access.read(client.open_session(run.id, kind, **fields))
        except InvalidRequest:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# -- exec: to the first byte of echo hi ------------------------------------------------------


def exec_once(client: Client, run: Run) -> dict[str, float]:
    t0 = time.perf_counter()
    access = open_session(client, run, "exec", command=["echo", "hi"])
    answered = time.perf_counter()
    link = open_link(access)
    out: list[bytes] = []
    first: list[float] = []

    def output(channel: int, data: bytes) -> None:
        if not first:
            first.append(time.perf_counter())
        out.append(data)

    try:
        meet(link)
        met = time.perf_counter()
        code = pump_exec(link, output)
        exited = time.perf_counter()
    finally:
        link.close()
    if (code, b"".join(out)) != (0, b"hi\n"):
        raise RuntimeError(f"exec gave {code}, {b''.join(out)!r}")
    return {
        "POST -> session answered": answered - t0,
        "POST -> worker's HELLO (taken, docker exec made)": met - t0,
        "POST -> first byte of output": first[0] - t0,
        "POST -> EXIT": exited - t0,
    }


def docker_exec_first_byte(container_id: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(["docker", "exec", container_id, "echo", "hi"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.read(1)
    elapsed = time.perf_counter() - t0
    proc.communicate()
    return elapsed


# -- keystroke: one byte and its echo through cat on a terminal ------------------------------


def keystrokes(client: Client, run: Run, n: int) -> list[float]:
    command = ["sh", "-c", "stty raw -echo; echo ready; exec cat"]
    access = open_session(client, run, "exec", command=command, tty=True, stdin=True, term="xterm", rows=24, cols=80)
    link = open_link(access)

    def until(marker: bytes) -> None:
        seen = b""
        while marker not in seen:
            frame = link.receive(timeout=10)
            if frame is None:
                raise RuntimeError(f"no {marker!r} from the terminal within 10 s (had {seen!r})")
            if frame.type == FrameType.DATA and frame.channel == STDOUT:
                seen += frame.payload
            elif frame.type in (FrameType.EXIT, FrameType.GONE):
                raise RuntimeError(f"the terminal session ended: {frame.payload!r}")

    samples: list[float] = []
    try:
        meet(link, (24, 80))
        until(b"ready")
        for i in range(n + 10):  # 10 to warm up
            key = bytes([ord("a") + i % 26])
            t = time.perf_counter()
            link.send(FrameType.DATA, STDIN, key)
            until(key)
            if i >= 10:
                samples.append(time.perf_counter() - t)
    finally:
        link.close()
        with contextlib.suppress(Exception):
            client.close_session(run.id, access.session_id)
    return samples


# -- port-forward: 64 MiB out of the run -----------------------------------------------------


def fetch(sock: socket.socket) -> int:
    """Ask the run's httpd for the blob over ``sock``; the bytes that came (headers included)."""
    buf = bytearray(1 << 20)
    got = 0
    with sock:
        sock.sendall(REQUEST)
        while n := sock.recv_into(buf):
            got += n
    return got


def same_bytes(*connects: Callable[[], socket.socket]) -> None:
    """The blob comes the same every way (checked once, untimed; its headers hold the time: not them)."""
    seen = set()
    for connect in connects:
        with connect() as sock:
            sock.sendall(REQUEST)
            answer = b"".join(iter(lambda: sock.recv(1 << 20), b""))
            seen.add(hashlib.sha256(answer.partition(b"\r\n\r\n")[2]).hexdigest())
    if len(seen) != 1:
        raise RuntimeError("the blob came different through the forward and directly")


def timed_fetch(connect: Callable[[], socket.socket]) -> float:
    t = time.perf_counter()
    got = fetch(connect())
    elapsed = time.perf_counter() - t
    if got < SIZE:
        raise RuntimeError(f"{got} bytes came, not {SIZE} and headers")
    return elapsed


def docker_exec_fetch(container_id: str) -> float:
    script = f"printf 'GET /blob HTTP/1.0\\r\\n\\r\\n' | nc 127.0.0.1 {PORT}"
    t = time.perf_counter()
    proc = subprocess.Popen(["docker", "exec", container_id, "sh", "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    got = 0
    while chunk := proc.stdout.read1(1 << 20):
        got += len(chunk)
    proc.wait()
    elapsed = time.perf_counter() - t
    if got < SIZE:
        raise RuntimeError(f"{got} bytes came through docker exec, not {SIZE}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15, help="measured execs (default 15)")
    parser.add_argument("--keys", type=int, default=200, help="measured keystrokes (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="measured 64 MiB fetches of each path (default 5)")
    parser.add_argument(
        "--cloud", choices=["local", "aws", "azure"], default="local", help="the dev stack's cloud (default local)"
    )
    args = parser.parse_args()

    print(f"cloud {args.cloud}; {load()}")
    with dev_stack(POOLS_YAML, AGENT_ARGS, wait_agents=True, cloud=args.cloud) as stack:
        wait_workers(stack.api_url, 1)
        client, engine = Client(stack.api_url, "bench"), docker.from_env()
        run = client.submit(SERVE, name="bench-sessions")
        try:
            deadline = time.monotonic() + 120
            while run.refresh(wait=5).state != "running":
                if run.done or time.monotonic() > deadline:
                    raise RuntimeError(f"run {run.id} is {run.state}, not running")
            (container,) = engine.containers.list(filters={"label": f"io.runplane.run_id={run.id}"})
            pid = int(container.attrs["State"]["Pid"])
            direct = lambda: netns.dial(pid, container.id, PORT)  # noqa: E731
            while True:  # httpd up (the blob written first)
                with contextlib.suppress(netns.DialFailed):
                    direct().close()
                    break
                time.sleep(0.1)

            steps: dict[str, list[float]] = {}
            bare: list[float] = []
            for i in range(args.n + 2):  # 2 to warm up
                time.sleep(random.uniform(0, 1))  # at any phase of the worker's 1 s look, not in step with it
                marks = exec_once(client, run)
                first = docker_exec_first_byte(container.id)
                if i >= 2:
                    for label, value in marks.items():
                        steps.setdefault(label, []).append(value)
                    bare.append(first)

            keys = keystrokes(client, run, args.keys)

            forward_s: list[float] = []
            direct_s: list[float] = []
            piped_s: list[float] = []
            with run.port_forward(PORT) as fwd:
                through = lambda: socket.create_connection(("127.0.0.1", fwd.local_port))  # noqa: E731
                same_bytes(through, direct)  # and a warm-up
                paths: list[tuple[list[float], Callable[[], float]]] = [
                    (forward_s, lambda: timed_fetch(through)),
                    (direct_s, lambda: timed_fetch(direct)),
                    (piped_s, lambda: docker_exec_fetch(container.id)),
                ]
                for i in range(args.rounds):
                    for samples, path in paths[i % 3 :] + paths[: i % 3]:
                        samples.append(path())
        finally:
            if not run.refresh().done:
                run.kill()
    print(f"done; {load()}")

    show(
        f"exec of `echo hi` into a running run ({args.n} sessions, one at a time; the worker's control look is 1 s)",
        [*steps.items(), ("reference: docker exec, to its first byte", bare)],
    )
    show("keystroke round trip on a terminal", [("one byte to `cat` (raw mode) and its echo back", keys)])
    mib = SIZE / (1 << 20)
    rate = {label: [mib / s for s in samples] for label, samples in (("f", forward_s), ("d", direct_s))}
    show(
        f"{mib:.0f} MiB out of a run without network, one connection ({args.rounds} rounds)",
        [
            ("runplane port-forward (Run.port_forward)", forward_s),
            ("direct: a socket in the run's namespace (setns)", direct_s),
            ("reference: docker exec nc, its stdout", piped_s),
        ],
        unit="s",
        scale=1.0,
    )
    print(
        f"\n  throughput: port-forward {median(rate['f']):.0f} MiB/s, direct {median(rate['d']):.0f} MiB/s, "
        f"docker exec {mib / median(piped_s):.0f} MiB/s"
    )
    print(
        "  (direct is the kernel's loopback, one copy; the forward carries each byte through three processes,"
        " the client, the relay and the agent, as WebSocket frames)"
    )
    first = steps["POST -> first byte of output"]
    if args.cloud != "local":  # a fake of the cloud's relay: measured, no target
        print(f"  ({args.cloud}: exec to the first byte, p95 {pct(first, 0.95):.2f}s; no target)")
        return 0
    print(
        f"RESULT sessions_exec: p95 {pct(first, 0.95):.2f}s from exec to the first byte "
        f"(median {median(first):.2f}s; target p95 <= {TARGET_EXEC_P95:g}s)"
    )
    print(
        ratio_line(
            "sessions_port_forward (throughput, port-forward / direct)",
            median(rate["f"]) / median(rate["d"]),
            TARGET_FORWARD,
            ">=",
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
