"""A run's checkpoints as its executor keeps them, on the real engine and the embedded stack's stores:
restored before its container starts (its own series first, else the checkpoint it was started from),
synced every interval while it runs and once more when it ends or is handed back (after its command
was warned by its signal), its pieces started again in the same attempt, and a checkpoint over the
disk limit or one that cannot be restored ending the run with a message that says so."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runplane.domain.accounting import Rates
from runplane.domain.checkpoints import CheckpointSource, blobs_prefix, checkpoints_prefix, manifest_key
from runplane.domain.errors import BackendError
from runplane.domain.expect import Expect
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.checkpoints import newest
from runplane.services.runs import kill_run, submit_run
from tests.conftest import TEST_IMAGE
from tests.integration.test_preemption import Metadata, MetadataHandler
from worker_agent.checkpoints import sync
from worker_agent.executor import RunExecutor
from worker_agent.preemption import make_probe
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker

CK = '"$RUNPLANE_CHECKPOINT_DIR"'
OUT = '"$RUNPLANE_OUTPUT"'


def submit(stack: Any, command: str, **fields: Any) -> Run:
    spec = RunSpec.model_validate({"command": command, "queue": "manual", "image": TEST_IMAGE, **fields})
    return submit_run(stack.ports, Principal(user="alice"), spec, None).run


def executor(stack: Any, docker_client: Any, tmp_path: Path, run: Run, **config: Any) -> RunExecutor:
    claimed = lifecycle.claim(stack.store, stack.store.get(run.id), run.attempt, "w-ck", 60, time.time())
    settings = ExecutorConfig(
        worker_id="w-ck",
        work_dir=tmp_path / "w",
        stack_id=stack.settings.stack_id(),
        pull="never",
        kill_poll_seconds=0.2,
        **config,
    )
    ports = AgentPorts(stack.store, stack.queue, stack.objects)
    return RunExecutor(claimed, ports, docker_client, settings, time.time, users=ImageUsers(docker_client))


def run_to_end(stack: Any, docker_client: Any, tmp_path: Path, run: Run, **config: Any) -> Run:
    ex = executor(stack, docker_client, tmp_path, run, **config)
    ex.run_safely()
    return stack.store.get(run.id)


def output(stack: Any, run: Run, name: str, attempt: int = 1) -> str:
    return stack.objects.get_bytes(f"runs/{run.id}/outputs/{attempt}/{name}").decode()


def manifests(stack: Any, run_id: str) -> list[str]:
    blobs = blobs_prefix(run_id)
    return [o.key for o in stack.objects.list(checkpoints_prefix(run_id)) if not o.key.startswith(blobs)]


def seed(stack: Any, run_id: str, tmp_path: Path, files: dict[str, str], previous: Any = None) -> Any:
    """A checkpoint of ``run_id``'s series holding ``files`` (as an earlier attempt would have synced it)."""
    directory = tmp_path / f"seed-{run_id}-{len(files)}-{previous.seq if previous else 0}"
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)
    return sync(stack.objects, run_id, directory, previous)


