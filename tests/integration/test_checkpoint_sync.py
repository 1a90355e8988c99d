"""A run's checkpoint series on every object store (S3 on moto's server, Blob storage on Azurite, the
files of a stack on one machine): a directory synced and restored comes back as it was; a second sync
uploads only what changed; a sync cut halfway, or a checkpoint whose blobs are not all there, is never
restored; a manifest that names paths outside its directory, or a restore into a symlink, writes
nothing outside it; a checkpoint over its cap is neither written nor restored; pruning keeps the
newest checkpoints whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runplane.domain.checkpoints import (
    CheckpointCancelled,
    CheckpointTooLarge,
    CheckpointUnusable,
    blob_key,
    blobs_prefix,
    checkpoints_prefix,
    manifest_key,
)
from runplane.services.checkpoints import newest
from worker_agent.checkpoint_files import STAGE_IN_MEMORY
from worker_agent.checkpoints import CheckpointLimits, Progress, prune, restore, sync

RUN = "r-00000000000000000000c4e7"
_STACKS = {"aws-moto": "aws_stack", "azure-azurite": "azure_stack", "local-files": "local_stack"}


@pytest.fixture(params=list(_STACKS))
def objects(request):
    return request.getfixturevalue(_STACKS[request.param]).objects


class Watched:
    """An object store that counts the objects put through it, and fails every put after the first
    ``fail_after`` (a sync killed halfway)."""

    def __init__(self, inner, fail_after: int | None = None) -> None:
        self.inner, self.fail_after = inner, fail_after
        self.puts: list[str] = []

    def _put(self, key: str) -> None:
        if self.fail_after is not None and len(self.puts) >= self.fail_after:
            raise ConnectionResetError("the worker went away")
        self.puts.append(key)

    def put_bytes(self, key, data):
        self._put(key)
        self.inner.put_bytes(key, data)

    def put_file(self, key, path):
        self._put(key)
        self.inner.put_file(key, path)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def tree(root: Path, files: dict[str, tuple[bytes, int]], dirs: dict[str, int] | None = None) -> Path:
    for rel, mode in (dirs or {}).items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel).chmod(mode)
    for rel, (data, mode) in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        (root / rel).chmod(mode)
    return root


def contents(root: Path) -> dict[str, tuple[str, int, bytes | None]]:
    """Every entry under ``root``: its kind, its permission bits and a file's bytes."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
        found[str(path.relative_to(root))] = (
            kind,
            info.st_mode & 0o7777,
            path.read_bytes() if kind == "file" else None,
        )
    return found


BIG = os.urandom(STAGE_IN_MEMORY + 1)  # copied through a scratch file, uploaded with put_file


