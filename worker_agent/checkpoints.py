"""A run's checkpoint series in the object store: ``sync`` a checkpoint directory into it (blobs first,
the manifest last), ``restore`` the newest complete checkpoint into an empty directory, ``prune`` the
old ones. Keys and the manifest: ``runplane.domain.checkpoints``; the file system side:
``checkpoint_files``.

One writer at a time: the worker that holds the run's lease syncs and prunes its series; ``prune``
must not run while a sync of the same series is under way (it would take that sync's blobs, which no
manifest names yet, for leftovers).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runplane.domain.checkpoints import (
    MAX_ENTRIES,
    PERMISSION_BITS,
    CheckpointCancelled,
    CheckpointFile,
    CheckpointTooLarge,
    CheckpointUnusable,
    Manifest,
    blob_key,
    manifest_key,
)
from runplane.domain.common import SCHEMA_VERSION
from runplane.domain.errors import LeaseLost
from runplane.domain.wire import written_json
from runplane.ports import MAX_DELETE, ObjectStore
from runplane.services.checkpoints import blob_sizes, complete, manifests, newest, read_manifest
from worker_agent.checkpoint_files import Found, Owner, Progress, shown, staged, walk, write_tree
from worker_agent.trees import Refused, open_beneath

__all__ = ["CheckpointLimits", "Progress", "Pruned", "prune", "restore", "sync", "write"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointLimits:
    """What one checkpoint may hold: ``max_bytes`` (the run's disk limit; None: no cap) in all its
    files, ``max_entries`` files and directories."""

    max_bytes: int | None = None
    max_entries: int = MAX_ENTRIES


def sync(
    store: ObjectStore,
    run_id: str,
    directory: Path,
    previous: Manifest | None,
    limits: CheckpointLimits = CheckpointLimits(),
    *,
    attempt: int = 0,
    clock: Callable[[], float] = time.time,
    scratch: Path | None = None,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    held: Callable[[], bool] = lambda: True,
) -> Manifest:
    """Make the next checkpoint of ``run_id``'s series from ``directory`` as it is now, and return its
    manifest. ``previous`` is the checkpoint of this series the directory was restored from or synced
    to last (its blobs are taken to be stored): a file whose size, mode and modification time are
    still the ones it names is taken as it was, unread, and only contents it does not hold are
    uploaded (each once). Each file read is copied as it is hashed (in memory, or in a file under
    ``scratch``), so what is uploaded is what was hashed, however the run changes it meanwhile.

    The manifest is written last, numbered after every one the series holds: a sync that fails or
    is killed before leaves no new manifest (its blobs are left for ``prune``). Raises
    CheckpointTooLarge, before anything is uploaded when the walk finds the directory over
    ``limits`` (and as soon as a file grows past them while read); CheckpointCancelled once
    ``cancelled()`` says so (asked before each file, each chunk read, each upload and the manifest);
    LeaseLost when ``held()``, asked right before the manifest is written, says this worker no
    longer holds the run (the series has one writer: the run's holder); and what the store raises.
    A blob of ``previous`` no longer stored (pruned meanwhile by a worker that lost the run) is
    uploaded again.

    Returns ``previous`` itself, having written and listed nothing, when it is of this series and the
    walk finds exactly its files (each at its size, mode and modification time) and directories: a
    sync of a directory that did not change costs a walk."""
    progress = progress if progress is not None else Progress()
    found = walk(directory, limits.max_bytes, limits.max_entries, progress)
    if previous is not None and previous.series != run_id:  # another run's (a run started from it): none stored here
        previous = None
    if previous is not None and _unchanged(found, previous):
        return previous
    stored = blob_sizes(store, run_id) if previous is not None else {}
    before = {f.path: f for f in previous.files if stored.get(f.key) == f.size} if previous is not None else {}
    have = {f.sha256 for f in before.values()}
    files: list[CheckpointFile] = []
    total = 0
    with tempfile.TemporaryDirectory(prefix=".rp-checkpoint-", dir=scratch) as stage_dir:
        for rel in found.files:
            _go_on(cancelled, run_id)
            room = None if limits.max_bytes is None else limits.max_bytes - total
            taken = _take(
                store, run_id, directory, rel, before.get(rel), have, room, Path(stage_dir), progress, cancelled
            )
            if taken is not None:
                files.append(taken)
                total += taken.size
                progress.files += 1
                progress.bytes += taken.size
    _go_on(cancelled, run_id)
    if not held():
        raise LeaseLost(f"run {run_id} was taken away from this worker: its checkpoint's manifest is not written")
    last = max([seq for seq, _ in manifests(store, run_id)] + [previous.seq if previous is not None else 0])
    manifest = Manifest(
        series=run_id,
        seq=last + 1,
        attempt=attempt,
        created_at=clock(),
        files=files,
        dirs=found.dirs,
        total_bytes=total,
    )
    store.put_bytes(manifest_key(run_id, manifest.seq), written_json(manifest).encode())
    return manifest


def _unchanged(found: Found, previous: Manifest) -> bool:
    """The walk found the files and directories ``previous`` names, and no other, each as it names it."""
    if {(d.path, d.mode) for d in found.dirs} != {(d.path, d.mode) for d in previous.dirs}:
        return False
    named = {f.path: (f.size, f.mode, f.mtime_ns) for f in previous.files}
    return named == found.seen


def _go_on(cancelled: Callable[[], bool], run_id: str) -> None:
    if cancelled():
        raise CheckpointCancelled(f"the checkpoint sync of run {run_id} was given up before its manifest was written")


def _take(
    store: ObjectStore,
    run_id: str,
    directory: Path,
    rel: str,
    before: CheckpointFile | None,
    have: set[str],
    room: int | None,
    stage_dir: Path,
    progress: Progress,
    cancelled: Callable[[], bool],
) -> CheckpointFile | None:
    """The file at ``rel`` as the checkpoint keeps it, its blob uploaded unless the series has it;
    None when it is no regular file beneath the directory any more (named in ``progress``)."""
    try:
        fd = open_beneath(directory, rel)
    except Refused as e:
        progress.skip(f"{shown(rel)} ({e})")
        return None
    try:
        info = os.fstat(fd)
        mode, mtime_ns = info.st_mode & PERMISSION_BITS, info.st_mtime_ns
        if before is not None and (before.size, before.mode, before.mtime_ns) == (info.st_size, mode, mtime_ns):
            if room is not None and before.size > room:
                raise CheckpointTooLarge(f"the checkpoint directory grew past its cap while read ({rel[:80]!r})")
            return before
        with staged(fd, room, stage_dir, progress, cancelled) as copy:
            key = blob_key(run_id, copy.sha256)
            if copy.sha256 not in have:
                _go_on(cancelled, run_id)  # a large upload is not begun for a sync given up
                if copy.data is not None:
                    store.put_bytes(key, copy.data)
                elif copy.path is not None:
                    store.put_file(key, copy.path)
                have.add(copy.sha256)
                progress.uploaded += 1
                progress.uploaded_bytes += copy.size
            return CheckpointFile(path=rel, size=copy.size, sha256=copy.sha256, mode=mode, mtime_ns=mtime_ns, key=key)
    finally:
        os.close(fd)


def restore(
    store: ObjectStore,
    run_id: str,
    directory: Path,
    limits: CheckpointLimits = CheckpointLimits(),
    *,
    owner: Owner | None = None,
    progress: Progress | None = None,
) -> Manifest | None:
    """Write the newest complete checkpoint of ``run_id``'s series into ``directory`` (an empty
    directory, made if missing) and return its manifest; None when the series has none. Complete: a
    manifest that reads (``domain.checkpoints.Manifest``: no path outside the directory, no mode
    beyond permissions, every blob its own series') of this series, each of whose blobs is stored at
    its size; one that is not is passed over with a log line, for the one before it.

    Each file is written beside its place and renamed into it, with its mode, modification time and
    ``owner`` (uid, gid), after its size and SHA-256 are checked. Raises CheckpointTooLarge when the
    checkpoint is over ``limits`` (nothing written), CheckpointUnusable (a blob that is not what its
    manifest says, a ``directory`` that is no empty directory) and what the store raises: then
    ``directory`` is left empty."""
    chosen = newest(store, run_id)
    if chosen is not None:
        write(store, chosen, directory, limits, owner=owner, progress=progress)
    return chosen


def write(
    store: ObjectStore,
    chosen: Manifest,
    directory: Path,
    limits: CheckpointLimits = CheckpointLimits(),
    *,
    owner: Owner | None = None,
    progress: Progress | None = None,
) -> None:
    """Write the checkpoint ``chosen`` (a complete one: ``newest``, ``numbered``) into ``directory``,
    as ``restore`` does, raising what it raises."""
    progress = progress if progress is not None else Progress()
    run_id = chosen.series
    if chosen.v > SCHEMA_VERSION:  # it may hold what this release cannot write back: none of it is written
        raise CheckpointUnusable(
            f"checkpoint {chosen.seq} of run {run_id} was written by a later release of runplane (its manifest's "
            f"version {chosen.v}; this worker's agent reads up to {SCHEMA_VERSION}): upgrade the pool's agents"
        )
    if limits.max_bytes is not None and chosen.total_bytes > limits.max_bytes:
        raise CheckpointTooLarge(
            f"checkpoint {chosen.seq} of run {run_id} holds {chosen.total_bytes} bytes, more than {limits.max_bytes}"
        )
    if len(chosen.files) + len(chosen.dirs) > limits.max_entries:
        raise CheckpointTooLarge(
            f"checkpoint {chosen.seq} of run {run_id} holds more than {limits.max_entries} files and directories"
        )

    def fetch(f: CheckpointFile, path: Path) -> None:
        store.download_file(f.key, path, max_bytes=f.size)

    write_tree(chosen, directory, fetch, owner, progress)


@dataclass(frozen=True)
class Pruned:
    manifests: int
    blobs: int


def prune(store: ObjectStore, run_id: str, keep: int = 2) -> Pruned:
    """Keep the newest ``keep`` complete checkpoints of ``run_id``'s series; delete the manifests older
    than the newest of them that are not kept, and every blob no manifest left names (those of syncs
    cut halfway too). Of a series without a complete checkpoint, only the blobs no manifest names are
    deleted. Not while a sync of the series is under way (see the module). Returns what it deleted."""
    if keep < 1:
        raise ValueError("keep at least one checkpoint")
    blobs = blob_sizes(store, run_id)
    listed = manifests(store, run_id)
    read = {seq: read_manifest(store, run_id, seq, info) for seq, info in listed}
    whole = [seq for seq, _ in reversed(listed) if (m := read[seq]) is not None and complete(m, blobs, run_id)]
    kept = set(whole[:keep])
    newest_kept = whole[0] if whole else 0
    gone = [seq for seq, _ in listed if seq < newest_kept and seq not in kept]
    named = {f.key for seq, m in read.items() if m is not None and seq not in gone for f in m.files}
    old_blobs = sorted(key for key in blobs if key not in named)
    _delete(store, [manifest_key(run_id, seq) for seq in gone])
    _delete(store, old_blobs)
    return Pruned(len(gone), len(old_blobs))


def _delete(store: ObjectStore, keys: list[str]) -> None:
    for start in range(0, len(keys), MAX_DELETE):
        store.delete(keys[start : start + MAX_DELETE])
