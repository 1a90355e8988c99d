"""A run's live outputs as the agent's scanner uploads them (worker_agent/live.py), one pass at a
time with an injected clock, into the embedded stack's object store: what changed goes up, what
did not stays, and the bounds (file size, bytes a minute, file count) and the tree's safety
(symlinks out of it, fifos) hold."""

import os
import time

import pytest

from runplane.adapters.local.files import FileObjectStore
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE
from worker_agent.executor import RunExecutor
from worker_agent.live import MIN_ENTRIES, LiveLimits, LiveOutputs
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.users import ImageUsers

PREFIX = "runs/r-1/outputs/1/live/"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def objects(tmp_path):
    return FileObjectStore(tmp_path / "state", "data", lambda: b"k" * 32, "http://127.0.0.1:1")


def live(objects, root, clock=None, **limits):
    return LiveOutputs(objects, root, PREFIX, clock or Clock(), LiveLimits(**limits))


def keys(objects):
    return sorted(o.key.removeprefix(PREFIX) for o in objects.list(PREFIX))


def test_changed_files_go_up_and_unchanged_ones_do_not(objects, tmp_path):
    root = tmp_path / "live"
    (root / "plots").mkdir(parents=True)
    (root / "metrics.txt").write_text("step 1\n")
    (root / "plots" / "loss.svg").write_text("<svg/>")
    scanner = live(objects, root)
    assert scanner.scan_once() == 2
    assert keys(objects) == ["metrics.txt", "plots/loss.svg"]
    assert scanner.scan_once() == 0  # nothing changed: nothing sent again
    (root / "metrics.txt").write_text("step 1\nstep 2\n")
    assert scanner.scan_once() == 1
    assert objects.get_bytes(PREFIX + "metrics.txt") == b"step 1\nstep 2\n"
    assert scanner.uploads == 3 and scanner.notices == []


def test_a_file_over_the_size_bound_waits_for_the_end_said_once(objects, tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    (root / "big.bin").write_bytes(b"x" * 2048)
    (root / "small.txt").write_text("ok")
    scanner = live(objects, root, max_file_bytes=1024)
    scanner.scan_once()
    scanner.scan_once()
    assert keys(objects) == ["small.txt"]
    assert len(scanner.notices) == 1 and scanner.notices[0].startswith("live/big.bin (over 1k: ")


def test_bytes_a_minute_are_bounded_and_the_rest_goes_up_the_next_minute(objects, tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / name).write_bytes(name.encode() * 4000)
    clock = Clock()
    scanner = live(objects, root, clock, bytes_per_minute=10_000)
    assert scanner.scan_once() == 2  # 8000 bytes; a third file would pass 10000
    clock.now += 30
    assert scanner.scan_once() == 0  # the same minute
    clock.now += 30
    assert scanner.scan_once() == 1
    assert keys(objects) == ["a", "b", "c"] and scanner.notices == []


def test_a_symlink_out_of_the_tree_is_never_followed(objects, tmp_path):
    """Hostile: a run links a file of the host (or of its output directory beside live/)."""
    (tmp_path / "secret.txt").write_text("host secret")
    root = tmp_path / "live"
    root.mkdir()
    (root / "real.txt").write_text("mine")
    os.symlink(tmp_path / "secret.txt", root / "absolute")
    os.symlink("../secret.txt", root / "climbing")
    os.symlink("real.txt", root / "inside")
    scanner = live(objects, root)
    scanner.scan_once()
    assert keys(objects) == ["inside", "real.txt"]
    assert objects.get_bytes(PREFIX + "inside") == b"mine"
    assert sorted(scanner.notices) == [
        "live/absolute (symlink out of the output directory)",
        "live/climbing (symlink out of the output directory)",
    ]


def test_a_live_directory_replaced_by_a_symlink_is_not_entered(objects, tmp_path):
    """Hostile: ``live`` itself a link to a directory of the host; the notice names no host path."""
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "secret.txt").write_text("host secret")
    os.symlink(tmp_path / "host", tmp_path / "live")
    scanner = live(objects, tmp_path / "live")
    assert scanner.scan_once() == 0
    assert keys(objects) == []
    assert scanner.notices == ["live/ could not be read whole (not a directory, or too deep)"]


