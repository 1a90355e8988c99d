"""The cost of taking a run hint off the local queue (SQLite, what ``runplane dev`` and ``runplane
serve`` use) as its backlog grows: receive one message and delete it, with 10, 100, 1,000 and
10,000 messages queued (each taken message is sent again, untimed, so the backlog stays where it
is), and with 10,000 more in flight (received, invisible) ahead of a small visible backlog. A
receive is an indexed query: flat means ~1x.

RATIO 10,000 / 10 of the median receive + delete.

    python bench/queue_receive.py [--rounds 300] [--sizes 10,100,1000,10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import median, ratio_line, table

from runplane.adapters.local.db import Database
from runplane.adapters.local.queues import SqliteRunQueue
from runplane.domain.messages import RunMessage

TARGET = 1.2


def fill(queue: SqliteRunQueue, pool: str, count: int) -> float:
    """Send ``count`` hints to ``pool``; the seconds it took."""
    t0 = time.perf_counter()
    for i in range(count):
        queue.send(pool, RunMessage(run_id=f"r-{pool}-{i}", attempt=0))
    return time.perf_counter() - t0


def receive_delete(queue: SqliteRunQueue, pool: str, rounds: int) -> list[float]:
    """``rounds`` timed receive + delete of one message; each is sent back afterwards, untimed."""
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        [delivery] = queue.receive(pool, 1, wait_seconds=0, visibility_seconds=300)
        queue.delete(pool, delivery)
        samples.append(time.perf_counter() - t0)
        queue.send(pool, delivery.message)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--sizes", default="10,100,1000,10000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    with tempfile.TemporaryDirectory(prefix="runplane-queue-bench-") as work:
        queue = SqliteRunQueue(Database.at(Path(work) / "state"))
        rows: list[tuple[str, list[float]]] = []
        for size in sizes:
            pool = f"p{size}"
            took = fill(queue, pool, size)
            print(f"queued {size} on {pool} in {took:.2f} s ({took / size * 1e6:.0f} us a send)")
            receive_delete(queue, pool, 20)  # warm
            rows.append((f"{size} queued", receive_delete(queue, pool, args.rounds)))

        inflight = max(sizes)  # received and invisible, ahead (in the index) of a small visible backlog
        fill(queue, "busy", inflight)
        while queue.receive("busy", 100, wait_seconds=0, visibility_seconds=3600):
            pass
        fill(queue, "busy", min(sizes))
        receive_delete(queue, "busy", 20)
        rows.append((f"{min(sizes)} queued, {inflight} in flight", receive_delete(queue, "busy", args.rounds)))

        table(f"receive + delete of one message ({args.rounds} rounds)", rows)
        print()
        first, last = rows[0], rows[len(sizes) - 1]
        print(ratio_line(f"queue receive+delete {last[0]} / {first[0]}", median(last[1]) / median(first[1]), TARGET))


if __name__ == "__main__":
    main()
