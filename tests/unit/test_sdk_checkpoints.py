"""The SDK's reading of a run's checkpoint against a loopback server that answers as a test scripts
it: every page of one checkpoint in one answer, the listing started again when a newer checkpoint
replaced the one it was reading (409), and a download that writes files and directories with their
permission bits, refusing (before writing anything) a path an answer gives that would leave DEST."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest

from runplane.client import AsyncClient, Client, Conflict, DownloadFailed
from tests.unit.test_sdk_retries import RUN, Answer, Script, error

RUN_ID = RUN["id"]


@pytest.fixture(scope="module")
def server():
    script = Script()
    yield script
    script.stop()


def page(server: Script, seq: int, files: list[tuple[str, int]], cursor: str | None, dirs: list[str] = ()) -> Answer:
    body: dict[str, Any] = {
        "run_id": RUN_ID,
        "series": RUN_ID,
        "seq": seq,
        "attempt": 1,
        "created_at": "2026-11-23T09:30:00.125Z",
        "total_bytes": 4 * len(files),
        "file_count": len(files),
        "dirs": list(dirs),
        "files": [{"path": p, "size": 4, "mode": mode, "url": f"{server.url}/blob/{p}"} for p, mode in files],
        "next_cursor": cursor,
    }
    return Answer(200, body)


def test_the_checkpoint_is_every_page_and_starts_again_when_replaced(server: Script) -> None:
    replaced = error(409, "conflict", "checkpoint 3 of run r-1 is no longer kept: list again from the start")
    server.play(
        page(server, 3, [("a", 0o644)], "c1", ["d"]),
        replaced,
        page(server, 4, [("a", 0o644)], "c2", ["d"]),
        page(server, 4, [("b", 0o600)], None),
    )
    with Client(server.url, "t", retries=0) as client:
        got = client.checkpoint(RUN_ID)
    assert (got.seq, [f.path for f in got.files], got.dirs, got.next_cursor) == (4, ["a", "b"], ["d"], None)
    asked = [s.path.removeprefix(f"/v1/runs/{RUN_ID}/checkpoint") for s in server.seen]
    assert asked == ["?limit=500", "?limit=500&cursor=c1", "?limit=500", "?limit=500&cursor=c2"]
    # replaced again and again: the caller is told
    server.play(*[page(server, 5, [("a", 0o644)], "c"), replaced] * 3)
    with Client(server.url, "t", retries=0) as client, pytest.raises(Conflict, match="list again"):
        client.checkpoint(RUN_ID)
    assert len(server.seen) == 6  # three tries of two pages


def test_a_checkpoint_download_writes_its_tree_and_never_outside_dest(server: Script, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    server.play(
        Answer(200, RUN),
        page(server, 1, [("bin/run.sh", 0o750), ("state", 0o600)], None, ["bin", "empty"]),
        Answer(200, b"data"),
    )
    with Client(server.url, "t", retries=0) as client:
        run = client.get(RUN_ID)
        assert run.download_checkpoint(dest) == [dest / "bin" / "run.sh", dest / "state"]
        assert stat.S_IMODE((dest / "bin" / "run.sh").stat().st_mode) == 0o750
        assert stat.S_IMODE((dest / "state").stat().st_mode) == 0o600
        assert (dest / "empty").is_dir() and (dest / "state").read_bytes() == b"data"
        for files, dirs, said in (
            ([("fine", 0o644), ("../out", 0o644)], [], "refusing output path '../out'"),
            ([("fine", 0o644)], ["../away"], "refusing directory '../away'"),
            ([("state/x", 0o644)], [], "is not a directory"),  # a file of the checkpoint in a file's place
        ):
            server.play(page(server, 2, files, None, dirs), Answer(200, b"data"))
            with pytest.raises(DownloadFailed, match=said):
                run.download_checkpoint(dest / "again" if said != "is not a directory" else dest)
    assert not (tmp_path / "out").exists() and not (tmp_path / "away").exists()
    assert not (dest / "again").exists() and not (dest / "fine").exists()


def test_the_async_client_reads_and_downloads_it_alike(server: Script, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, "t", retries=0) as client:
            server.play(Answer(200, RUN), page(server, 1, [("w", 0o640)], None), Answer(200, b"data"))
            run = await client.get(RUN_ID)
            assert await run.download_checkpoint(tmp_path) == [tmp_path / "w"]
            server.play(page(server, 1, [("w", 0o640)], None))
            assert [f.path for f in (await run.checkpoint_files()).files] == ["w"]

    asyncio.run(main())
    assert stat.S_IMODE((tmp_path / "w").stat().st_mode) == 0o640