def wait_for(what: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("not seen in time")


def test_every_attempt_starts_from_the_newest_checkpoint_of_its_series_owned_by_its_user(
    local_stack, docker_client, tmp_path
):
    command = (
        f"ls -ln {CK} > {OUT}/ls.txt; echo more >> {CK}/state.txt && cat {CK}/state.txt > {OUT}/seen.txt; "
        f'echo "$RUNPLANE_CHECKPOINT_DIR" > {OUT}/where.txt'
    )
    run = submit(local_stack, command, checkpoint={"interval": 3600})
    seed(local_stack, run.id, tmp_path, {"state.txt": "step 41\n"})
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.run_safely()
    ended = local_stack.store.get(run.id)
    assert ended.state == RunState.SUCCEEDED, ended.failure
    assert output(local_stack, run, "seen.txt") == "step 41\nmore\n"  # restored, and writable by the run
    assert output(local_stack, run, "where.txt") == "/runplane/checkpoint\n"
    listed = output(local_stack, run, "ls.txt").splitlines()[-1].split()
    assert listed[2:4] == [str(ex.run_as.uid), str(ex.run_as.gid)] and listed[-1] == "state.txt"
    assert any(e.message.startswith(f"restored checkpoint 1 (1 file, 8 bytes) of run {run.id}") for e in ended.events)
    # the final sync: checkpoint 2, what the run wrote, recorded on the run
    assert ended.checkpoint is not None and (ended.checkpoint.seq, ended.checkpoint.attempt) == (2, 1)
    assert [f.path for f in newest(local_stack.objects, run.id).files] == ["state.txt"]
    assert ended.checkpoint.bytes == len("step 41\nmore\n")


def test_a_run_started_from_another_runs_checkpoint_syncs_to_its_own_series(local_stack, docker_client, tmp_path):
    """The pinned checkpoint was pruned meanwhile: that run's newest is restored, and the timeline says so."""
    source = submit(local_stack, "sh -c true")
    first = seed(local_stack, source.id, tmp_path, {"model.bin": "v1"})
    seed(local_stack, source.id, tmp_path, {"model.bin": "v2", "notes.txt": "n"}, first)
    local_stack.objects.delete([manifest_key(source.id, 1)])  # as a prune of the source's series does
    command = (
        f"cat {CK}/model.bin > {OUT}/model.txt; echo v3 > {CK}/model.bin; "
        f"i=0; while [ ! -e {CK}/go ] && [ $i -lt 600 ]; do i=$((i+1)); sleep 0.1; done"
    )
    run = submit(local_stack, command, checkpoint={"interval": 3600})
    local_stack.store.update(run, Expect(), {"restore_from": CheckpointSource(run=source.id, seq=1)})
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.start()
    restored = wait_for(lambda: local_stack.store.get(run.id).checkpoint)
    assert (restored.series, restored.seq, restored.files) == (source.id, 2, 2)  # until its own first sync
    (ex.setup.checkpoint_dir / "go").write_text("")
    ex.thread.join(60)
    ended = local_stack.store.get(run.id)
    assert ended.state == RunState.SUCCEEDED, ended.failure
    assert output(local_stack, run, "model.txt") == "v2"
    said = [e.message for e in ended.events if e.message.startswith("restored checkpoint")]
    assert said == [
        f"restored checkpoint 2 (2 files, 3 bytes) of run {source.id} (checkpoint 1, which it was started "
        "from, is gone: its newest instead)"
    ]
    own = newest(local_stack.objects, run.id)
    assert own is not None and own.series == run.id and own.seq == 1
    assert all(f.key.startswith(blobs_prefix(run.id)) for f in own.files)
    stored = {f.path: local_stack.objects.get_bytes(f.key) for f in own.files}
    assert stored == {"go": b"", "model.bin": b"v3\n", "notes.txt": b"n"}
    assert (ended.checkpoint.series, ended.checkpoint.seq) == (None, 1)


def test_a_run_whose_source_has_no_checkpoint_left_fails_saying_so(local_stack, docker_client, tmp_path):
    gone = "r-00000000000000000000dead"
    run = submit(local_stack, "sh -c true")
    local_stack.store.update(run, Expect(), {"restore_from": CheckpointSource(run=gone, seq=3)})
    ended = run_to_end(local_stack, docker_client, tmp_path, run)
    assert ended.state == RunState.FAILED and ended.failure.reason == FailureReason.INPUT_UNAVAILABLE
    assert ended.failure.message.startswith(f"run {gone}, whose checkpoint 3 it starts from, has no checkpoint")


def test_interval_syncs_advance_while_it_runs_and_old_checkpoints_are_pruned(local_stack, docker_client, tmp_path):
    command = f"i=0; while [ ! -e {CK}/stop ] && [ $i -lt 600 ]; do i=$((i+1)); echo $i > {CK}/count; sleep 0.1; done"
    run = submit(local_stack, command, checkpoint={"interval": 1})
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.start()

    def synced_twice() -> bool:
        status = local_stack.store.get(run.id).checkpoint
        return status is not None and status.seq >= 2

    wait_for(synced_twice)
    assert local_stack.store.get(run.id).state == RunState.RUNNING  # synced while it runs
    (ex.setup.checkpoint_dir / "stop").write_text("")
    ex.thread.join(60)
    ended = local_stack.store.get(run.id)
    assert ended.state == RunState.SUCCEEDED, ended.failure
    assert ended.checkpoint.seq >= 3
    assert len(manifests(local_stack, run.id)) == 2  # the newest two kept
    last = newest(local_stack.objects, run.id)
    assert sorted(f.path for f in last.files) == ["count", "stop"]
    assert not [e for e in ended.events if "checkpoint" in e.message]  # no event per sync


def test_a_run_handed_back_is_warned_syncs_what_its_handler_wrote_and_keeps_its_attempt(
    local_stack, docker_client, tmp_path
):
    command = (
        f"trap 'echo saved at handoff > {CK}/last.txt; exit 0' USR1; echo up > {CK}/up; "
        "i=0; while [ $i -lt 600 ]; do i=$((i+1)); sleep 0.1; done"
    )
    run = submit(local_stack, command, checkpoint={"signal": "SIGUSR1", "grace": 30})
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.start()
    wait_for(lambda: (ex.setup.checkpoint_dir / "up").exists())
    ex.stop_and_requeue()
    ex.thread.join(60)
    back = local_stack.store.get(run.id)
    assert back.state == RunState.QUEUED, back.failure
    assert back.max_attempts == run.max_attempts + 1  # the hand-back used no attempt
    last = newest(local_stack.objects, run.id)
    stored = {f.path: local_stack.objects.get_bytes(f.key) for f in last.files}
    assert stored == {"last.txt": b"saved at handoff\n", "up": b"up\n"}
    assert back.checkpoint is not None and back.checkpoint.seq == last.seq


def test_a_grace_longer_than_the_agents_stop_budget_is_cut_to_its_share(local_stack, docker_client, tmp_path):
    command = f"trap '' USR1; echo up > {CK}/up; i=0; while [ $i -lt 900 ]; do i=$((i+1)); sleep 0.1; done"
    run = submit(local_stack, command, checkpoint={"signal": "SIGUSR1", "grace": 3600})
    ex = executor(local_stack, docker_client, tmp_path, run, stop_budget_seconds=4)
    ex.start()
    wait_for(lambda: (ex.setup.checkpoint_dir / "up").exists())
    ex.stop_and_requeue()
    ex.thread.join(60)  # a grace of 3 s (three quarters of the budget), not the hour asked for
    assert not ex.thread.is_alive()
    back = local_stack.store.get(run.id)
    assert back.state == RunState.QUEUED and back.checkpoint is not None, back.failure


def test_a_preemption_notices_moment_cuts_a_grace_the_stop_budget_allows(local_stack, docker_client, tmp_path):
    """Handed back, the command is signalled and has a grace of 750 s (the rule's hour, cut by a stop
    budget of 1000 s); then EC2's notice (served on loopback) says the machine goes in 22 s: the grace
    ends within three quarters of the 12 s left before the margin, and the directory is synced."""
    command = (
        f"trap 'echo > {CK}/signalled' USR1; echo up > {CK}/up; "
        "i=0; while [ $i -lt 9000 ]; do i=$((i+1)); sleep 0.1; done"
    )
    run = submit(local_stack, command, checkpoint={"signal": "SIGUSR1", "grace": 3600})
    ex = executor(local_stack, docker_client, tmp_path, run, stop_budget_seconds=1000)
    state = Metadata()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (MetadataHandler,), {"state": state}))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        ex.start()
        wait_for(lambda: (ex.setup.checkpoint_dir / "up").exists())
        ex.stop_and_requeue()  # its agent stopping with pass-down: the grace begins
        wait_for(lambda: (ex.setup.checkpoint_dir / "signalled").exists())
        goes = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 22))
        state.spot_action = {"action": "terminate", "time": goes}
        notice = make_probe("ec2", f"http://127.0.0.1:{server.server_address[1]}")()
        assert notice is not None and notice.leaves_at is not None
        ex.stop_and_requeue(preempted=True, leaves_at=notice.leaves_at)
        ex.thread.join(60)
    finally:
        server.shutdown()
        server.server_close()
    assert not ex.thread.is_alive()
    back = local_stack.store.get(run.id)
    assert back.state == RunState.QUEUED and back.checkpoint is not None, back.failure  # and synced after it
    assert sorted(f.path for f in newest(local_stack.objects, run.id).files) == ["signalled", "up"]