def test_a_directory_comes_back_as_it_was(objects, tmp_path):
    src = tree(
        tmp_path / "src",
        {"step.txt": (b"41\n", 0o600), "model/weights.bin": (BIG, 0o640), "model/empty": (b"", 0o444)},
        {"model": 0o750, "logs/none": 0o700},
    )
    os.utime(src / "step.txt", ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    (src / "latest").symlink_to("/etc/passwd")
    progress = Progress()
    made = sync(objects, RUN, src, None, scratch=tmp_path, progress=progress, attempt=2)
    assert (made.seq, made.attempt, made.total_bytes) == (1, 2, len(BIG) + 3)
    assert progress.skipped == ["latest (a symlink)"] and progress.uploaded == 3

    back = restore(objects, RUN, tmp_path / "dst")
    assert back == made
    expected = contents(src)
    del expected["latest"]
    assert contents(tmp_path / "dst") == expected
    assert (tmp_path / "dst" / "step.txt").stat().st_mtime_ns == 1_700_000_000_123_456_789

    # the next attempt's first sync, of the directory restored, reads nothing and writes nothing: it is
    # that checkpoint still; a file touched makes the next one, of the same blobs
    watched, progress = Watched(objects), Progress()
    assert sync(watched, RUN, tmp_path / "dst", back, progress=progress) is back
    assert progress.read_bytes == 0 and watched.puts == []
    os.utime(tmp_path / "dst" / "step.txt", ns=(1, 1))
    again = sync(watched, RUN, tmp_path / "dst", back, progress=progress)
    assert (again.seq, [f.sha256 for f in again.files]) == (2, [f.sha256 for f in made.files])
    assert progress.read_bytes == 3 and watched.puts == [manifest_key(RUN, 2)]


def test_a_second_sync_uploads_only_what_changed(objects, tmp_path):
    src = tree(tmp_path / "src", {"a.bin": (b"a" * 1000, 0o644), "b.bin": (b"b" * 1000, 0o644)})
    first = sync(objects, RUN, src, None)
    (src / "b.bin").write_bytes(b"B" * 1000)
    (src / "copy-of-a.bin").write_bytes(b"a" * 1000)  # a content the series holds already
    watched, progress = Watched(objects), Progress()
    second = sync(watched, RUN, src, first, progress=progress)
    assert watched.puts == [blob_key(RUN, second.files[1].sha256), manifest_key(RUN, 2)]
    assert [f.path for f in second.files] == ["a.bin", "b.bin", "copy-of-a.bin"]
    assert progress.read_bytes == 2000  # a.bin, unchanged, is not read again
    assert newest(objects, RUN) == second

    # a run started from this one's checkpoint stores its own blobs, in a series of its own
    other, watched = "r-0000000000000000000other1", Watched(objects)
    third = sync(watched, other, src, second)
    assert third.seq == 1 and {f.key for f in third.files} == {blob_key(other, f.sha256) for f in second.files}
    assert sorted(watched.puts) == sorted({f.key for f in third.files} | {manifest_key(other, 1)})


def test_a_sync_cut_halfway_is_never_restored(objects, tmp_path):
    src = tree(tmp_path / "src", {f"{n}.bin": (bytes([n]) * 100, 0o644) for n in range(4)})
    first = sync(objects, RUN, src, None)
    for n in range(4):
        (src / f"{n}.bin").write_bytes(bytes([n + 10]) * 100)
    with pytest.raises(ConnectionResetError):
        sync(Watched(objects, fail_after=2), RUN, src, first)
    assert newest(objects, RUN) == first
    watched = Watched(objects)
    with pytest.raises(CheckpointCancelled):  # its caller's time ran out
        sync(watched, RUN, src, first, cancelled=lambda: len(watched.puts) >= 3)
    assert len(watched.puts) == 3 and newest(objects, RUN) == first
    restore(objects, RUN, tmp_path / "dst")
    assert (tmp_path / "dst" / "3.bin").read_bytes() == bytes([3]) * 100

    # a checkpoint whose blob went missing is passed over as well
    second = sync(objects, RUN, src, first)
    objects.delete([second.files[0].key])
    assert newest(objects, RUN) == first
    assert sync(objects, RUN, src, first).seq == 3  # numbered after every manifest there is


def hostile(manifest: dict, **file_changes: object) -> bytes:
    data = json.loads(json.dumps(manifest))
    data["seq"] = 2
    data["files"][0].update(file_changes)
    return json.dumps(data).encode()


def test_a_hostile_manifest_writes_nothing_outside(objects, tmp_path):
    src = tree(tmp_path / "src", {"ok.txt": (b"fine", 0o644)})
    good = sync(objects, RUN, src, None)
    base = good.model_dump(mode="json")
    sha = good.files[0].sha256
    for changes in (
        {"path": "../escaped"},
        {"path": str(tmp_path / "escaped")},
        {"mode": 0o120777},  # a symlink's
        {"key": f"runs/r-other/checkpoints/blobs/{sha}"},
    ):
        objects.put_bytes(manifest_key(RUN, 2), hostile(base, **changes))
        assert restore(objects, RUN, tmp_path / "dst") == good, changes
        assert not (tmp_path / "escaped").exists()
        assert contents(tmp_path / "dst") == {"ok.txt": ("file", 0o644, b"fine")}
        for path in (tmp_path / "dst").iterdir():
            path.unlink()

    # a restore into a symlink does not follow it
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "link").symlink_to(outside)
    with pytest.raises(CheckpointUnusable, match="not a directory"):
        restore(objects, RUN, tmp_path / "link")
    assert list(outside.iterdir()) == []

    # a blob that is not what its manifest says: what was written is removed again
    tree(src, {"more/z.txt": (b"zzzz", 0o644)})
    third = sync(objects, RUN, src, good)
    objects.put_bytes(blob_key(RUN, third.files[1].sha256), b"ZZZZ")
    with pytest.raises(CheckpointUnusable, match="SHA-256"):
        restore(objects, RUN, tmp_path / "dst")
    assert list((tmp_path / "dst").iterdir()) == []


def test_a_checkpoint_over_its_cap_is_neither_written_nor_restored(objects, tmp_path):
    src = tree(tmp_path / "src", {"small": (b"s" * 100, 0o644)})
    first = sync(objects, RUN, src, None, CheckpointLimits(max_bytes=1000))
    tree(src, {"large": (b"l" * 1000, 0o644)})
    watched = Watched(objects)
    with pytest.raises(CheckpointTooLarge, match="more than 1000 bytes"):
        sync(watched, RUN, src, first, CheckpointLimits(max_bytes=1000))
    assert watched.puts == [] and newest(objects, RUN) == first
    with pytest.raises(CheckpointTooLarge, match="more than 1 files"):
        sync(watched, RUN, src, first, CheckpointLimits(max_entries=1))

    sync(objects, RUN, src, first)
    with pytest.raises(CheckpointTooLarge, match="1100 bytes, more than 1000"):
        restore(objects, RUN, tmp_path / "dst", CheckpointLimits(max_bytes=1000))
    assert not (tmp_path / "dst").exists()


def test_prune_keeps_the_newest_checkpoints_whole(objects, tmp_path):
    src = tree(tmp_path / "src", {"kept.bin": (b"k" * 10, 0o644), "step": (b"1", 0o644)})
    made = [sync(objects, RUN, src, None)]
    for step in (b"2", b"3"):
        (src / "step").write_bytes(step)
        made.append(sync(objects, RUN, src, made[-1]))
    (src / "step").write_bytes(b"4")
    with pytest.raises(ConnectionResetError):
        sync(Watched(objects, fail_after=1), RUN, src, made[-1])  # leaves the blob of "4" behind

    assert prune(objects, RUN, keep=2).manifests == 1
    keys = {info.key for info in objects.list(checkpoints_prefix(RUN))}
    named = {f.key for m in made[1:] for f in m.files}
    assert keys == {manifest_key(RUN, 2), manifest_key(RUN, 3)} | named
    assert {info.key for info in objects.list(blobs_prefix(RUN))} == named
    assert restore(objects, RUN, tmp_path / "dst") == made[2]
    assert (tmp_path / "dst" / "step").read_bytes() == b"3"
