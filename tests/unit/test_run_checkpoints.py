"""The agent's side of a run's checkpoints without a container (worker_agent/run_checkpoints.py), on the
one-machine stack's stores: each sync is recorded on the run and the series pruned to its newest two;
the sync thread gives the run its end when the directory is over the disk limit, writing no checkpoint;
a worker that lost the run writes no record of its sync."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from runplane.domain.checkpoints import blobs_prefix, checkpoints_prefix, manifest_key
from runplane.domain.common import SCHEMA_VERSION
from runplane.domain.errors import BackendError, LeaseLost
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.checkpoints import newest
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE
from worker_agent import run_checkpoints
from worker_agent.checkpoints import sync
from worker_agent.run_checkpoints import CheckpointUnreachable, RunCheckpoints
from worker_agent.run_state import RunStateWriter


def checkpoints(
    stack: Any, tmp_path: Path, rule: dict[str, Any] | None, disk: int | None = None, **fields: Any
) -> RunCheckpoints:
    spec = RunSpec.model_validate(
        {"command": "true", "queue": "manual", "image": TEST_IMAGE, "checkpoint": rule, **fields}
    )
    run = submit_run(stack.ports, Principal(user="alice"), spec, None).run
    claimed = lifecycle.claim(stack.store, run, run.attempt, "w-1", 60, time.time())
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    return RunCheckpoints(
        RunStateWriter(claimed, stack.ports, time.time), stack.objects, directory, tmp_path, time.time, disk
    )


def manifests(stack: Any, run_id: str) -> list[str]:
    keys = [o.key for o in stack.objects.list(checkpoints_prefix(run_id))]
    return [k for k in keys if not k.startswith(blobs_prefix(run_id))]


def test_each_sync_is_recorded_and_the_series_keeps_its_newest_two(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    for step in range(3):
        (saves.directory / "step").write_text(str(step))
        assert saves.sync() is None
    record = local_stack.store.get(run_id).checkpoint
    assert (record.seq, record.attempt, record.files, record.bytes, record.series) == (3, 1, 1, 1, None)
    assert [k.rsplit("/", 2)[-2] for k in manifests(local_stack, run_id)] == ["00000002", "00000003"]
    assert saves.previous is not None and saves.previous.seq == 3


def test_a_sync_of_a_directory_that_did_not_change_writes_nothing_and_prunes_nothing(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    (saves.directory / "sub").mkdir()
    (saves.directory / "sub" / "weights").write_text("w1")
    assert saves.sync() is None
    recorded = local_stack.store.get(run_id).checkpoint
    orphan = blobs_prefix(run_id) + "0" * 64  # what a sync cut halfway leaves: a prune would take it
    local_stack.objects.put_bytes(orphan, b"left")
    assert saves.sync() is None
    assert [k.rsplit("/", 2)[-2] for k in manifests(local_stack, run_id)] == ["00000001"]
    assert local_stack.store.get(run_id).checkpoint == recorded
    assert local_stack.objects.get_bytes(orphan) == b"left"
    for change in (
        lambda: (saves.directory / "sub").chmod(0o750),
        lambda: os.utime(saves.directory / "sub" / "weights", ns=(1, 1)),
        lambda: (saves.directory / "sub" / "weights").chmod(0o600),
        lambda: (saves.directory / "other").mkdir(),
    ):
        change()
        before = saves.previous.seq
        assert saves.sync() is None
        assert saves.previous.seq == before + 1, change  # each a change a checkpoint keeps


def test_at_the_runs_end_a_series_whose_last_sync_was_cut_is_pruned_of_what_it_left(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    orphan = blobs_prefix(run_id) + "0" * 64  # what a sync cut before its manifest leaves
    local_stack.objects.put_bytes(orphan, b"left")
    saves.finish()  # not one complete checkpoint: only what no manifest names goes
    assert list(local_stack.objects.list(checkpoints_prefix(run_id))) == []
    (saves.directory / "a").write_text("a")
    assert saves.sync() is None
    local_stack.objects.put_bytes(orphan, b"left")
    (saves.directory / "a").write_text("b")
    assert saves.sync(lambda: True) is None  # cut: the checkpoint before stays the newest
    saves.finish()
    left = [o.key for o in local_stack.objects.list(checkpoints_prefix(run_id))]
    assert left == [*manifests(local_stack, run_id), saves.previous.files[0].key]
    assert manifests(local_stack, run_id) == [manifest_key(run_id, 1)]


def test_the_sync_thread_ends_the_run_when_the_checkpoint_is_over_the_disk_limit(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 1}, disk=1000)
    (saves.directory / "big").write_bytes(b"x" * 2000)
    saves.start()
    deadline = time.monotonic() + 30
    while saves.over is None and time.monotonic() < deadline:
        time.sleep(0.05)
    saves.stop()
    assert saves.over is not None and saves.over.reason == FailureReason.DISK_LIMIT and not saves.over.upload
    assert "no checkpoint was written" in saves.over.message
    assert manifests(local_stack, saves.state.run.id) == []
    assert local_stack.store.get(saves.state.run.id).checkpoint is None


def test_a_worker_that_lost_the_run_records_no_sync(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run = saves.state.run
    lifecycle.requeue(local_stack.ports, run, time.time(), "lease expired")  # the reaper's doing
    (saves.directory / "a").write_text("a")
    with pytest.raises(LeaseLost):
        saves.sync()
    assert local_stack.store.get(run.id).checkpoint is None
    assert manifests(local_stack, run.id) == []  # the series has one writer, its run's holder


def test_a_sync_uploads_again_a_blob_of_the_checkpoint_before_that_a_prune_took_meanwhile(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    (saves.directory / "kept").write_text("unchanged")
    assert saves.sync() is None
    local_stack.objects.delete([f.key for f in saves.previous.files])  # a worker that lost the run pruned
    (saves.directory / "new").write_text("new")
    assert saves.sync() is None
    assert newest(local_stack.objects, run_id).seq == 2  # complete: every blob it names is stored


def test_a_restore_writes_the_newest_checkpoint_and_says_what_it_restored(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    made = tmp_path / "made"
    made.mkdir()
    (made / "weights").write_bytes(b"w" * 3072)
    sync(local_stack.objects, run_id, made, None)
    assert saves.restore((os.getuid(), os.getgid())) is None
    assert (saves.directory / "weights").read_bytes() == b"w" * 3072
    assert saves.previous is not None and saves.previous.seq == 1
    said = local_stack.store.get(run_id).events[-1].message
    assert said == f"restored checkpoint 1 (1 file, 3.0 KiB) of run {run_id}"


def test_a_sync_that_meets_what_no_one_foresaw_is_counted_and_the_next_one_goes_on(local_stack, tmp_path, monkeypatch):
    saves = checkpoints(local_stack, tmp_path, {"interval": 1})
    (saves.directory / "a").write_text("a")
    real = run_checkpoints.checkpoints.sync
    calls = []

    def first_fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a manifest that does not validate")
        return real(*args, **kwargs)

    monkeypatch.setattr(run_checkpoints.checkpoints, "sync", first_fails)
    assert saves.sync() is None
    assert (saves.failures, saves.failed) == (1, "ValueError (see the worker's log)")
    saves.start()  # the thread syncs on after a failure
    deadline = time.monotonic() + 30
    while local_stack.store.get(saves.state.run.id).checkpoint is None and time.monotonic() < deadline:
        time.sleep(0.05)
    saves.stop()
    assert local_stack.store.get(saves.state.run.id).checkpoint is not None
    assert saves.failed is None and saves.over is None


def test_failing_syncs_are_said_once_on_the_timeline_and_so_is_the_first_that_succeeds_again(
    local_stack, tmp_path, monkeypatch
):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    (saves.directory / "a").write_text("a")
    assert saves.sync() is None
    real = local_stack.objects.put_bytes

    def down(*args: Any, **kwargs: Any) -> None:  # an outage of the store, which cannot be had here
        raise BackendError("object store unavailable (throttled)")

    monkeypatch.setattr(local_stack.objects, "put_bytes", down)
    for step in range(3):
        (saves.directory / "a").write_text(f"a{step}")
        assert saves.sync() is None
    monkeypatch.setattr(local_stack.objects, "put_bytes", real)
    assert saves.sync() is None
    said = [e.message for e in local_stack.store.get(run_id).events if "checkpoint sync" in e.message]
    assert said == [
        "checkpoint sync failed: object store unavailable (throttled); checkpoint 1 is the newest complete one",
        "checkpoint syncs succeed again: checkpoint 2 is the newest",
    ]
    assert saves.failures == 3


def synced(stack: Any, run_id: str, tmp_path: Path, text: bytes, previous: Any = None) -> Any:
    """A checkpoint of ``run_id``'s series holding the file ``weights`` (as an earlier attempt synced it)."""
    made = tmp_path / f"made-{run_id}-{previous.seq if previous else 0}"
    made.mkdir()
    (made / "weights").write_bytes(text)
    return sync(stack.objects, run_id, made, previous)