class ManifestsDown:
    """The stack's object store, whose puts of checkpoint manifests fail (an outage that cannot be had here)."""

    def __init__(self, objects: Any) -> None:
        self._objects = objects

    def __getattr__(self, name: str) -> Any:
        return getattr(self._objects, name)

    def put_bytes(self, key: str, data: bytes) -> None:
        if key.endswith("/manifest.json"):
            raise BackendError("object store unavailable")
        self._objects.put_bytes(key, data)


def test_a_final_sync_that_fails_is_said_in_the_runs_message(local_stack, docker_client, tmp_path):
    run = submit(local_stack, f"echo state > {CK}/state", checkpoint={"interval": 3600})
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.saves.objects = ManifestsDown(local_stack.objects)
    ex.run_safely()
    ended = local_stack.store.get(run.id)
    assert ended.state == RunState.SUCCEEDED and ended.checkpoint is None
    assert any("its last checkpoint sync failed" in e.message for e in ended.events)
    assert list(local_stack.objects.list(checkpoints_prefix(run.id))) == []  # its blob, which no manifest names


class DownloadsDown(ManifestsDown):
    def download_file(self, key: str, path: Path, max_bytes: int | None = None) -> None:
        raise BackendError("object store throttled")


def test_a_restore_the_store_fails_for_now_hands_the_run_back_without_an_attempt(local_stack, docker_client, tmp_path):
    run = submit(local_stack, f"echo ran > {OUT}/ran.txt", checkpoint={"interval": 3600})
    seed(local_stack, run.id, tmp_path, {"state": "s"})
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.saves.objects = DownloadsDown(local_stack.objects)
    ex.control.requeue.set()  # no pause before the hand-back
    ex.run_safely()
    back = local_stack.store.get(run.id)
    assert back.state == RunState.QUEUED and back.max_attempts == run.max_attempts + 1, back.failure
    assert "throttled" in back.events[-1].message


