"""Packing a directory for an upload: the same content gives the same bytes (and SHA-256), ignore
files leave out what they name, and what cannot be packed safely is refused with one line."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from runplane.client._pack import Ignore, PackError, pack, rule


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _members(directory: Path, **kw: int) -> dict[str, tarfile.TarInfo]:
    with pack(directory, **kw) as packed:
        data = b"".join(packed.chunks())
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_same_content_packs_to_the_same_bytes(tmp_path: Path) -> None:
    files = {"train.py": "print(1)\n", "data/a.csv": "1,2\n", "data/b/c.txt": "c"}
    a, b = _tree(tmp_path / "a", files), _tree(tmp_path / "b", dict(reversed(files.items())))
    os.utime(b / "train.py", (1, 1))
    (b / "train.py").chmod(0o600)
    with pack(a) as pa, pack(b) as pb:
        data = b"".join(pa.chunks())
        assert data == b"".join(pb.chunks())
        assert pa.sha256 == pb.sha256 == hashlib.sha256(data).hexdigest()
        assert pa.md5 == base64.b64encode(hashlib.md5(data).digest()).decode()
        assert pa.size == len(data)
        assert gzip.decompress(data)  # a gzip'd tar
    (b / "train.py").write_text("print(2)\n")
    with pack(a) as pa, pack(b) as pb:
        assert pa.sha256 != pb.sha256


def test_members_are_sorted_and_owned_by_nobody(tmp_path: Path) -> None:
    top = _tree(tmp_path / "p", {"z.txt": "z", "a/x.py": "x", "run.sh": "#!/bin/sh\n"})
    (top / "run.sh").chmod(0o700)
    with pack(top) as packed:
        data = b"".join(packed.chunks())
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["a", "a/x.py", "run.sh", "z.txt"]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
        assert {m.name: m.mode for m in members} == {"a": 0o755, "a/x.py": 0o644, "run.sh": 0o755, "z.txt": 0o644}
        reader = tar.extractfile("a/x.py")
        assert reader is not None and reader.read() == b"x"


def test_ignore_files_leave_out_what_they_name(tmp_path: Path) -> None:
    top = _tree(
        tmp_path / "p",
        {
            "train.py": "",
            "notes.log": "",
            "keep.log": "",
            "build/out.o": "",
            "src/build/gen.py": "",
            "src/cache/x": "",
            "deep/a/b/tmp.bin": "",
            ".git/HEAD": "",
            "data/big.bin": "",
            "data/small.txt": "",
            ".gitignore": "# comment\n*.log\n!keep.log\n/build/\ncache/\n",
            ".runplaneignore": "**/tmp.bin\ndata/*.bin\n",
        },
    )
    names = set(_members(top))
    assert names == {
        ".gitignore",
        ".runplaneignore",
        "train.py",
        "keep.log",
        "src",
        "src/build",
        "src/build/gen.py",
        "deep",
        "deep/a",
        "deep/a/b",
        "data",
        "data/small.txt",
    }


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "left_out"),
    [
        ("*.pyc", "a/b/c.pyc", False, True),
        ("/top.txt", "top.txt", False, True),
        ("/top.txt", "a/top.txt", False, False),
        ("out/", "out", False, False),
        ("out/", "a/out", True, True),
        ("a/**/z", "a/z", False, True),
        ("a/**/z", "a/b/c/z", False, True),
        ("a/**", "a/b", False, True),
        ("a/**", "a", True, False),
        ("f?.txt", "f1.txt", False, True),
        ("f[0-3].txt", "f5.txt", False, False),
        ("f[!0-3].txt", "f5.txt", False, True),
        ("\\#x", "#x", False, True),
    ],
)
def test_patterns(pattern: str, path: str, is_dir: bool, left_out: bool) -> None:
    r = rule(pattern)
    assert r is not None
    assert Ignore([r]).left_out(path, is_dir) is left_out


def test_a_symlink_inside_is_kept_and_one_out_refused(tmp_path: Path) -> None:
    top = _tree(tmp_path / "p", {"data/v.txt": "7"})
    (top / "link.txt").symlink_to("data/v.txt")
    members = _members(top)
    assert members["link.txt"].issym() and members["link.txt"].linkname == "data/v.txt"
    (top / "d").symlink_to(".")
    (top / "escape").symlink_to("d/..")  # lexically inside, really the parent of the top
    with pytest.raises(PackError, match=r"escape is a symlink to d/\.\., outside"):
        pack(top)
    (top / "escape").unlink()
    (top / "abs").symlink_to(tmp_path)
    with pytest.raises(PackError, match="abs is a symlink"):
        pack(top)
    (top / ".runplaneignore").write_text("abs\n")
    assert "abs" not in _members(top)


def test_a_fifo_is_refused_unless_left_out(tmp_path: Path) -> None:
    top = _tree(tmp_path / "p", {"a.txt": ""})
    os.mkfifo(top / "pipe")
    with pytest.raises(PackError, match="pipe is not a file"):
        pack(top)
    (top / ".gitignore").write_text("pipe\n")
    assert "pipe" not in _members(top)


def test_too_large_is_refused_while_packing(tmp_path: Path) -> None:
    top = tmp_path / "p"
    top.mkdir()
    (top / "noise.bin").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(PackError, match="packs to more than 32768 bytes, the upload limit"):
        pack(top, max_bytes=32 * 1024)
    (top / "zeros.bin").write_bytes(bytes(64 * 1024 * 21))  # compresses well, unpacks past the cap
    with pytest.raises(PackError, match="the most an upload unpacks to"):
        pack(top, max_bytes=64 * 1024 + 4096)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="is not a directory"):
        pack(tmp_path / "missing")
