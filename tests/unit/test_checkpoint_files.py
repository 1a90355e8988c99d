"""The file system side of checkpoints: what a walk leaves out and why; a file read while it changes is
uploaded as it was hashed; a restore gives what it makes its owner, and a symlink put in its way while
it goes makes it stop, writing nothing outside and leaving its directory empty."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runplane.domain.checkpoints import (
    CheckpointCancelled,
    CheckpointFile,
    CheckpointTooLarge,
    CheckpointUnusable,
    Manifest,
    blob_key,
)
from worker_agent import checkpoint_files
from worker_agent.checkpoint_files import STAGE_IN_MEMORY, Progress, staged, walk, write_tree
from worker_agent.trees import MAX_DEPTH

RUN = "r-00000000000000000000f11e"


def test_a_walk_keeps_regular_files_and_directories_and_names_the_rest(tmp_path):
    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.pt").write_bytes(b"a" * 10)
    (root / "b\\..\\c").write_bytes(b"x")
    os.mkfifo(root / "pipe")
    (root / "to-etc").symlink_to("/etc")
    os.close(os.open(os.fsencode(root) + b"/\xff-latin1", os.O_CREAT | os.O_WRONLY, 0o600))
    progress = Progress()
    found = walk(root, None, 100, progress)
    assert found.files == ["sub/a.pt"] and found.bytes == 10
    assert [d.path for d in found.dirs] == ["sub"]
    assert sorted(progress.skipped) == [
        "?-latin1 (a path that is not UTF-8)",
        "b\\..\\c (a path holding a backslash)",
        "pipe (not a regular file)",
        "to-etc (a symlink)",
    ]


def test_a_directory_swapped_with_a_file_while_walked_gives_one_path_once(tmp_path, monkeypatch):
    """A run swaps the directory ``a`` with a file between the listing and the stat, and back before the
    walk goes into it (what renameat2's RENAME_EXCHANGE does): ``a`` is taken as it was stat'ed, a file,
    and nothing is taken from beneath it, so the manifest that names what was found reads."""
    root = tmp_path / "ckpt"
    (root / "a").mkdir(parents=True)
    (root / "a" / "b").write_bytes(b"b")
    aside = tmp_path / "aside"
    listed = checkpoint_files.scan

    def swapping(directory: Path) -> Iterator[tuple[str, os.DirEntry[str]]]:
        for prefix, entry in listed(directory):
            if prefix + entry.name != "a":
                yield prefix, entry
                continue
            (root / "a").rename(aside)
            (root / "a").write_bytes(b"file")
            yield prefix, entry  # the walk's stat finds a file
            (root / "a").unlink()
            aside.rename(root / "a")

    monkeypatch.setattr(checkpoint_files, "scan", swapping)
    progress = Progress()
    found = walk(root, None, 100, progress)
    assert (found.files, found.dirs) == (["a"], [])
    assert progress.skipped == ["a/b (its directory changed while walked)"]
    Manifest(series=RUN, seq=1, created_at=0, files=[_file("a")], dirs=found.dirs, total_bytes=4)


def _file(path: str) -> CheckpointFile:
    digest = hashlib.sha256(b"file").hexdigest()
    return CheckpointFile(path=path, size=4, sha256=digest, mode=0o644, mtime_ns=0, key=blob_key(RUN, digest))


def test_a_directory_too_deep_to_walk_makes_no_checkpoint_of_part_of_it(tmp_path):
    deep = tmp_path.joinpath(*["d"] * (MAX_DEPTH + 2))
    deep.mkdir(parents=True)
    (deep / "state").write_bytes(b"s")
    (tmp_path / "top").write_bytes(b"t")
    with pytest.raises(CheckpointUnusable, match="cannot be read whole"):
        walk(tmp_path, None, 10_000, Progress())


def test_a_sync_given_up_is_given_up_within_a_large_files_read(tmp_path):
    path = tmp_path / "big.pt"
    path.write_bytes(b"w" * (3 * 1024**2))
    progress = Progress()
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CheckpointCancelled), staged(fd, None, tmp_path, progress, lambda: progress.read_bytes > 0):
            pass
    finally:
        os.close(fd)
    assert progress.read_bytes == 1024**2  # one chunk of three


def test_a_file_larger_than_the_workers_free_disk_is_not_staged(tmp_path):
    path = tmp_path / "huge.pt"
    with path.open("wb") as f:
        f.write(b"w" * (STAGE_IN_MEMORY + 1))
    os.truncate(path, os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize)  # sparse: the whole disk
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="too little to stage") as raised, staged(fd, None, scratch, Progress()):
            pass
    finally:
        os.close(fd)
    assert raised.value.errno == errno.ENOSPC
    assert list(scratch.iterdir()) == []  # nothing written on the worker's disk


def test_a_walk_stops_at_its_cap(tmp_path):
    for n in range(5):
        (tmp_path / f"{n}").write_bytes(b"x" * 100)
    assert walk(tmp_path, 500, 5, Progress()).bytes == 500
    with pytest.raises(CheckpointTooLarge, match="more than 499 bytes"):
        walk(tmp_path, 499, 5, Progress())
    with pytest.raises(CheckpointTooLarge, match="more than 4 files"):
        walk(tmp_path, None, 4, Progress())


def test_a_file_changed_after_it_was_read_is_kept_as_it_was_read(tmp_path):
    path = tmp_path / "big.pt"
    first = os.urandom(STAGE_IN_MEMORY + 10)
    path.write_bytes(first)
    fd = os.open(path, os.O_RDONLY)
    try:
        with staged(fd, None, tmp_path, Progress()) as copy:
            path.write_bytes(b"overwritten by the run meanwhile")
            assert copy.path is not None and copy.data is None
            assert copy.path.read_bytes() == first and copy.sha256 == hashlib.sha256(first).hexdigest()
        assert not copy.path.exists()
    finally:
        os.close(fd)


def manifest(files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> Manifest:
    entries = []
    for rel, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        entries.append(
            {"path": rel, "size": len(data), "sha256": sha, "mode": 0o640, "mtime_ns": 7, "key": blob_key(RUN, sha)}
        )
    return Manifest(
        series=RUN,
        seq=1,
        created_at=0,
        files=entries,
        dirs=[{"path": d, "mode": 0o750} for d in dirs],
        total_bytes=sum(len(d) for d in files.values()),
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root")
def test_a_restore_gives_what_it_makes_its_owner(tmp_path):
    blobs = {"a/b/c.pt": b"c", "d.pt": b"d"}
    made = manifest(blobs, dirs=("a",))
    write_tree(made, tmp_path / "dst", lambda f, path: path.write_bytes(blobs[f.path]), (4321, 4322), Progress())
    for rel in ("a", "a/b", "a/b/c.pt", "d.pt"):
        info = (tmp_path / "dst" / rel).lstat()
        assert (info.st_uid, info.st_gid) == (4321, 4322), rel
    assert (tmp_path / "dst" / "a").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "dst" / "d.pt").stat().st_mtime_ns == 7


def test_a_symlink_put_in_the_way_stops_a_restore(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dst = tmp_path / "dst"
    blobs = {"a.pt": b"a", "x/y.pt": b"y"}

    def fetch(f, path: Path) -> None:
        path.write_bytes(blobs[f.path])
        if f.path == "a.pt":  # the run's directory changes under the restore: x/ becomes a symlink out
            os.rmdir(dst / "x")
            (dst / "x").symlink_to(outside)

    with pytest.raises(CheckpointUnusable, match="a symlink or a file stands where a directory goes"):
        write_tree(manifest(blobs, dirs=("x",)), dst, fetch, None, Progress())
    assert list(outside.iterdir()) == [] and list(dst.iterdir()) == []
    (dst / "left").write_bytes(b"")
    with pytest.raises(CheckpointUnusable, match="not empty"):
        write_tree(manifest(blobs), dst, fetch, None, Progress())
    assert [p.name for p in dst.iterdir()] == ["left"]