PIECES = (
    f"n=$(cat {CK}/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > {CK}/n; echo piece $n > {OUT}/piece$n.txt; "
    '[ "$n" -lt 3 ] && exit 3; exit 0'
)


def test_a_run_in_three_pieces_completes_in_one_attempt(local_stack, docker_client, tmp_path):
    run = submit(local_stack, PIECES, checkpoint={"exit_code": 3, "max_pieces": 3})
    ended = run_to_end(local_stack, docker_client, tmp_path, run, piece_backoff_seconds=0.1)
    assert ended.state == RunState.SUCCEEDED, ended.failure
    assert (ended.attempt, ended.pieces) == (1, 2)
    assert [e.message for e in ended.events if e.message.startswith("piece ")] == [
        "piece 1 ended with exit code 3; piece 2 starts after a 0.1 s pause (a short piece)",
        "piece 2 ended with exit code 3; piece 3 starts after a 0.2 s pause (a short piece)",
    ]
    assert [output(local_stack, run, f"piece{n}.txt") for n in (1, 2, 3)] == ["piece 1\n", "piece 2\n", "piece 3\n"]
    assert newest(local_stack.objects, run.id).seq == 3  # synced at the end of each piece, and at the end


def test_a_later_piece_is_charged_from_the_attempts_start(local_stack, docker_client, tmp_path):
    command = f"if [ -e {CK}/first ]; then touch {CK}/second; exec sleep 60; fi; touch {CK}/first; sleep 4; exit 3"
    run = submit(local_stack, command, checkpoint={"exit_code": 3, "grace": 0}, resources={"cpus": 1})
    rates = Rates(cpus=1, price_per_hour=3600)
    ex = executor(local_stack, docker_client, tmp_path, run, rates=rates, usage_seconds=0.2)
    ex.start()
    wait_for(lambda: (ex.setup.checkpoint_dir / "second").exists())
    time.sleep(1)  # a few of the second piece's samples
    seen = ex.usage.cost
    ex.stop_and_requeue()
    ex.thread.join(60)
    assert seen is not None and seen >= 4  # one cpu-second a second, the first piece's 4 with the second's


