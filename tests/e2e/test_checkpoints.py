"""Checkpoints follow a run across attempts and workers, on the local stack with real Docker: agents
are processes on the "manual" pool (tests/e2e/conftest.py), each run may be tried once only (a
worker lost to a preemption gives the attempt back), and every command is a shell loop that counts
steps and keeps them in ``$RUNPLANE_CHECKPOINT_DIR``."""

from __future__ import annotations

import hashlib
import re
import signal
import time
import urllib.request
from typing import Any

import pytest

from runplane import bootstrap
from runplane.domain.checkpoints import Manifest, blob_key, blobs_prefix, checkpoints_prefix, manifest_key, manifest_seq
from runplane.domain.expect import Expect
from tests.conftest import SHORT_LEASE, TERMINAL, wait_for, wait_state
from tests.e2e.conftest import Notice
from tests.e2e.test_cli import cli, one_error_line

pytestmark = pytest.mark.docker

INTERVAL = 2
# Counts a step a second from the step its checkpoint directory holds (and says how many entries, dot
# files aside, the directory held then): prints it, then keeps it (written aside and renamed, so that a
# sync never reads half of it). The first attempt counts on until it is stopped, and at step MANY_AT
# adds 3000 files at once (their sync takes a while); a later attempt counts three more steps and ends.
COUNT = r"""d=$RUNPLANE_CHECKPOINT_DIR; n=$(cat "$d/step" 2>/dev/null || echo 0)
echo "start $n $(ls "$d" | wc -l)"
end=$((n + 3)); [ "$RUNPLANE_ATTEMPT" = 1 ] && end=1000000
while [ "$n" -lt "$end" ]; do
  sleep 1; n=$((n + 1)); echo "step $n"; echo "$n" > "$d/.step"; mv "$d/.step" "$d/step"
  [ "$RUNPLANE_ATTEMPT" = 1 ] && [ "$n" = "${MANY_AT:-0}" ] && mkdir "$d/many" && seq 1 3000 | while read i; do
    echo "$i" > "$d/many/$i"; done
done
echo "$n" > last"""
# Counts a step a second without keeping it, until SIGUSR1: then (a moment later, so that a sync that
# does not wait for it misses it) it keeps its last step and ends.
ON_SIGNAL = r"""d=$RUNPLANE_CHECKPOINT_DIR; n=$(cat "$d/step" 2>/dev/null || echo 0)
echo "start $n"
end=$((n + 3)); [ "$RUNPLANE_ATTEMPT" = 1 ] && end=1000000
trap 'sleep 1; echo "$n" > "$d/step"; echo "saved $n"; exit 143' USR1
while [ "$n" -lt "$end" ]; do sleep 1; n=$((n + 1)); echo "step $n"; done
echo "$n" > last"""
# A training in pieces: each piece does one unit of work into the checkpoint and asks to go on (85),
# the third one ends it.
PIECES = r"""d=$RUNPLANE_CHECKPOINT_DIR; p=$(cat "$d/pieces" 2>/dev/null || echo 0); p=$((p + 1))
echo "$p" > "$d/pieces"; echo "piece $p on $RUNPLANE_ATTEMPT" >> "$d/work"
[ "$p" -lt "${PIECES:-3}" ] && exit 85
cp "$d/work" trained"""


def submit_once(client: Any, command: str, **fields: Any) -> dict[str, Any]:
    """A run on "manual" that may be tried once only (set in the store: the API takes no
    max_attempts), before any worker can take it."""
    run = client.request("POST", "/v1/runs", {"command": command, "queue": "manual", **fields})
    store = bootstrap.stack().store
    store.update(store.get(run["id"]), Expect(), {"max_attempts": 1})
    return run


def get(client: Any, run_id: str) -> dict[str, Any]:
    return client.request("GET", f"/v1/runs/{run_id}")


def logs(client: Any, run_id: str, attempt: int) -> str:
    return str(client.request("GET", f"/v1/runs/{run_id}/logs", query={"attempt": str(attempt)})["data"])


def started_at(log: str) -> tuple[int, int]:
    """The step an attempt started from, and how many entries its checkpoint directory held then."""
    found = re.search(r"^start (\d+)(?: (\d+))?$", log, re.M)
    assert found, log
    return int(found.group(1)), int(found.group(2) or 0)


