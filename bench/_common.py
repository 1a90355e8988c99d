"""Small helpers shared by the benchmark scripts: percentiles, a table, the RATIO line."""

from __future__ import annotations

import math
import os
import socket
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/<name>.py` from anywhere
    sys.path.insert(0, str(ROOT))


def local_aws_env() -> None:
    """Credentials and region for the local AWS APIs (moto); nothing here reaches AWS."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def p90(samples: Sequence[float]) -> float:
    """The 90th percentile (nearest rank), so small samples still give an observed value."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def table(title: str, rows: Sequence[tuple[str, Sequence[float]]], unit: str = "ms", scale: float = 1000.0) -> None:
    """Print ``label  n  median  p90`` rows; samples are in seconds, shown in ``unit``."""
    width = max(len(label) for label, _ in rows)
    print(f"\n{title}")
    print(f"  {'path':<{width}}  {'n':>4}  {'median ' + unit:>12}  {'p90 ' + unit:>12}")
    for label, samples in rows:
        if not samples:
            print(f"  {label:<{width}}  {0:>4}  {'-':>12}  {'-':>12}")
            continue
        print(f"  {label:<{width}}  {len(samples):>4}  {median(samples) * scale:>12.2f}  {p90(samples) * scale:>12.2f}")


def ratio_line(name: str, ratio: float, target: float, op: str = "<=") -> str:
    """``op`` is ``<=`` for a slowdown (lower is better), ``>=`` for a throughput ratio."""
    return f"RATIO {name}: {ratio:.2f}x (target {op} {target:g})"