def spoil(stack: Any, manifest: Any) -> None:
    """Its blob's bytes changed, at the same size: listed complete, found unusable when written."""
    key = manifest.files[0].key
    stack.objects.put_bytes(key, b"?" * manifest.files[0].size)


def test_a_newest_checkpoint_found_unusable_while_restored_gives_way_to_the_one_before(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    first = synced(local_stack, run_id, tmp_path, b"one")
    spoil(local_stack, synced(local_stack, run_id, tmp_path, b"two!", first))
    assert saves.restore((os.getuid(), os.getgid())) is None
    assert (saves.directory / "weights").read_bytes() == b"one"
    assert local_stack.store.get(run_id).events[-1].message.startswith("restored checkpoint 1 ")


def test_a_source_checkpoint_found_unusable_gives_way_to_the_sources_newest(local_stack, tmp_path):
    (tmp_path / "s").mkdir()
    source = checkpoints(local_stack, tmp_path / "s", {"interval": 60}).state.run.id
    first = synced(local_stack, source, tmp_path, b"one")
    saves = checkpoints(local_stack, tmp_path, {"interval": 60}, from_checkpoint=source)
    assert saves.state.run.restore_from.seq == 1
    synced(local_stack, source, tmp_path, b"two!", first)
    spoil(local_stack, first)  # as a prune of the source's series meanwhile would leave it
    assert saves.restore((os.getuid(), os.getgid())) is None
    assert (saves.directory / "weights").read_bytes() == b"two!"
    said = local_stack.store.get(saves.state.run.id).events[-1].message
    assert said.startswith("restored checkpoint 2 ") and "which it was started from" in said


def test_a_run_started_from_a_checkpoint_without_a_rule_of_its_own_restores_it_and_never_syncs(local_stack, tmp_path):
    (tmp_path / "s").mkdir()
    source = checkpoints(local_stack, tmp_path / "s", {"interval": 60}).state.run.id
    synced(local_stack, source, tmp_path, b"trained")
    saves = checkpoints(local_stack, tmp_path, None, from_checkpoint=source)
    run_id = saves.state.run.id
    assert saves.restore((os.getuid(), os.getgid())) is None
    (saves.directory / "scores").write_text("0.93")  # what an evaluation writes there is not kept
    assert saves.sync() is None
    assert manifests(local_stack, run_id) == [] and list(local_stack.objects.list(checkpoints_prefix(run_id))) == []
    assert local_stack.store.get(run_id).checkpoint.series == source  # still the one it restored


def test_a_restore_the_store_fails_for_now_is_to_be_handed_back_and_writes_nothing(local_stack, tmp_path, monkeypatch):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    synced(local_stack, saves.state.run.id, tmp_path, b"one")

    def down(*args: Any, **kwargs: Any) -> None:  # an outage of the store, which cannot be had here
        raise BackendError("object store unavailable (throttled)")

    monkeypatch.setattr(local_stack.objects, "download_file", down)
    with pytest.raises(CheckpointUnreachable, match="throttled"):
        saves.restore((os.getuid(), os.getgid()))
    assert list(saves.directory.iterdir()) == []


def test_a_checkpoint_of_a_later_release_is_refused_not_restored_in_part(local_stack, tmp_path):
    saves = checkpoints(local_stack, tmp_path, {"interval": 60})
    run_id = saves.state.run.id
    made = synced(local_stack, run_id, tmp_path, b"one")
    later = json.loads(local_stack.objects.get_bytes(manifest_key(run_id, made.seq)))
    later.update(v=SCHEMA_VERSION + 1, links=[{"path": "latest", "to": "weights"}])  # what it cannot write back
    local_stack.objects.put_bytes(manifest_key(run_id, made.seq), json.dumps(later).encode())
    ended = saves.restore((os.getuid(), os.getgid()))
    assert ended is not None and ended.reason == FailureReason.INPUT_UNAVAILABLE
    assert "written by a later release" in ended.message
    assert list(saves.directory.iterdir()) == []
