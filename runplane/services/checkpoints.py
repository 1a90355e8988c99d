"""Reading a run's checkpoint series in the object store (keys and the manifest:
``runplane.domain.checkpoints``): which checkpoints it holds, and which of them are complete (a
manifest that reads, of this series and number, whose every blob is stored at its size). The API
(a run's checkpoint page, ``from_checkpoint`` at submit) and the agent (restore, sync, prune) read
it alike; only the agent writes it (``worker_agent.checkpoints``)."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from runplane.domain.checkpoints import (
    MAX_MANIFEST_BYTES,
    Manifest,
    blobs_prefix,
    checkpoints_prefix,
    manifest_key,
    manifest_seq,
)
from runplane.domain.errors import NotFound
from runplane.domain.wire import stored
from runplane.ports import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

LIST_PAGE = 1000


def newest(store: ObjectStore, run_id: str) -> Manifest | None:
    """The newest complete checkpoint of ``run_id``'s series (see the module), or None."""
    blobs = blob_sizes(store, run_id)
    for seq, info in reversed(manifests(store, run_id)):
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
