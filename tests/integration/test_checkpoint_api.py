"""A run's checkpoint through the SDK and the CLI on the embedded stack: the checkpoint a worker
synced (more files than one page) read whole and downloaded through its presigned URLs, ``runplane
status`` saying what the run's record says of it and of its pieces, ``runplane download --checkpoint``
writing its tree, ``runplane run --checkpoint ... --from-checkpoint`` submitting the rule and the
pinned source, and a run with no checkpoint yet refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runplane import bootstrap
from runplane.client import Client
from runplane.domain.checkpoints import CheckpointStatus, checkpoints_prefix
from runplane.domain.expect import Expect
from runplane.domain.retention import RunRetention
from runplane.services.sweep_advance import member_run
from worker_agent.checkpoints import sync

FILES = 501
"""One more than a page of the checkpoint route."""


def cli(devstack, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
    env |= {"RUNPLANE_API_URL": devstack.api_url, "RUNPLANE_TOKEN": "alice-token", "HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "runplane.cli", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def synced(devstack, tmp_path_factory):
    """A killed run of alice's that checkpoints in pieces, with a checkpoint synced and recorded as its
    worker does it: (its id, the directory it was synced from)."""
    alice = Client(devstack.api_url, "alice-token")
    rule = {"interval": "5m", "exit_code": 85, "max_pieces": 7}
    run = alice.submit("true", queue="parked", name=f"ckpt-{uuid.uuid4().hex[:6]}", checkpoint=rule)
    run.kill()
    directory = tmp_path_factory.mktemp("checkpoint")
    (directory / "steps").mkdir()
    (directory / "empty").mkdir()
    for i in range(FILES - 1):
        (directory / "steps" / f"{i:04d}").write_text(f"step {i}\n")
    (directory / "run.sh").write_text("#!/bin/sh\n")
    (directory / "run.sh").chmod(0o750)
    stack = bootstrap.stack()
    made = sync(stack.objects, run.id, directory, None, attempt=1)
    recorded = CheckpointStatus(
        seq=made.seq, attempt=1, files=len(made.files), bytes=made.total_bytes, synced_at=made.created_at
    )
    stack.store.update(stack.store.get(run.id), Expect(), {"checkpoint": recorded, "pieces": 2})
    return run.id, directory


def test_the_sdk_reads_and_downloads_the_whole_checkpoint(devstack, synced, tmp_path):
    run_id, directory = synced
    run = Client(devstack.api_url, "alice-token").get(run_id)
    assert run.checkpoint is not None and (run.checkpoint.seq, run.checkpoint.files, run.pieces) == (1, FILES, 2)
    listed = run.checkpoint_files()
    assert (len(listed.files), listed.file_count, listed.next_cursor) == (FILES, FILES, None)
    assert sorted(listed.dirs) == ["empty", "steps"]
    written = run.download_checkpoint(tmp_path)
    assert len(written) == FILES and (tmp_path / "empty").is_dir()
    assert all(p.read_bytes() == (directory / p.relative_to(tmp_path)).read_bytes() for p in written)
    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o750


def test_the_cli_shows_and_downloads_the_checkpoint(devstack, synced, tmp_path):
    run_id, _ = synced
    shown = cli(devstack, tmp_path, "status", run_id)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split(None, 1) for line in shown.stdout.splitlines() if len(line.split(None, 1)) == 2]
    lines = {key: value.strip() for key, value in rows}
    assert lines["checkpoint"].startswith(f"1 ({FILES} files, ") and lines["checkpoint"].endswith("by attempt 1")
    assert lines["pieces"] == "went in 3 pieces"  # it has ended: its two pieces ended by exit 85, and the last

    got = cli(devstack, tmp_path, "download", "--checkpoint", run_id, str(tmp_path / "ckpt"), "--json")
    assert got.returncode == 0, got.stderr
    written = [Path(p) for p in json.loads(got.stdout)["files"]]
    assert len(written) == FILES and (tmp_path / "ckpt" / "steps" / "0007").read_text() == "step 7\n"
    # a file there that differs is refused in one line, and --force writes over it
    (tmp_path / "ckpt" / "run.sh").write_text("mine, and longer than the checkpoint's\n")
    refused = cli(devstack, tmp_path, "download", "--checkpoint", run_id, str(tmp_path / "ckpt"))
    assert refused.returncode != 0 and refused.stderr.startswith("error: ") and "--force" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    forced = cli(devstack, tmp_path, "download", "--checkpoint", "--force", run_id, str(tmp_path / "ckpt"))
    assert forced.returncode == 0 and (tmp_path / "ckpt" / "run.sh").read_text() == "#!/bin/sh\n"


def test_the_cli_submits_the_rule_and_the_run_to_start_from(devstack, synced, tmp_path):
    run_id, _ = synced
    made = cli(
        devstack, tmp_path, "run", "--queue", "parked", "--checkpoint", "10m", "--checkpoint-signal", "SIGUSR1",
        "--checkpoint-grace", "1m", "--checkpoint-exit-code", "85", "--from-checkpoint", run_id, "--json", "--", "true",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    view = json.loads(made.stdout)
    alice = Client(devstack.api_url, "alice-token")
    try:
        rule = view["spec"]["checkpoint"]
        assert (rule["interval"], rule["signal"], rule["grace"], rule["exit_code"]) == (600, "SIGUSR1", 60, 85)
        assert view["spec"]["from_checkpoint"] == run_id
        started = alice.checkpoint(view["id"])  # what it starts from: the synced run's checkpoint
        assert (started.run_id, started.series, started.seq) == (view["id"], run_id, 1)
        status = cli(devstack, tmp_path, "status", view["id"])
        assert "none synced yet" in status.stdout
    finally:
        alice.kill(view["id"])

    # a run with no checkpoint yet (nor one it starts from): one line, refused
    bare = alice.submit("true", queue="parked", checkpoint={"interval": 60}).kill()
    nothing = cli(devstack, tmp_path, "download", "--checkpoint", bare.id, str(tmp_path / "none"))
    assert nothing.returncode == 3, (nothing.returncode, nothing.stderr)
    assert nothing.stderr.strip() == f"error: run {bare.id} has no checkpoint yet"
    later = cli(devstack, tmp_path, "run", "--queue", "parked", "--from-checkpoint", bare.id, "--", "true")
    assert later.returncode == 3 and f"run {bare.id} has no checkpoint yet" in later.stderr
    assert "--from-checkpoint needs one" in later.stderr  # the flag, not the API's field
    assert not (tmp_path / "none").exists()

    # the API's refusals of the new fields name the flags that gave them, and durations as durations
    grace = cli(
        devstack, tmp_path, "run", "--queue", "parked", "--checkpoint", "10m", "--checkpoint-grace", "2h", "--", "true"
    )
    assert (grace.returncode, grace.stderr.strip()) == (2, "error: --checkpoint-grace: at most 1h"), grace.stderr
    pools = cli(devstack, tmp_path, "run", "--queue", "parked,default", "--", "true")
    assert pools.returncode == 2 and "needs --fallback-after or --fallback-after-preemptions" in pools.stderr


def test_a_sweep_pins_its_templates_checkpoint_for_every_member(devstack, synced):
    run_id, _ = synced
    alice = Client(devstack.api_url, "alice-token")
    sweep = alice.submit_sweep("true", count=2, queue="parked", from_checkpoint=run_id)
    try:
        stored = bootstrap.stack().sweeps.get(sweep.id)
        assert stored.restore_from is not None and (stored.restore_from.run, stored.restore_from.seq) == (run_id, 1)
        assert member_run(stored, 1, time.time()).restore_from == stored.restore_from
    finally:
        sweep.kill()


def test_checkpoints_the_retention_deleted_are_said_so_with_their_date(devstack, tmp_path):
    """A run whose checkpoints went with its outputs at its pool's retention date: the route's 404 and
    from_checkpoint's 409 say they were deleted and when, not that none was synced yet."""
    alice = Client(devstack.api_url, "alice-token")
    run = alice.submit("true", queue="parked", checkpoint={"interval": 60}).kill()
    (tmp_path / "step").write_text("41\n")
    stack = bootstrap.stack()
    made = sync(stack.objects, run.id, tmp_path, None, attempt=1)
    recorded = CheckpointStatus(
        seq=made.seq, attempt=1, files=len(made.files), bytes=made.total_bytes, synced_at=made.created_at
    )
    # what the retention sweep does at the outputs' date: the checkpoints deleted with them, and recorded
    stack.objects.delete([info.key for info in stack.objects.list(checkpoints_prefix(run.id))])
    swept = RunRetention(checked_at=time.time(), outputs_at=1_780_000_000.0, deleted=["outputs"])  # 2026-05-28 20:26
    stack.store.update(stack.store.get(run.id), Expect(), {"checkpoint": recorded, "retention": swept})

    said = f"run {run.id}'s checkpoints were deleted on 2026-05-28 20:26 UTC by the retention of its pool parked"
    shown = cli(devstack, tmp_path, "download", "--checkpoint", run.id, str(tmp_path / "none"))
    assert (shown.returncode, shown.stderr.strip()) == (3, f"error: {said}")
    later = cli(devstack, tmp_path, "run", "--queue", "parked", "--from-checkpoint", run.id, "--", "true")
    assert later.returncode == 3 and said in later.stderr, later.stderr
    assert "no checkpoint yet" not in later.stderr
