"""Output upload throughput: the agent's ``upload_dir`` vs plain boto3 ``upload_file`` loops.

An in-process moto server (``ThreadedMotoServer`` on 127.0.0.1) stands in for S3. One output
directory, 8 files of 8 MiB plus 200 files of 16 KiB in a subdirectory (70.4 MB), is uploaded
under a new prefix each time by:

* runplane: ``worker_agent.outputs.upload_dir(S3ObjectStore(bucket, client), dir, prefix, deadline)``
  (8 threads, each ``put_file`` an ``upload_file`` with the store's TransferConfig);
* bare sequential: ``client.upload_file`` of each file in turn, default TransferConfig;
* bare threaded: the same calls from a ``ThreadPoolExecutor(8)``, for a like-for-like comparison.

All three use the same client (``runplane.adapters.aws.clients.make_client``, 32 pooled
connections). Paths rotate order each repetition; after each upload its objects are counted and
deleted (not timed), so moto's memory stays flat. MB are 10**6 bytes. With moto in the same
process, the uploading threads and the server share one interpreter and its lock, so the numbers
are about the client-side path, not S3.

RATIO is runplane MB/s / bare sequential MB/s (target >= 0.8); the ratio to bare threaded is
printed above it.

    python bench/upload_throughput.py [--n 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import free_port, local_aws_env, median, ratio_line, table

TARGET = 0.8
BUCKET = "runplane-bench-uploads"
BIG = (8, 8 * 1024**2)  # count, bytes
SMALL = (200, 16 * 1024)
DEADLINE_SECONDS = 120.0
THREADS = 8
PATHS = ("runplane upload_dir", "bare sequential upload_file", "bare threaded upload_file (8)")


def make_tree(root: Path, big: int = BIG[0], small: int = SMALL[0]) -> list[tuple[str, Path]]:
    """The output directory: big files at the top, small ones in a subdirectory."""
    (root / "small").mkdir(parents=True)
    for i in range(big):
        (root / f"big-{i}.bin").write_bytes(os.urandom(BIG[1]))
    for i in range(small):
        (root / "small" / f"part-{i:03d}.bin").write_bytes(os.urandom(SMALL[1]))
    return sorted((str(p.relative_to(root)), p) for p in root.rglob("*") if p.is_file())


class UploadBench:
    def __init__(self, client: Any, root: Path, files: list[tuple[str, Path]]) -> None:
        from runplane.adapters.aws.s3 import S3ObjectStore

        self.client = client
        self.store = S3ObjectStore(BUCKET, client)
        self.root = root
        self.files = files
        self.total = sum(p.stat().st_size for _, p in files)
        self.samples: dict[str, list[float]] = {label: [] for label in PATHS}
        self.count = 0
        self.name = root.name

    def runplane(self, prefix: str) -> None:
        from worker_agent.outputs import upload_dir

        report = upload_dir(self.store, self.root, prefix, DEADLINE_SECONDS)
        if report.error or report.files != len(self.files):
            raise RuntimeError(f"upload_dir: {report.files} file(s), error {report.error}")

    def bare_sequential(self, prefix: str) -> None:
        for rel, path in self.files:
            self.client.upload_file(str(path), BUCKET, prefix + rel)

    def bare_threaded(self, prefix: str) -> None:
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            futures = [pool.submit(self.client.upload_file, str(p), BUCKET, prefix + rel) for rel, p in self.files]
            for future in futures:
                future.result()

    def clear(self, prefix: str) -> None:
        """Check every file arrived, then delete them (not timed)."""
        keys = [
            o["Key"]
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])
        ]
        if len(keys) != len(self.files):
            raise RuntimeError(f"{prefix}: {len(keys)} object(s) stored, {len(self.files)} expected")
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(
                Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True}
            )

    def timed(self, upload: Callable[[str], None]) -> float:
        self.count += 1
        prefix = f"outputs/{self.name}-{self.count}/"
        t = time.perf_counter()
        upload(prefix)
        elapsed = time.perf_counter() - t
        self.clear(prefix)
        return elapsed

    def rounds(self, n: int) -> None:
        paths = list(zip(PATHS, (self.runplane, self.bare_sequential, self.bare_threaded), strict=True))
        for i in range(n):
            for label, upload in paths[i % len(paths) :] + paths[: i % len(paths)]:
                self.samples[label].append(self.timed(upload))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5, help="measured repetitions of each path (default 5)")
    args = parser.parse_args()
    local_aws_env()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from moto.server import ThreadedMotoServer

    from runplane.adapters.aws.clients import AwsConfig, make_client

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    tmp = Path(tempfile.mkdtemp(prefix="runplane-bench-upload-"))
    try:
        client = make_client("s3", AwsConfig(endpoint_url=f"http://127.0.0.1:{port}"))
        client.create_bucket(Bucket=BUCKET)
        t0 = time.perf_counter()
        files = make_tree(tmp / "output")
        bench = UploadBench(client, tmp / "output", files)
        print(
            f"moto http://127.0.0.1:{port} (in-process); {len(files)} files, {bench.total / 1e6:.1f} MB "
            f"({BIG[0]} x {BIG[1] // 1024**2} MiB + {SMALL[0]} x {SMALL[1] // 1024} KiB) written in "
            f"{time.perf_counter() - t0:.2f}s"
        )
        t0 = time.perf_counter()
        warm = UploadBench(client, tmp / "warm-up", make_tree(tmp / "warm-up", 1, 20))
        for upload in (warm.runplane, warm.bare_sequential, warm.bare_threaded):
            warm.timed(upload)
        print(f"warm-up (1 big + 20 small files, each path) {time.perf_counter() - t0:.1f}s; {args.n} repetitions")
        t0 = time.perf_counter()
        bench.rounds(args.n)
        print(f"repetitions took {time.perf_counter() - t0:.1f}s")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    s = bench.samples
    table(f"time to upload the directory ({bench.total / 1e6:.1f} MB, {len(files)} files)", list(s.items()))
    rates = {label: [bench.total / 1e6 / t for t in samples] for label, samples in s.items()}
    table("throughput (MB/s; p90 is of the per-repetition rates)", list(rates.items()), unit="MB/s", scale=1.0)
    ours = median(rates[PATHS[0]])
    print(f"\n  runplane / bare threaded: {ours / median(rates[PATHS[2]]):.2f}x")
    print(
        ratio_line("upload_throughput (runplane / bare sequential MB/s)", ours / median(rates[PATHS[1]]), TARGET, ">=")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
