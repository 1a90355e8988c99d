"""Log reads against a stream of many chunks, on S3 (an in-process moto server on 127.0.0.1).

A run that prints a byte a second leaves a chunk a second (600,000 in a week). Each read is timed
on a stream of ``--small`` chunks, then on one of ``--chunks`` chunks; RATIO is large over small
for the read where a follower waits (the end of the stream), the read that looks up most. The
listing of the whole stream, which every read made before, is timed beside them.

    python bench/log_reads.py [--rounds 20] [--chunks 5000] [--small 100]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _common import free_port, local_aws_env, median, ratio_line, table

BUCKET = "runplane-bench-logs"
PIECE = b"x" * 9 + b"\n"  # ten bytes a chunk


class Counted:
    """The real store, counting the requests a read makes (what S3 bills, whatever moto's speed)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.lists, self.listed, self.gets = inner, 0, 0, 0

    def get_bytes(self, key: str) -> bytes:
        self.gets += 1
        return bytes(self.inner.get_bytes(key))

    def list_page(self, prefix: str, cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
        found, after = self.inner.list_page(prefix, cursor, limit)
        self.lists, self.listed = self.lists + 1, self.listed + len(found)
        return found, after

    def list(self, prefix: str) -> list[Any]:
        found = self.inner.list(prefix)
        self.lists, self.listed = self.lists + 1 + len(found) // 1000, self.listed + len(found)
        return list(found)


def timed(call: Callable[[], Any], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


def measure(objects: Any, chunks: int, rounds: int) -> list[tuple[str, list[float]]]:
    """Writes a stream of ``chunks`` ten-byte chunks and times each read of it."""
    from runplane.domain.runs import Run, RunSpec
    from runplane.domain.states import RunState
    from runplane.services.logs import log_chunk_key, log_prefix, read_logs

    run = Run(id=f"r-bench-{chunks}", owner="bench", queue="default", spec=RunSpec(command="true"), created_at=0.0)
    run = run.model_copy(update={"state": RunState.SUCCEEDED, "attempt": 1})
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        keys = [log_chunk_key(run.id, 1, "stdout", i * len(PIECE)) for i in range(chunks)]
        list(pool.map(lambda key: objects.put_bytes(key, PIECE), keys))
    print(f"{chunks} chunks written in {time.perf_counter() - t0:.1f}s")
    size = chunks * len(PIECE)
    reads: dict[str, Callable[[Any], Any]] = {
        "first page (offset 0)": lambda store: read_logs(store, run, "stdout", 0),
        "middle (a next_offset)": lambda store: read_logs(store, run, "stdout", size // 20 * 10),
        "inside a chunk": lambda store: read_logs(store, run, "stdout", size // 2 + 3),
        "the end (a follower waits)": lambda store: read_logs(store, run, "stdout", size),
        "list the whole stream (every read, before)": lambda store: store.list(log_prefix(run.id, 1, "stdout")),
    }
    rows = []
    for label, read in reads.items():
        counted = Counted(objects)
        read(counted)  # warms up, and counts the requests
        print(f"  {label}: {counted.lists} listing request(s), {counted.listed} keys, {counted.gets} GET(s)")
        rounds_here = rounds if "whole" not in label else max(3, rounds // 5)
        rows.append((f"{label}, {chunks} chunks", timed(lambda read=read: read(objects), rounds_here)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=5_000)
    parser.add_argument("--small", type=int, default=100)
    args = parser.parse_args()
    local_aws_env()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from moto.server import ThreadedMotoServer

    from runplane.adapters.aws.clients import AwsConfig, make_client
    from runplane.adapters.aws.s3 import S3ObjectStore

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = make_client("s3", AwsConfig(endpoint_url=f"http://127.0.0.1:{port}"))
        client.create_bucket(Bucket=BUCKET)
        objects = S3ObjectStore(BUCKET, client)
        small, large = measure(objects, args.small, args.rounds), measure(objects, args.chunks, args.rounds)
    finally:
        server.stop()
    table("log reads (S3 on moto)", small + large)
    print(ratio_line("log read at the end, large/small stream", median(large[3][1]) / median(small[3][1]), 2.0))


if __name__ == "__main__":
    main()
