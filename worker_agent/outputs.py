"""Upload a run's output directory: concurrently, with a deadline, never leaving the directory."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from runplane.ports import ObjectStore


@dataclass
class UploadReport:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    error: str | None = None


def collect(root: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """Regular files under ``root`` as (relative path, real path). Symlinks are followed only
    when they resolve inside ``root``; anything else is skipped and named."""
    root = root.resolve()
    files: list[tuple[str, Path]] = []
    skipped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in list(dirnames):
            if (base / name).is_symlink():
                skipped.append(str((base / name).relative_to(root)) + "/ (symlinked directory)")
                dirnames.remove(name)
        for name in filenames:
            path = base / name
            rel = str(path.relative_to(root))
            real = path.resolve()
            if path.is_symlink() and not real.is_relative_to(root):
                skipped.append(f"{rel} (symlink out of the output directory)")
                continue
            if not real.is_file():
                skipped.append(f"{rel} (not a regular file)")
                continue
            files.append((rel, real))
    return sorted(files), skipped


def upload_dir(
    objects: ObjectStore, root: Path, prefix: str, deadline_seconds: float, workers: int = 8
) -> UploadReport:
    """Upload every file of ``root`` under ``prefix``. Never raises: problems land in ``error``."""
    report = UploadReport()
    if not root.exists():
        return report
    files, report.skipped = collect(root)
    if not files:
        return report
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="upload")
    try:
        futures = {pool.submit(objects.put_file, prefix + rel, real): (rel, real) for rel, real in files}
        done, pending = wait(futures, timeout=deadline_seconds, return_when=FIRST_EXCEPTION)
        for future in done:
            exc = future.exception()
            if exc is None:
                report.files += 1
                report.bytes += futures[future][1].stat().st_size
            elif report.error is None:
                report.error = f"upload of {futures[future][0]} failed: {exc}"
        if pending and report.error is None:
            report.error = f"{len(pending)} file(s) not uploaded within {deadline_seconds:g}s"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return report