def steps(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"^step (\d+)$", log, re.M)]


def synced(client: Any, run_id: str, seq: int, timeout: float = 60) -> dict[str, Any]:
    """The run's view once its checkpoint ``seq`` (or a later one) is recorded on it."""

    def check() -> dict[str, Any] | None:
        view = get(client, run_id)
        return view if (view.get("checkpoint") or {}).get("seq", 0) >= seq else None

    return wait_for(check, timeout, 0.2, f"checkpoint {seq} of run {run_id}")


def container_of(docker_client: Any, run_id: str) -> Any:
    found = docker_client.containers.list(all=True, filters={"label": f"io.runplane.run_id={run_id}"})
    assert len(found) == 1, found
    return found[0]


def vanish(docker_client: Any, agent: Any, run_id: str, *, freeze_first: bool = True) -> list[int]:
    """The machine goes without a word: its agent is killed and the run's container removed, frozen
    first (``freeze_first``: it prints no step the test does not see) or after (the agent goes at
    once). Returns the steps the container printed."""
    container = container_of(docker_client, run_id)
    if freeze_first:
        container.pause()
    agent.signal(signal.SIGKILL)
    agent.wait(30)
    if not freeze_first:
        container.pause()
    printed = steps(container.logs(stdout=True, stderr=False).decode())
    container.remove(force=True)
    return printed


def newest_manifest(run_id: str) -> Manifest:
    """The newest checkpoint of the run's series in the store, checked complete: every blob it names is there."""
    objects = bootstrap.stack().objects
    keys = {i.key for i in objects.list(checkpoints_prefix(run_id))}
    seq = max(s for k in keys if (s := manifest_seq(run_id, k)))
    manifest = Manifest.model_validate_json(objects.get_bytes(manifest_key(run_id, seq)))
    assert {f.key for f in manifest.files} <= keys, manifest
    return manifest


def kept_step(manifest: Manifest) -> int:
    return int(bootstrap.stack().objects.get_bytes(next(f.key for f in manifest.files if f.path == "step")))


def resumed(client: Any, agents: Any, run_id: str, first: Any) -> tuple[dict[str, Any], str]:
    """The run handed back for free, finished by a second agent: its view and that attempt's log."""
    back = wait_state(client, run_id, {"queued"}, timeout=60)
    assert (back["attempt"], back["max_attempts"]) == (1, 2), back
    second = agents()
    done = wait_state(client, run_id, TERMINAL, timeout=90)
    assert (done["state"], done["attempt"], done["worker_id"]) == ("succeeded", 2, second.id), done
    assert second.id != first.id
    return done, logs(client, run_id, 2)


