"""A run's live outputs as the agent's scanner uploads them (worker_agent/live.py), one pass at a
time with an injected clock, into the embedded stack's object store: what changed goes up, what
did not stays, and the bounds (file size, bytes a minute, file count) and the tree's safety
(symlinks out of it, fifos) hold."""

import os
import threading
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
from worker_agent.live import MAX_COUNTED, MAX_NOTICES, MIN_ENTRIES, SHOWN_CHARS, LiveLimits, LiveOutputs
from worker_agent.outputs import collect, upload_dir
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


def test_a_file_grown_while_it_uploads_uploads_no_more_than_was_seen(objects, tmp_path):
    """Hostile: the run makes a file huge (sparse) between the scan's look at it and its read;
    what is stored is the size seen, and the file is not taken as sent."""
    root = tmp_path / "live"
    root.mkdir()
    (root / "metrics.txt").write_bytes(b"step 1\n")
    clock = Clock()

    class Growing:  # the scan asks the time between its size check and its read
        armed = False

        def __call__(self) -> float:
            if self.armed:
                os.truncate(root / "metrics.txt", 2**20)
            return clock.now

    growing = Growing()
    scanner = LiveOutputs(objects, root, PREFIX, growing, LiveLimits(max_file_bytes=1024))
    growing.armed = True
    assert scanner.scan_once() == 1
    growing.armed = False
    assert objects.get_bytes(PREFIX + "metrics.txt") == b"step 1\n"
    assert scanner.sent_bytes == 7
    clock.now += 60
    assert scanner.scan_once() == 0  # now over the bound: not sent again, said
    assert objects.get_bytes(PREFIX + "metrics.txt") == b"step 1\n"
    assert scanner.notices == ["live/metrics.txt (over 1k: uploaded when the run ends)"]


def test_what_is_passed_over_is_bounded_named_first_then_counted(objects, tmp_path):
    """Hostile: a run renames many fifos with long names every scan; the agent keeps a bounded
    few notices, each path cut short, and counts the rest up to a bound."""
    root = tmp_path / "live"
    root.mkdir()
    deep = root / ("d" * 200)
    deep.mkdir(parents=True)
    names = [f"{i}-" + "p" * 200 for i in range(300)]
    for name in names:
        os.mkfifo(deep / name)
    scanner = live(objects, root)
    for round_ in range(4):  # 1200 different paths in all
        scanner.scan_once()
        for name in names:
            os.rename(deep / f"{name}{round_ or ''}", deep / f"{name}{round_ + 1}")
    assert len(scanner.notices) == MAX_NOTICES
    assert all(len(notice) <= SHOWN_CHARS + 40 for notice in scanner.notices)
    assert scanner.notices[0].endswith("... (not a regular file)")
    assert scanner.summary(2) == f"{scanner.notices[0]}, {scanner.notices[1]}, and at least {MAX_COUNTED - 2} more"
    said = frozenset(scanner.notices)  # named by the final upload (paths cut alike): left out here, the rest counted
    assert scanner.summary(2, without=said) == f"at least {MAX_COUNTED - MAX_NOTICES} more"
    assert keys(objects) == []


def test_live_uploads_stop_at_the_total_bound_said_once(objects, tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / name).write_bytes(name.encode() * 4000)
    clock = Clock()
    scanner = live(objects, root, clock, max_total_bytes=10_240)
    assert scanner.scan_once() == 2
    (root / "a").write_bytes(b"A" * 10)  # small, changed: still nothing goes once stopped
    clock.now += 60
    assert scanner.scan_once() == 0
    assert keys(objects) == ["a", "b"] and objects.get_bytes(PREFIX + "a") == b"a" * 4000
    assert scanner.sent_bytes == 8000
    assert scanner.notices == ["live/ uploads stopped at 10k in all: the rest goes when the run ends"]
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "empty").touch()
    assert live(objects, tmp_path / "none", max_total_bytes=0).scan_once() == 0  # none at all, not even empty files


def test_copies_of_files_outside_a_capped_listing_are_kept(objects, tmp_path):
    """A file uploaded earlier and still there is not taken for removed because a later
    listing stopped at the file cap before reaching it."""
    root = tmp_path / "live"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "metrics.txt").write_text("step 1\n")
    (root / "gone.txt").write_text("soon gone")
    scanner = live(objects, root, max_files=2)
    assert scanner.scan_once() == 2
    (root / "gone.txt").unlink()
    for name in ("t1", "t2", "t3"):  # listed before sub/'s files: the listing stops at 2
        (root / name).write_text(name)
    scanner.drop_removed()
    assert keys(objects) == ["sub/metrics.txt"]


