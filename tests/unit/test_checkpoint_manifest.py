"""A checkpoint's manifest: its keys, and what a manifest may name. A manifest that could make a restore
write outside its directory, or that is not what it says, does not read; one a newer release wrote
with fields this one does not know reads, and keeps them. A rule's exit_code is no status a crash exits
with."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from runplane.domain.checkpoints import (
    CheckpointRule,
    Manifest,
    blob_key,
    checkpoints_prefix,
    manifest_key,
    manifest_seq,
    path_refusal,
)
from runplane.domain.wire import stored, written

RUN = "r-0123456789abcdef01234567"
DATA = b"step 41\n"
SHA = hashlib.sha256(DATA).hexdigest()


def manifest_data(**changes: object) -> dict[str, object]:
    file = {"path": "ckpt/state.txt", "size": len(DATA), "sha256": SHA, "mode": 0o640, "mtime_ns": 1, "key": None}
    file["key"] = blob_key(RUN, SHA)
    data: dict[str, object] = {
        "series": RUN,
        "seq": 3,
        "created_at": 1.5,
        "files": [file],
        "dirs": [{"path": "ckpt", "mode": 0o750}],
        "total_bytes": len(DATA),
    }
    data.update(changes)
    return data


def with_file(**changes: object) -> dict[str, object]:
    data = manifest_data()
    files = data["files"]
    assert isinstance(files, list)
    files[0] = {**files[0], **changes}
    return data


def test_keys_sort_manifests_by_number_and_before_the_blobs():
    assert manifest_key(RUN, 7) == f"runs/{RUN}/checkpoints/00000007/manifest.json"
    assert blob_key(RUN, SHA) == f"runs/{RUN}/checkpoints/blobs/{SHA}"
    keys = [manifest_key(RUN, n) for n in (10, 2, 99_999_999)] + [blob_key(RUN, SHA)]
    assert sorted(keys) == [keys[1], keys[0], keys[2], keys[3]]
    assert all(k.startswith(checkpoints_prefix(RUN)) for k in keys)
    assert manifest_seq(RUN, manifest_key(RUN, 12)) == 12
    for other in (blob_key(RUN, SHA), manifest_key("r-other", 12), f"runs/{RUN}/checkpoints/12/manifest.json"):
        assert manifest_seq(RUN, other) is None


def test_a_manifest_reads_and_keeps_what_a_newer_release_added():
    data = manifest_data(future={"x": 1})
    files = data["files"]
    assert isinstance(files, list)
    files[0]["future_field"] = True
    manifest = stored(Manifest, data)
    assert manifest.files[0].path == "ckpt/state.txt" and manifest.total_bytes == len(DATA)
    again = written(manifest)
    assert again["future"] == {"x": 1} and again["files"][0]["future_field"] is True


@pytest.mark.parametrize(
    "path",
    ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a/", ".", "", "a\\..\\b", "a\x00b", "x" * 256],
)
def test_a_path_outside_or_unclear_is_refused(path):
    assert path_refusal(path) is not None
    with pytest.raises(ValidationError):
        stored(Manifest, with_file(path=path))


def test_plain_relative_paths_are_accepted():
    for path in ("a", "a/b/c.pt", "..a", "a..", "é/ü", "x" * 255):
        assert path_refusal(path) is None, path


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"mode": 0o120777}, "a symlink's mode"),
        ({"mode": 0o4755}, "setuid"),
        ({"key": f"runs/r-other/checkpoints/blobs/{SHA}"}, "another run's blob"),
        ({"key": f"runs/{RUN}/outputs/1/secret"}, "an object that is no blob"),
        ({"sha256": "0" * 64}, "a key not of its SHA-256"),
        ({"size": -1}, "a negative size"),
    ],
)
def test_a_file_that_is_not_what_it_says_is_refused(changes, why):
    with pytest.raises(ValidationError):
        stored(Manifest, with_file(**changes))


def test_a_manifest_that_does_not_add_up_is_refused():
    with pytest.raises(ValidationError, match="total_bytes"):
        stored(Manifest, manifest_data(total_bytes=len(DATA) + 1))
    twice = manifest_data(dirs=[{"path": "ckpt", "mode": 0o750}, {"path": "ckpt/state.txt", "mode": 0o700}])
    with pytest.raises(ValidationError, match="twice"):
        stored(Manifest, twice)
    under = manifest_data(dirs=[{"path": "ckpt/state.txt/x", "mode": 0o700}])
    with pytest.raises(ValidationError, match="under a file"):
        stored(Manifest, under)
    with pytest.raises(ValidationError):
        stored(Manifest, manifest_data(series="../r"))
    with pytest.raises(ValidationError):
        stored(Manifest, manifest_data(seq=0))


@pytest.mark.parametrize("code", [1, 2])
def test_an_exit_code_any_crash_or_shell_misuse_exits_with_is_refused(code: int) -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 3"):
        CheckpointRule.model_validate({"exit_code": code})
    assert CheckpointRule.model_validate({"exit_code": 3}).exit_code == 3