def read_url(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return bytes(answer.read())


def restored_events(view: dict[str, Any]) -> list[str]:
    return [e["message"] for e in view["events"] if e["message"].startswith("restored checkpoint")]


def test_a_killed_worker_s_run_resumes_on_another_from_its_last_sync(docker_client, alice, agents):
    run = submit_once(alice, COUNT, checkpoint={"interval": f"{INTERVAL}s"})
    first = agents(*SHORT_LEASE, "--preemptible")
    view = synced(alice, run["id"], 2)
    assert view["checkpoint"]["attempt"] == 1 and view["checkpoint"]["files"] >= 1, view["checkpoint"]
    time.sleep(INTERVAL * 0.7)  # somewhere in an interval
    printed = vanish(docker_client, first, run["id"])
    assert printed == list(range(1, len(printed) + 1)) and len(printed) >= 2, printed
    last_synced = newest_manifest(run["id"])
    kept = kept_step(last_synced)
    done, log = resumed(alice, agents, run["id"], first)
    start, _ = started_at(log)
    assert start == kept, (start, last_synced)
    # behind by at most one interval and the time of two syncs: the newest complete checkpoint holds what
    # the directory held when its sync began, and the next sync begins an interval after it ended (a step
    # of slack for each sync's own time)
    assert 0 < start <= printed[-1] and printed[-1] - start <= INTERVAL + 2, (start, printed)
    assert steps(log) == [start + 1, start + 2, start + 3], log
    restored = restored_events(done)
    assert len(restored) == 1 and restored[0].startswith(f"restored checkpoint {last_synced.seq} "), done["events"]
    assert done["checkpoint"]["attempt"] == 2, done["checkpoint"]  # synced as the second attempt ended


def test_a_preempted_run_checkpoints_on_its_signal_and_loses_nothing(docker_client, alice, agents, notice_url):
    run = submit_once(alice, ON_SIGNAL, checkpoint={"signal": "SIGUSR1", "grace": "20s"})
    first = agents("--preemption-watch", notice_url)
    wait_state(alice, run["id"], {"running"}, timeout=60)
    wait_for(lambda: steps(container_of(docker_client, run["id"]).logs().decode())[-1:] >= [3], 30, 0.2, "step 3")
    Notice.given.set()
    assert first.wait(60) == 0
    first_log = logs(alice, run["id"], 1)
    saved = re.findall(r"^saved (\d+)$", first_log, re.M)
    assert saved and int(saved[0]) == steps(first_log)[-1] >= 3, first_log  # the handler ran, in its grace
    back = get(alice, run["id"])
    assert (back["state"], back["attempt"], back["max_attempts"]) == ("queued", 1, 2), back
    assert back["checkpoint"] and back["checkpoint"]["files"] == 1, back["checkpoint"]
    done, log = resumed(alice, agents, run["id"], first)
    start, _ = started_at(log)
    assert start == int(saved[0]), (start, first_log)  # nothing lost
    assert steps(log) == [start + 1, start + 2, start + 3], log
    assert len(restored_events(done)) == 1, done["events"]


def test_a_training_in_three_pieces_runs_on_one_worker_in_one_attempt(docker_client, alice, agents):
    """Its max_pieces refusal: tests/integration/test_agent_checkpoints.py (each run in pieces pauses)."""
    three = submit_once(alice, PIECES, checkpoint={"exit_code": 85, "max_pieces": 3})
    agent = agents()
    done = wait_state(alice, three["id"], TERMINAL, timeout=60)
    assert (done["state"], done["attempt"], done.get("pieces", 0), done["worker_id"]) == (
        "succeeded",
        1,
        2,
        agent.id,
    ), done
    trained = alice.request("GET", f"/v1/runs/{three['id']}/outputs")["files"]
    assert [f["path"] for f in trained] == ["trained"], trained
    assert read_url(trained[0]["url"]) == b"piece 1 on 1\npiece 2 on 1\npiece 3 on 1\n"
    assert (done["checkpoint"]["files"], done["checkpoint"]["attempt"]) == (2, 1), done["checkpoint"]
    said = [e["message"] for e in done["events"] if e["message"].startswith("piece ")]
    assert [m.split(" starts")[0] for m in said] == [
        "piece 1 ended with exit code 85; piece 2",
        "piece 2 ended with exit code 85; piece 3",
    ], done["events"]


def test_a_checkpoint_cut_halfway_is_never_restored(docker_client, alice, agents):
    """A sync the worker's death cuts off leaves blobs and no manifest; a manifest whose blob is not
    there (as a store that lost one would hold) is not complete either: the next attempt restores the
    newest complete checkpoint before both."""
    objects = bootstrap.stack().objects
    run = submit_once(alice, COUNT, env={"MANY_AT": "3"}, checkpoint={"interval": f"{INTERVAL}s"})
    first = agents(*SHORT_LEASE, "--preemptible")
    synced(alice, run["id"], 1)

    def unnamed() -> set[str]:
        """The blobs of the series that no manifest names."""
        keys = {i.key for i in objects.list(checkpoints_prefix(run["id"]))}
        manifests = [objects.get_bytes(k) for k in keys if manifest_seq(run["id"], k)]
        named = {f.key for m in manifests for f in Manifest.model_validate_json(m).files}
        return {k for k in keys if k.startswith(blobs_prefix(run["id"]))} - named

    # the worker goes while the sync of the directory's 3000 new files is under way
    wait_for(lambda: len(unnamed()) >= 20, 60, 0.05, "a sync of the many files under way")
    vanish(docker_client, first, run["id"], freeze_first=False)
    assert len(unnamed()) >= 20  # what the cut sync stored, named by no manifest
    complete = newest_manifest(run["id"])
    kept = kept_step(complete)
    many = any(f.path.startswith("many/") for f in complete.files)  # a sync that read half of them
    # a newer manifest whose blob is not there
    missing = b"999\n"
    sha = hashlib.sha256(missing).hexdigest()
    files = [f.model_copy(update={"sha256": sha, "key": blob_key(run["id"], sha)}) for f in complete.files]
    broken = Manifest.model_validate({**complete.model_dump(), "seq": complete.seq + 5, "files": files})
    assert objects.head(broken.files[0].key) is None
    objects.put_bytes(manifest_key(run["id"], broken.seq), broken.model_dump_json().encode())
    done, log = resumed(alice, agents, run["id"], first)
    assert started_at(log) == (kept, 1 + many), log
    restored = restored_events(done)
    assert len(restored) == 1 and restored[0].startswith(f"restored checkpoint {complete.seq} "), done["events"]


def test_from_checkpoint_and_download_in_the_cli(devstack, docker_client, alice, tmp_path):
    """A new run starts from another run's last checkpoint (the owner's only: for anyone else that run
    is not there), and ``download --checkpoint`` writes its files."""
    d = "$RUNPLANE_CHECKPOINT_DIR"
    command = f"echo 41 > {d}/answer; mkdir {d}/sub; echo deep > {d}/sub/f"
    made = cli(devstack, "run", "--checkpoint", "10m", "--", command, home=tmp_path)
    assert made.returncode == 0, made.stderr
    source = made.stdout.strip()
    done = wait_state(alice, source, TERMINAL, timeout=60)
    assert done["state"] == "succeeded" and done["checkpoint"]["files"] == 2, done
    follow = cli(
        devstack, "run", "--wait", "--from-checkpoint", source, "--", f"cat {d}/answer {d}/sub/f", home=tmp_path
    )
    assert (follow.returncode, follow.stdout) == (0, "41\ndeep\n"), follow.stderr
    restored = restored_events(get(alice, follow.stderr.split()[0]))
    assert len(restored) == 1 and restored[0].endswith(f" of run {source}"), restored
    # someone else's run is not there for bob, as a run that does not exist is not
    nobody = "r-" + "0" * 24
    stolen = one_error_line(
        cli(devstack, "run", "--from-checkpoint", source, "--", "true", token="bob-token", home=tmp_path), 3
    )
    absent = one_error_line(cli(devstack, "run", "--from-checkpoint", nobody, "--", "true", home=tmp_path), 3)
    assert stolen.replace(source, "X") == absent.replace(nobody, "X"), (stolen, absent)
    assert stolen.endswith(f"run {source} not found"), stolen
    dest = tmp_path / "restored"
    fetched = cli(devstack, "download", "--checkpoint", source, str(dest), home=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    assert (dest / "answer").read_text() == "41\n" and (dest / "sub" / "f").read_text() == "deep\n"
    theirs = cli(devstack, "download", "--checkpoint", source, str(tmp_path / "b"), token="bob-token", home=tmp_path)
    assert one_error_line(theirs, 3).replace(source, "X") == absent.replace(nobody, "X")
    assert not (tmp_path / "b").exists()


def test_a_checkpoint_over_the_disk_limit_ends_the_run_with_no_checkpoint(docker_client, alice, agents):
    """The checkpoint directory counts in the run's disk: over it, the run ends disk_limit saying so, and
    its series holds no checkpoint (nothing a later run could start from)."""
    big = 'head -c 40000000 /dev/zero > "$RUNPLANE_CHECKPOINT_DIR/big"; echo written; sleep 30'
    run = submit_once(alice, big, resources={"disk": "32m"}, checkpoint={"interval": "1s"})
    agents()
    done = wait_state(alice, run["id"], TERMINAL, timeout=60)
    assert (done["state"], done["failure"]["reason"]) == ("failed", "disk_limit"), done
    assert "checkpoint" in done["failure"]["message"], done["failure"]
    assert "checkpoint" not in done, done["checkpoint"]
    series = [i.key for i in bootstrap.stack().objects.list(checkpoints_prefix(run["id"]))]
    assert not [k for k in series if manifest_seq(run["id"], k)], series
