"""The agent's unpacking of an uploaded archive, against real archives built here with tarfile
(hostile ones included): each refused before anything lands outside the directory it unpacks to."""

import gzip
import io
import os
import stat
import tarfile
import tracemalloc

import pytest

from worker_agent.unpack import ENTRY_BYTES, MAX_HEADER_BYTES, UnsafeArchive, unpack

LIMITS = {"max_bytes": 1024 * 1024, "max_files": 100}


def member(name, kind=tarfile.REGTYPE, data=b"", linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, io.BytesIO(data) if kind == tarfile.REGTYPE else None


def archive(path, *members):
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, data)
    return path


@pytest.fixture
def place(tmp_path):
    """Where an archive unpacks (``dest`` in ``box``) and a file beside it that must stay as it is."""
    box = tmp_path / "box"
    box.mkdir()
    (tmp_path / "outside.txt").write_text("untouched")
    return tmp_path, box / "dest"


def everything_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_tree_unpacks_with_its_files_links_and_modes(place):
    tmp, dest = place
    src = archive(
        tmp / "a.tgz",
        member("src/", tarfile.DIRTYPE, mode=0o700),
        member("src/train.py", data=b"print(1)\n", mode=0o4777),
        member("src/data.csv", data=b"a,b\n1,2\n", mode=0o600),
        member("src/latest", tarfile.SYMTYPE, linkname="data.csv"),
        member("src/same.csv", tarfile.LNKTYPE, linkname="src/data.csv"),
        member("./top.txt", data=b"top"),
    )
    assert unpack(src, dest, **LIMITS) == len(b"print(1)\n") + len(b"a,b\n1,2\n") + 3 + 6 * ENTRY_BYTES
    assert (dest / "src/train.py").read_text() == "print(1)\n"
    assert (dest / "src/latest").read_text() == "a,b\n1,2\n" and (dest / "src/latest").is_symlink()
    assert (dest / "src/same.csv").read_text() == "a,b\n1,2\n"
    assert stat.S_IMODE((dest / "src/train.py").stat().st_mode) == 0o755  # executable, set-id bits gone
    assert stat.S_IMODE((dest / "src/data.csv").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "src").stat().st_mode) == 0o755
    assert (dest / "top.txt").read_text() == "top"


HOSTILE = {
    "dotdot": ([member("../escaped.txt", data=b"x")], "it leaves the directory"),
    "dotdot inside": ([member("a/../../escaped.txt", data=b"x")], "it leaves the directory"),
    "absolute": ([member("/tmp/escaped.txt", data=b"x")], "not a relative path"),
    "symlink out": ([member("out", tarfile.SYMTYPE, linkname="../..")], "points out of the directory"),
    "absolute symlink": ([member("etc", tarfile.SYMTYPE, linkname="/etc")], "points out of the directory"),
    "symlink chain out": (
        [member("b", tarfile.SYMTYPE, linkname="."), member("a", tarfile.SYMTYPE, linkname="b/../..")],
        "points out of the directory",
    ),
    "write through a link": (
        [
            member("b", tarfile.SYMTYPE, linkname="."),
            member("a", tarfile.SYMTYPE, linkname="b/../escaped"),  # in the tree as written, out once resolved
            member("a/x", data=b"x"),
        ],
        "behind a link out of the directory",
    ),
    "hardlink out": ([member("h", tarfile.LNKTYPE, linkname="../outside.txt")], "it leaves the directory"),
    "hardlink absolute": ([member("h", tarfile.LNKTYPE, linkname="/etc/passwd")], "not a relative path"),
    "hardlink to nothing before": ([member("h", tarfile.LNKTYPE, linkname="later")], "names no file before it"),
    "char device": ([member("null", tarfile.CHRTYPE)], "is a device"),
    "block device": ([member("sda", tarfile.BLKTYPE)], "is a device"),
    "fifo": ([member("pipe", tarfile.FIFOTYPE)], "is a fifo"),
    "a file over a link": (
        [member("l", tarfile.SYMTYPE, linkname="f"), member("l", data=b"over")],
        "names 'l' twice",
    ),
}