def test_a_fifo_is_passed_over_without_blocking(objects, tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    os.mkfifo(root / "pipe")  # nobody writes to it: reading would wait for ever
    os.symlink("pipe", root / "to-pipe")
    (root / "after.txt").write_text("still read")
    scanner = live(objects, root)
    assert scanner.scan_once() == 1
    assert keys(objects) == ["after.txt"]
    assert sorted(scanner.notices) == ["live/pipe (not a regular file)", "live/to-pipe (not a regular file)"]


def test_only_the_first_files_are_looked_at(objects, tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    for i in range(5):
        (root / f"f{i}").write_text(str(i))
    scanner = live(objects, root, max_files=3)
    assert scanner.scan_once() == 3
    first = keys(objects)
    assert scanner.scan_once() == 0  # the same three: nothing changed
    assert len(first) == 3 and set(first) < {f"f{i}" for i in range(5)}
    assert scanner.notices == ["live/ holds more than 3 files: only 3 are uploaded"]


def test_a_tree_of_directories_is_read_no_further_than_the_entry_bound(objects, tmp_path):
    """Hostile: entries that are no files cost a scan too; past the bound it stops, said once."""
    root = tmp_path / "live"
    (root / "deep").mkdir(parents=True)
    for i in range(MIN_ENTRIES):
        (root / "deep" / str(i)).mkdir()
    (root / "metrics.txt").write_text("step 1\n")  # listed with deep/, before deep/'s entries
    scanner = live(objects, root, max_files=2)
    assert scanner.scan_once() == 1
    scanner.scan_once()
    assert keys(objects) == ["metrics.txt"]
    assert scanner.notices == [f"live/ holds more than {MIN_ENTRIES} entries: the rest is not read"]


def test_a_failed_upload_is_tried_again_at_the_next_scan(tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    (root / "metrics.txt").write_text("step 1\n")
    state = tmp_path / "state"
    missing = FileObjectStore(state, "later", lambda: b"k" * 32, "http://127.0.0.1:1", make_bucket=False)
    scanner = live(missing, root)
    assert scanner.scan_once() == 0  # the bucket is not there yet: the store refuses
    there = FileObjectStore(state, "later", lambda: b"k" * 32, "http://127.0.0.1:1")
    assert scanner.scan_once() == 1
    assert there.get_bytes(PREFIX + "metrics.txt") == b"step 1\n"


def test_a_missing_live_directory_is_nothing_to_upload(objects, tmp_path):
    scanner = live(objects, tmp_path / "live")
    assert scanner.scan_once() == 0 and scanner.notices == []


def test_copies_of_files_removed_from_live_are_dropped_before_the_final_upload(objects, tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    (root / "metrics.tmp").write_text("half")
    (root / "kept.txt").write_text("kept")
    scanner = live(objects, root)
    scanner.scan_once()
    (root / "metrics.tmp").rename(root / "metrics.txt")  # written aside, renamed into place
    scanner.drop_removed()
    assert keys(objects) == ["kept.txt"]


@pytest.mark.docker
def test_a_run_passes_over_a_large_live_file_says_so_and_uploads_it_at_the_end(local_stack, docker_client, tmp_path):
    """The executor's scans on the real engine: a small file goes up while the run goes, a large
    one only at the end, and the run's final message says so."""
    command = (
        'mkdir -p "$RUNPLANE_OUTPUT/live"; echo ok > "$RUNPLANE_OUTPUT/live/small.txt"; '
        'head -c 4096 /dev/zero > "$RUNPLANE_OUTPUT/live/big.bin"; '
        "i=0; while [ ! -e /tmp/go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"
    )
    spec = RunSpec.model_validate({"command": command, "queue": "manual", "image": TEST_IMAGE})
    run = submit_run(local_stack.ports, Principal(user="alice"), spec, None).run
    claimed = lifecycle.claim(local_stack.store, run, run.attempt, "w-live", lease_seconds=60, now=time.time())
    limits = LiveLimits(interval=0.2, max_file_bytes=1024)
    config = ExecutorConfig(
        worker_id="w-live", work_dir=tmp_path / "w", stack_id=local_stack.settings.stack_id(), pull="never", live=limits
    )
    ports = AgentPorts(local_stack.store, local_stack.queue, local_stack.objects)
    executor = RunExecutor(claimed, ports, docker_client, config, time.time, users=ImageUsers(docker_client))
    executor.start()
    prefix = f"runs/{run.id}/outputs/1/live/"
    deadline = time.monotonic() + 30
    while not local_stack.objects.list(prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [o.key for o in local_stack.objects.list(prefix)] == [prefix + "small.txt"]  # while it runs
    executor.box.container.exec_run(["touch", "/tmp/go"])
    executor.thread.join(60)
    ended = local_stack.store.get(run.id)
    assert ended.state == RunState.SUCCEEDED, ended.failure
    assert sorted(o.key for o in local_stack.objects.list(prefix)) == [prefix + "big.bin", prefix + "small.txt"]
    assert "not uploaded while it ran: live/big.bin (over 1k: uploaded when the run ends)" in ended.events[-1].message