def test_copies_are_dropped_when_live_itself_is_removed(objects, tmp_path):
    root = tmp_path / "live"
    root.mkdir()
    (root / "metrics.txt").write_text("step 1\n")
    scanner = live(objects, root)
    scanner.scan_once()
    (root / "metrics.txt").unlink()
    root.rmdir()
    scanner.drop_removed()
    assert keys(objects) == []


class GatedStore:
    """The embedded store, whose uploads wait for a gate: an upload still under way when the
    scans are asked to stop."""

    def __init__(self, objects):
        self.objects, self.gate, self.waiting, self.done = (
            objects,
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )

    def put_bytes(self, key, data):
        self.waiting.set()
        assert self.gate.wait(10)
        self.objects.put_bytes(key, data)
        self.done.set()

    def put_file(self, key, path):  # read now, written once the gate opens
        self.put_bytes(key, path.read_bytes())

    def __getattr__(self, name):
        return getattr(self.objects, name)


def test_an_upload_under_way_at_stop_never_outlasts_the_final_upload(objects, tmp_path):
    out = tmp_path / "out"
    root = out / "live"
    root.mkdir(parents=True)
    (root / "metrics.txt").write_text("old")
    gated = GatedStore(objects)
    scanner = LiveOutputs(gated, root, PREFIX, Clock(), LiveLimits(interval=0.01))
    scanner.start()
    assert gated.waiting.wait(10)  # the scan's upload of "old" is under way
    (root / "metrics.txt").write_text("final")  # the run's last word, then it exits
    scanner.stop(0.05)
    scanner.drop_removed()
    report = upload_dir(objects, out, PREFIX.removesuffix("live/"), 10)
    assert report.error is None and objects.get_bytes(PREFIX + "metrics.txt") == b"final"
    threading.Timer(0.2, gated.gate.set).start()  # the late upload ends after the final one
    scanner.finish(10)
    assert gated.done.wait(10)  # the late upload is over
    assert objects.get_bytes(PREFIX + "metrics.txt") == b"final"
    assert scanner.scan_once() == 0  # stopped: no upload begins


def test_names_holding_a_backslash_are_skipped_live_and_at_the_end(objects, tmp_path):
    """Hostile: Azure reads ``\\`` as ``/`` in a blob's name: ``..\\..\\x`` would leave the run's outputs."""
    out = tmp_path / "out"
    root = out / "live"
    (root / "a\\..").mkdir(parents=True)
    (root / "a\\..\\..\\..\\evil").write_text("x")
    (root / "a\\.." / "inner").write_text("x")
    (root / "ok.txt").write_text("ok")
    scanner = live(objects, root)
    assert scanner.scan_once() == 1
    assert keys(objects) == ["ok.txt"]
    assert sorted(scanner.notices) == [
        "live/a\\../inner (name holds a backslash)",
        "live/a\\..\\..\\..\\evil (name holds a backslash)",
    ]
    files, skipped = collect(out)
    assert files == ["live/ok.txt"]
    assert sorted(skipped) == [
        "live/a\\../inner (name holds a backslash)",
        "live/a\\..\\..\\..\\evil (name holds a backslash)",
    ]


@pytest.mark.docker
def test_a_run_passes_over_a_large_live_file_says_so_and_uploads_it_at_the_end(local_stack, docker_client, tmp_path):
    """The executor's scans on the real engine: a small file goes up while the run goes, a large
    one only at the end, and the run's final message says so; a fifo, passed over by the scans and
    the final upload alike, is named once."""
    command = (
        'mkdir -p "$RUNPLANE_OUTPUT/live"; echo ok > "$RUNPLANE_OUTPUT/live/small.txt"; '
        'head -c 4096 /dev/zero > "$RUNPLANE_OUTPUT/live/big.bin"; mkfifo "$RUNPLANE_OUTPUT/live/ff"; '
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
    said = ended.events[-1].message
    assert "not uploaded while it ran: live/big.bin (over 1k: uploaded when the run ends))" in said
    fifo = "live/ff (not a regular file)"
    assert said.count(fifo) == 1 and said.endswith(f"(not uploaded: {fifo})")  # said once, at the end
