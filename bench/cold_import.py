"""Cold import of the API handler module vs ``import boto3``, each in a fresh interpreter.

A Lambda cold start pays for importing the handler module before the first request. Each
sample is a new ``python`` process that times ``import X`` with ``time.perf_counter`` around
the import statement (interpreter start-up is not counted; it is shown for reference). The two
imports alternate, and which goes first alternates too. One ``-X importtime`` run of the handler
import then shows where its time goes.

RATIO is handler import / boto3 import.

    python bench/cold_import.py [--n 15]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import ROOT, median, ratio_line, table

TARGET = 1.5
HANDLER = "functions.aws.api"
BASELINE = "boto3"
TOP = 8


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "POWERTOOLS_", "RUNPLANE_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # measure imports, not writing .pyc files
    return env


def timed_import(module: str) -> float:
    """Seconds spent in ``import module`` in a new interpreter."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(), check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def interpreter_start() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], cwd=ROOT, env=_env(), check=True)
    return time.perf_counter() - t


def import_profile(module: str) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) for every module ``-X importtime`` reports."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        cwd=ROOT,
        env=_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|", 2)
        rows.append((int(own), int(cumulative), name.strip()))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15, help="repetitions of each import (default 15)")
    args = parser.parse_args()

    samples: dict[str, list[float]] = {HANDLER: [], BASELINE: [], "start": []}
    for module in (HANDLER, BASELINE):  # warm the page cache
        timed_import(module)
    t0 = time.perf_counter()
    for i in range(args.n):
        order = (HANDLER, BASELINE) if i % 2 == 0 else (BASELINE, HANDLER)
        for module in order:
            samples[module].append(timed_import(module))
        samples["start"].append(interpreter_start())
    print(f"{args.n} repetitions each took {time.perf_counter() - t0:.1f}s ({sys.executable})")

    profile = import_profile(HANDLER)
    table(
        "cold import in a fresh interpreter (time inside the import statement)",
        [
            (f"import {HANDLER} (API handler)", samples[HANDLER]),
            (f"import {BASELINE}", samples[BASELINE]),
            ("interpreter start-up (python -c pass, reference)", samples["start"]),
        ],
    )
    print(f"\nslowest modules of `import {HANDLER}` (one -X importtime run)")
    print(f"  by own time{'':<44}by cumulative time (includes what it imports)")
    by_self = sorted(profile, key=lambda r: r[0], reverse=True)[:TOP]
    by_cumulative = sorted(profile, key=lambda r: r[1], reverse=True)[:TOP]
    for (own, _, name), (_, cumulative, cname) in zip(by_self, by_cumulative, strict=False):
        print(f"  {own / 1000:7.1f} ms  {name:<44.44}{cumulative / 1000:7.1f} ms  {cname}")
    print(
        ratio_line(
            f"cold_import ({HANDLER} / {BASELINE})", median(samples[HANDLER]) / median(samples[BASELINE]), TARGET
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
