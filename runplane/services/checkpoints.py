"""Reading a run's checkpoint series in the object store (keys and the manifest:
``runplane.domain.checkpoints``): which checkpoints it holds, and which of them are complete (a
manifest that reads, of this series and number, whose every blob is stored at its size). The API
(a run's checkpoint page, ``from_checkpoint`` at submit) and the agent (restore, sync, prune) read
it alike; only the agent writes it (``worker_agent.checkpoints``).

What a caller may read of it: the checkpoint of a run of theirs (an admin: anyone's), a page of its
files at a time (``checkpoint_page``), and a run of their own to start from (``pinned_source``).
"""

from __future__ import annotations

import binascii
import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError

from runplane.domain.checkpoints import (
    MAX_MANIFEST_BYTES,
    MAX_SEQ,
    CheckpointFile,
    CheckpointSource,
    Manifest,
    blobs_prefix,
    checkpoints_prefix,
    manifest_key,
    manifest_seq,
)
from runplane.domain.cursors import decode_cursor, encode_cursor
from runplane.domain.errors import BadRequest, Conflict, NotFound
from runplane.domain.retention import OUTPUTS
from runplane.domain.runs import Run, RunSpec
from runplane.domain.tenancy import Principal
from runplane.domain.wire import stored
from runplane.ports import ObjectInfo, ObjectStore, Ports
from runplane.services.auth import check_owner

log = logging.getLogger(__name__)

LIST_PAGE = 1000
MAX_CHECKPOINT_PAGE = 500
"""Checkpoint files listed at most in one answer (as many as an outputs page)."""


def pinned_source(ports: Ports, principal: Principal, spec: RunSpec) -> CheckpointSource | None:
    """What a run submitted with ``spec`` starts from (``spec.from_checkpoint`` pinned to that run's
    newest complete checkpoint now), or None when it names no run. The run must be the caller's own
    (an admin's too: a checkpoint crosses to another owner only by its owner's hand). Raises
    NotFound, alike for a run that does not exist and another user's, and Conflict when the run has
    no complete checkpoint yet."""
    if spec.from_checkpoint is None:
        return None
    source = ports.store.get(spec.from_checkpoint)
    if source.owner != principal.user:
        raise NotFound(f"run {source.id} not found")
    found = newest(ports.objects, source.id)
    if found is None:
        gone = deleted_by_retention(source)
        if gone is not None:
            raise Conflict(f"{gone}: from_checkpoint needs one it keeps")
        raise Conflict(f"run {source.id} has no checkpoint yet: from_checkpoint needs one it has synced")
    return CheckpointSource(run=source.id, seq=found.seq)


@dataclass(frozen=True)
class CheckpointPart:
    """A page of a checkpoint's files (``checkpoint_page``)."""

    run: Run
    manifest: Manifest
    files: list[CheckpointFile]
    urls: list[str]
    """Each file's download URL (presigned for a limited time), in the order of ``files``."""
    first: bool
    """The first page: the one that names the checkpoint's directories."""
    next_cursor: str | None


def checkpoint_page(
    ports: Ports, principal: Principal, run_id: str, cursor: str | None, limit: int = MAX_CHECKPOINT_PAGE
) -> CheckpointPart:
    """A page of the files of the caller's run's checkpoint (an admin: anyone's): its own newest
    complete one, else the one it starts from (``restore_from``: that checkpoint, or that run's newest
    when it is gone); the pages after the first go on with the same checkpoint (the cursor names it).
    Raises NotFound (no such run, another user's, or no checkpoint yet), BadRequest for a cursor no
    page of this run gave, and Conflict when the checkpoint a cursor names is no longer kept."""
    run = check_run(ports, principal, run_id)
    if cursor is None:
        manifest, start = _shown(ports.objects, run), 0
    else:
        series, seq, start = _position(cursor, run)
        kept = _at(ports.objects, series, seq)
        if kept is None:
            raise Conflict(f"checkpoint {seq} of run {series} is no longer kept: list again from the start")
        manifest = kept
    end = start + min(limit, MAX_CHECKPOINT_PAGE)
    after = encode_cursor({"r": manifest.series, "q": manifest.seq, "i": end}) if end < len(manifest.files) else None
    files = manifest.files[start:end]
    return CheckpointPart(run, manifest, files, [ports.objects.url(f.key) for f in files], start == 0, after)


def check_run(ports: Ports, principal: Principal, run_id: str) -> Run:
    """The caller's run (an admin: anyone's); NotFound alike for another user's."""
    run = ports.store.get(run_id)
    check_owner(principal, run)
    return run


def _shown(store: ObjectStore, run: Run) -> Manifest:
    found = newest(store, run.id)
    source = run.restore_from
    if found is None and source is not None:
        found = numbered(store, source.run, source.seq) or newest(store, source.run)
    if found is None:
        raise NotFound(deleted_by_retention(run) or f"run {run.id} has no checkpoint yet")
    return found