@pytest.mark.parametrize("members,message", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_archive_is_refused_and_nothing_lands_outside(place, members, message):
    tmp, dest = place
    before = everything_under(tmp)
    src = archive(tmp / "a.tgz", *members)
    with pytest.raises(UnsafeArchive) as e:
        unpack(src, dest, **LIMITS)
    assert message in e.value.message
    assert [p for p in everything_under(tmp) if not p.startswith("box/dest/")] == sorted([*before, "a.tgz", "box/dest"])
    assert (tmp / "outside.txt").read_text() == "untouched"


def test_a_link_that_resolves_out_only_through_another_link_is_refused(place):
    """``b`` -> ``.`` and ``a`` -> ``b/../escaped``: ``a`` stays in the tree as written, and leaves it
    once ``b`` is followed; the check of the whole tree once unpacked resolves it."""
    tmp, dest = place
    src = archive(
        tmp / "a.tgz",
        member("b", tarfile.SYMTYPE, linkname="."),
        member("a", tarfile.SYMTYPE, linkname="b/../escaped"),
    )
    with pytest.raises(UnsafeArchive, match="link 'a' points out of the directory"):
        unpack(src, dest, **LIMITS)


def test_a_bomb_by_size_stops_at_the_limit(place):
    tmp, dest = place
    src = tmp / "bomb.tgz"
    with gzip.open(src, "wb") as raw, tarfile.open(fileobj=raw, mode="w|") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 64 * 1024 * 1024
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert src.stat().st_size < 1024 * 1024  # small packed
    with pytest.raises(UnsafeArchive, match="more bytes than its limit"):
        unpack(src, dest, **LIMITS)
    assert everything_under(dest) == []


def test_a_bomb_in_its_headers_stops_in_the_stream(place):
    """A pax header of megabytes is no file: the decompressed stream itself stops past what the
    limits allow, headers and all."""
    tmp, dest = place
    src = tmp / "pax.tgz"
    with tarfile.open(src, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        info, data = member("small", data=b"0123456789")
        info.pax_headers = {"comment": "x" * (4 * 1024 * 1024)}
        tar.addfile(info, data)
    with pytest.raises(UnsafeArchive, match="the archive unpacks to more than"):
        unpack(src, dest, max_bytes=1024, max_files=2)
    assert everything_under(dest) == []


def test_a_loop_of_links_is_refused_naming_the_link_not_a_host_path(place):
    tmp, dest = place
    src = archive(
        tmp / "loop.tgz", member("a", tarfile.SYMTYPE, linkname="b"), member("b", tarfile.SYMTYPE, linkname="a")
    )
    with pytest.raises(UnsafeArchive) as e:
        unpack(src, dest, **LIMITS)
    assert e.value.message in {f"the archive's link {n!r} loops or cannot be resolved" for n in "ab"}


def test_a_file_under_a_dangling_link_is_refused_naming_the_member_not_a_host_path(place):
    tmp, dest = place
    src = archive(tmp / "dangling.tgz", member("a", tarfile.SYMTYPE, linkname="x"), member("a/b/c", data=b"c"))
    with pytest.raises(UnsafeArchive) as e:
        unpack(src, dest, **LIMITS)
    assert e.value.message.startswith("the archive's 'a/b/c' cannot be unpacked: ")
    assert str(tmp) not in e.value.message
    assert everything_under(dest) == ["a"] and (tmp / "outside.txt").read_text() == "untouched"


def test_each_entry_counts_for_a_block_so_many_empty_files_are_no_free_lunch(place):
    tmp, dest = place
    src = archive(tmp / "empty.tgz", *(member(f"f{i}") for i in range(50)))
    with pytest.raises(UnsafeArchive, match="more bytes than its limit"):
        unpack(src, dest, max_bytes=49 * ENTRY_BYTES, max_files=1000)
    assert unpack(src, tmp / "roomy", max_bytes=50 * ENTRY_BYTES, max_files=1000) == 50 * ENTRY_BYTES


class _Filler:
    """``size`` bytes of one letter, read as a file (never all in memory at once)."""

    def __init__(self, size):
        self.left = size

    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return b"a" * n


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE])
def test_a_header_claiming_megabytes_is_refused_before_it_is_read_into_memory(place, kind):
    """A long name, long link or pax header is read whole into memory by tarfile: one claiming
    64 MiB, in a small archive within generous limits, is refused once past MAX_HEADER_BYTES."""
    tmp, dest = place
    src = tmp / "header.tgz"
    with (
        gzip.open(src, "wb", compresslevel=1) as raw,
        tarfile.open(fileobj=raw, mode="w|", format=tarfile.GNU_FORMAT) as tar,
    ):
        info = tarfile.TarInfo("././@LongLink")
        info.type, info.size = kind, 64 * 1024 * 1024
        tar.addfile(info, _Filler(info.size))
    assert src.stat().st_size < 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeArchive, match="a header of more than"):
            unpack(src, dest, max_bytes=2 * 1024**3, max_files=100_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_HEADER_BYTES  # not the 64 MiB (twice over) the header claimed
    assert everything_under(dest) == []


def test_a_bomb_by_file_count_stops_at_the_limit(place):
    tmp, dest = place
    src = archive(tmp / "many.tgz", *(member(f"f{i}", data=b"") for i in range(LIMITS["max_files"] + 1)))
    with pytest.raises(UnsafeArchive, match=f"more than {LIMITS['max_files']} entries"):
        unpack(src, dest, **LIMITS)
    assert len(everything_under(dest)) == LIMITS["max_files"]  # each written after its own check


def test_what_is_not_a_gzipped_tar_is_refused(place):
    tmp, dest = place
    (tmp / "junk").write_bytes(os.urandom(2048))
    with pytest.raises(UnsafeArchive, match="not a gzip'd tar archive"):
        unpack(tmp / "junk", dest, **LIMITS)
