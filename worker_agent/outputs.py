"""Upload a run's output directory: concurrently, with a deadline, never leaving the directory."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from runplane.ports import ObjectStore
from worker_agent.trees import Refused, Unwalkable, open_beneath, scan

BACKSLASH = "name holds a backslash"
"""Why a path holding ``\\`` is skipped: Azure reads it as ``/`` in a blob's name, so ``a\\..\\..\\b``
would name a key outside the run's outputs."""


@dataclass
class UploadReport:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    error: str | None = None


def judge(prefix: str, entry: os.DirEntry[str]) -> tuple[str, str | None] | None:
    """An entry a walk (trees.scan) met, as an upload sees it: None for a directory (or one gone
    meanwhile), else its path relative to the root and why it is not uploaded (None: it is: a
    regular file or a symlink, checked again when opened)."""
    rel = prefix + entry.name
    try:
        if entry.is_dir(follow_symlinks=False):
            return None
        regular = entry.is_symlink() or entry.is_file(follow_symlinks=False)
    except OSError:  # gone meanwhile
        return None
    if "\\" in rel:
        return rel, BACKSLASH
    return rel, None if regular else "not a regular file"


def collect(root: Path) -> tuple[list[str], list[str]]:
    """What to upload from ``root``: the paths (relative to it) of its regular files and
    symlinks, and the others, named with why they are skipped (a path holding a backslash too:
    BACKSLASH). Walked through directory descriptors (trees.scan): symlinked directories are
    never entered, nor are trees deeper than MAX_DEPTH. What each path is gets checked again
    when it is opened (``upload_file``)."""
    files: list[str] = []
    skipped: list[str] = []
    try:
        for prefix, entry in scan(root):
            if (judged := judge(prefix, entry)) is None:
                continue
            rel, why = judged
            if why is None:
                files.append(rel)
            else:
                skipped.append(f"{rel} ({why})")
    except Unwalkable as e:
        skipped.append(f"{e} (not read)")
    return sorted(files), skipped


def upload_file(objects: ObjectStore, root: Path, key: str, rel: str) -> int | str:
    """Upload the file at ``rel`` under ``root`` as it is when opened: a regular file reached
    without leaving ``root`` (trees.open_beneath), read through its descriptor, so nothing
    changed in the tree meanwhile can point the upload elsewhere. Returns its size, or why it
    is not uploaded. Raises what the store raises."""
    try:
        fd = open_beneath(root, rel)
    except Refused as e:
        return str(e)
    try:
        size = os.fstat(fd).st_size
        # the store opens the path by name: /proc/self/fd/N is this very open file, whatever
        # happens to the tree
        objects.put_file(key, Path(f"/proc/self/fd/{fd}"))
        return size
    finally:
        os.close(fd)


def upload_dir(
    objects: ObjectStore, root: Path, prefix: str, deadline_seconds: float, workers: int = 8
) -> UploadReport:
    """Upload every file of ``root`` under ``prefix``. Never raises: problems land in ``error``.
    Call it only once nothing writes to ``root`` any more (the run's container has exited):
    what is read is checked as it is opened, but a file that changes while it uploads uploads
    as it changes."""
    report = UploadReport()
    if not root.exists():
        return report
    files, report.skipped = collect(root)
    if not files:
        return report
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="upload")
    try:
        futures = {pool.submit(upload_file, objects, root, prefix + rel, rel): rel for rel in files}
        done, pending = wait(futures, timeout=deadline_seconds, return_when=FIRST_EXCEPTION)
        refused = []
        for future in done:
            exc = future.exception()
            if exc is not None:
                report.error = report.error or f"upload of {futures[future]} failed: {exc}"
                continue
            result = future.result()
            if isinstance(result, str):
                refused.append(f"{futures[future]} ({result})")
            else:
                report.files += 1
                report.bytes += result
        report.skipped += sorted(refused)
        if pending and report.error is None:
            report.error = f"{len(pending)} file(s) not uploaded within {deadline_seconds:g}s"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return report