def deleted_by_retention(run: Run) -> str | None:
    """``run X's checkpoints were deleted on DATE by its pool's retention`` for a run that synced one
    (its record says so) and whose outputs, its checkpoints with them, the retention sweep deleted;
    None otherwise."""
    if run.checkpoint is None or run.retention is None or OUTPUTS not in run.retention.deleted:
        return None
    at = run.retention.outputs_at
    day = "" if at is None else f" on {datetime.fromtimestamp(at, UTC).strftime('%Y-%m-%d %H:%M UTC')}"
    return f"run {run.id}'s checkpoints were deleted{day} by the retention of its pool {run.queue}"


def _position(cursor: str, run: Run) -> tuple[str, int, int]:
    """The series, checkpoint and file a ``next_cursor`` of ``run``'s checkpoint goes on from. Raises
    BadRequest for one that is not: a series other than the run's own or the one it starts from is
    refused, so no cursor reads another run's checkpoint."""
    try:
        data = decode_cursor(cursor, most=1024)
        series, seq, start = data["r"], data["q"], data["i"]
        if set(data) != {"r", "q", "i"} or not isinstance(series, str):
            raise ValueError
        if type(seq) is not int or type(start) is not int or not 1 <= seq <= MAX_SEQ or start < 1:
            raise ValueError
    except (ValueError, TypeError, KeyError, binascii.Error) as e:
        raise BadRequest("cursor is not valid; pass the next_cursor of a previous page") from e
    allowed = {run.id} | ({run.restore_from.run} if run.restore_from is not None else set())
    if series not in allowed:
        raise BadRequest("cursor is not one of this run's checkpoint: pass the next_cursor of a previous page")
    return series, seq, start


def _at(store: ObjectStore, series: str, seq: int) -> Manifest | None:
    """Checkpoint ``seq`` of ``series`` while its manifest is kept (it was complete when its first
    page was given; pruning deletes a manifest before its blobs)."""
    key = manifest_key(series, seq)
    found = [info for info in store.list(key) if info.key == key]
    return read_manifest(store, series, seq, found[0]) if found else None


def newest(store: ObjectStore, run_id: str, passing: Collection[int] = ()) -> Manifest | None:
    """The newest complete checkpoint of ``run_id``'s series (see the module), or None; one numbered in
    ``passing`` (found unusable by a restore) is passed over."""
    blobs = blob_sizes(store, run_id)
    for seq, info in reversed(manifests(store, run_id)):
        if seq in passing:
            continue
        manifest = read_manifest(store, run_id, seq, info)
        if manifest is not None and complete(manifest, blobs, run_id):
            return manifest
    return None


def numbered(store: ObjectStore, run_id: str, seq: int) -> Manifest | None:
    """Checkpoint ``seq`` of ``run_id``'s series when it is there and complete (see the module), or None."""
    key = manifest_key(run_id, seq)
    found = [info for info in store.list(key) if info.key == key]
    manifest = read_manifest(store, run_id, seq, found[0]) if found else None
    if manifest is None or not complete(manifest, blob_sizes(store, run_id), run_id):
        return None
    return manifest


def manifests(store: ObjectStore, run_id: str) -> list[tuple[int, ObjectInfo]]:
    """The series' manifests, oldest first. They are listed before its blobs (digits sort before
    ``blobs/``), so the listing stops at the first blob."""
    stop = blobs_prefix(run_id)
    found: list[tuple[int, ObjectInfo]] = []
    cursor: str | None = None
    while True:
        page, cursor = store.list_page(checkpoints_prefix(run_id), cursor, LIST_PAGE)
        for info in page:
            if info.key >= stop:
                return found
            seq = manifest_seq(run_id, info.key)
            if seq is not None:
                found.append((seq, info))
        if cursor is None:
            return found


def blob_sizes(store: ObjectStore, run_id: str) -> dict[str, int]:
    return {info.key: info.size for info in store.list(blobs_prefix(run_id))}


def read_manifest(store: ObjectStore, run_id: str, seq: int, info: ObjectInfo) -> Manifest | None:
    """The manifest at ``info``, or None (with a log line) when it is not one of this series that reads."""
    if info.size > MAX_MANIFEST_BYTES:
        log.warning("run %s: checkpoint %d passed over: its manifest holds %d bytes", run_id, seq, info.size)
        return None
    try:
        manifest = stored(Manifest, store.get_bytes(info.key))
    except NotFound:  # deleted meanwhile
        return None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        log.warning(
            "run %s: checkpoint %d passed over: its manifest does not read (%s%s)",
            run_id,
            seq,
            f"{where}: " if where else "",
            first["msg"][:200],
        )
        return None
    if (manifest.series, manifest.seq) != (run_id, seq):
        log.warning("run %s: checkpoint %d passed over: its manifest is of another series or number", run_id, seq)
        return None
    return manifest


def complete(manifest: Manifest, blobs: dict[str, int], run_id: str) -> bool:
    for f in manifest.files:
        if blobs.get(f.key) != f.size:
            log.warning(
                "run %s: checkpoint %d passed over: the blob of %r is missing or not of its size",
                run_id,
                manifest.seq,
                f.path[:80],
            )
            return False
    return True