def test_a_short_piece_is_followed_by_a_pause_that_a_kill_ends(local_stack, docker_client, tmp_path):
    run = submit(local_stack, "exit 3", checkpoint={"exit_code": 3, "max_pieces": 5, "grace": 0})
    ex = executor(local_stack, docker_client, tmp_path, run, piece_backoff_seconds=300)
    ex.start()
    wait_for(lambda: local_stack.store.get(run.id).pieces == 1)
    kill_run(local_stack.ports, Principal(user="alice"), run.id)
    ex.thread.join(60)  # the pause (300 s) is not waited out
    ended = local_stack.store.get(run.id)
    assert ended.state == RunState.KILLED and ended.pieces == 1, ended.failure


def test_one_piece_more_than_max_pieces_fails_the_run(local_stack, docker_client, tmp_path):
    run = submit(local_stack, PIECES, checkpoint={"exit_code": 3, "max_pieces": 2})
    ended = run_to_end(local_stack, docker_client, tmp_path, run, piece_backoff_seconds=0.1)
    assert ended.state == RunState.FAILED and ended.failure.reason == FailureReason.NONZERO_EXIT
    assert ended.failure.message == (
        "command exited with code 3 to be started again, but the run has gone in its max_pieces, 2 pieces"
    )
    assert (ended.attempt, ended.pieces) == (1, 1)
    assert json.loads(local_stack.objects.get_bytes(manifest_key(run.id, 2)))["files"][0]["path"] == "n"


def test_a_checkpoint_over_the_disk_limit_ends_the_run_and_writes_no_checkpoint(local_stack, docker_client, tmp_path):
    command = f"i=0; while [ $i -lt 40 ]; do cat /bin/busybox >> {CK}/big; i=$((i+1)); done"
    run = submit(local_stack, command, checkpoint={"interval": 3600}, resources={"disk": "4m"})
    ended = run_to_end(local_stack, docker_client, tmp_path, run)
    assert ended.state == RunState.FAILED and ended.failure.reason == FailureReason.DISK_LIMIT
    assert "checkpoint" in ended.failure.message
    assert manifests(local_stack, run.id) == [] and ended.checkpoint is None


def test_a_checkpoint_that_does_not_restore_fails_the_run_and_leaves_no_file(local_stack, docker_client, tmp_path):
    run = submit(local_stack, f"echo ran > {OUT}/ran.txt", checkpoint={"interval": 3600})
    made = seed(local_stack, run.id, tmp_path, {"a.txt": "first", "b.txt": "second"})
    corrupt = next(f for f in made.files if f.path == "b.txt")
    local_stack.objects.put_bytes(corrupt.key, b"SECOND")  # its size, other bytes
    left: list[list[str]] = []
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.on_done = lambda e: left.append(sorted(p.name for p in e.setup.checkpoint_dir.iterdir()))
    ex.run_safely()
    ended = local_stack.store.get(run.id)
    assert ended.state == RunState.FAILED and ended.failure.reason == FailureReason.INPUT_UNAVAILABLE
    assert ended.failure.message.startswith(f"checkpoint 1 of run {run.id} cannot be restored")
    assert left == [[]]  # nothing of it left in the directory
    assert ex.box.container is None  # the command never started


def test_a_run_handed_back_that_ignores_its_signal_is_held_to_its_time_limit_in_its_grace(
    local_stack, docker_client, tmp_path
):
    command = f"trap '' USR1; echo up > {CK}/up; i=0; while [ $i -lt 900 ]; do i=$((i+1)); sleep 0.1; done"
    run = submit(local_stack, command, checkpoint={"signal": "SIGUSR1", "grace": 120}, resources={"time": 3})
    ex = executor(local_stack, docker_client, tmp_path, run)
    ex.start()
    wait_for(lambda: (ex.setup.checkpoint_dir / "up").exists())
    ex.stop_and_requeue()
    ex.thread.join(60)  # the grace (120 s) is not waited out: the time limit stops it
    assert not ex.thread.is_alive()
    back = local_stack.store.get(run.id)
    assert back.state == RunState.TIMED_OUT, back.failure
    assert newest(local_stack.objects, run.id) is not None  # stopped, then synced
