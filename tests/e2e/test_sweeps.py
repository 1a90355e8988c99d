"""Sweeps on the local stack (its SQLite stores, the dispatcher, local agents, Docker): a grid gives one run per
combination, max_parallel holds however many workers are free, kill ends every member, retry runs
again only the members that did not succeed; and the command line."""

import itertools
import json
import threading
import urllib.request

import pytest

from runplane.client import Conflict, NotFound
from tests.conftest import ON_EVERY_CLOUD, wait_for
from tests.e2e.test_cli import cli, new_user, one_error_line

pytestmark = pytest.mark.docker

ACTIVE = {"preparing", "running", "uploading"}


def contents(run):
    return {f.path: urllib.request.urlopen(f.url, timeout=10).read().decode() for f in run.outputs()}


def test_a_3x2_grid_gives_six_runs_whose_outputs_hold_the_six_combinations(alice, bob):
    sweep = alice.submit_sweep(
        'echo "$LR $SEED" > point; echo "$RUNPLANE_SWEEP_ID $RUNPLANE_SWEEP_INDEX" > who',
        parameters={"LR": [0.1, 0.01, 0.001], "SEED": [1, 2]},
        sweep_name="lr-grid",
    )
    assert (sweep.view.size, sweep.view.name, sweep.created) == (6, "lr-grid", True)
    seen = []
    done = sweep.wait(timeout=240, poll=0.5, on_progress=lambda s: seen.append(dict(s.view.counts)))
    assert done.view.counts == {"succeeded": 6} and done.view.failures == {}, done.view
    assert done.view.waiting == 0 and done.view.finished_at is not None
    assert seen[-1] == {"succeeded": 6}
    members = list(done.members())
    assert [m.view.sweep_index for m in members] == list(range(6))
    points = [contents(m) for m in members]
    combos = [f"{lr} {seed}\n" for lr, seed in itertools.product(["0.1", "0.01", "0.001"], ["1", "2"])]
    assert [p["point"] for p in points] == combos
    assert [p["who"] for p in points] == [f"{sweep.id} {i}\n" for i in range(6)]
    assert [m.view.name for m in members] == [f"lr-grid[{i}]" for i in range(6)]
    # another user sees neither the sweep nor its members
    with pytest.raises(NotFound):
        bob.sweep(sweep.id)
    with pytest.raises(NotFound):
        list(bob.members(sweep.id))
    with pytest.raises(NotFound):
        bob.get(members[0].id)
    assert sweep.id in [s.id for s in alice.sweeps(limit=20)]
    assert sweep.id not in [s.id for s in bob.sweeps(limit=50)]


class Watch(threading.Thread):
    """Reads a sweep's members until stopped; ``most``: the most ever active at one read."""

    def __init__(self, client, sweep_id):
        super().__init__(daemon=True)
        self.client, self.sweep_id = client, sweep_id
        self.most, self.rounds = 0, 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            active = [m for m in self.client.members(self.sweep_id) if m.view.state in ACTIVE]
            self.most = max(self.most, len(active))
            self.rounds += 1
            self.stop.wait(0.05)


def test_max_parallel_one_over_three_free_workers_never_runs_two_at_once(alice, agents):
    for _ in range(3):
        agents("--idle-seconds", "120")
    sweep = alice.submit_sweep("sleep 1", count=3, max_parallel=1, queue="manual")
    watch = Watch(alice, sweep.id)
    watch.start()
    try:
        done = sweep.wait(timeout=180, poll=0.3)
    finally:
        watch.stop.set()
        watch.join(10)
    assert done.view.counts == {"succeeded": 3}, done.view
    assert watch.rounds >= 3 and watch.most == 1
    spans = sorted((m.view.started_at, m.view.finished_at) for m in done.members())
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two members overlapped: {spans}"


@pytest.mark.parametrize("alice", ON_EVERY_CLOUD, indirect=True)
def test_kill_ends_every_member_and_retry_runs_again_only_the_failed(alice):
    # odd members fail on their first try only
    first_try = '[ "$RUNPLANE_RUN_ID" != "$RUNPLANE_SWEEP_ID-$RUNPLANE_SWEEP_INDEX" ]'
    sweep = alice.submit_sweep(f"{first_try} || [ $((RUNPLANE_SWEEP_INDEX % 2)) -eq 0 ]", count=4)
    done = sweep.wait(timeout=180, poll=0.5)
    assert done.view.counts == {"succeeded": 2, "failed": 2} and done.view.failures == {"nonzero_exit": 2}
    again = done.retry()
    assert again == 2
    assert done.view.finished_at is None
    done.wait(timeout=180, poll=0.5)
    assert done.view.counts == {"succeeded": 4}, done.view
    members = {m.view.sweep_index: m.id for m in done.members()}
    assert members == {0: f"{sweep.id}-0", 1: f"{sweep.id}-1-2", 2: f"{sweep.id}-2", 3: f"{sweep.id}-3-2"}
    assert alice.get(f"{sweep.id}-1").view.state == "failed"  # the first try is kept
    assert done.retry() == 0  # nothing failed since
    assert any("2 members run again" in e.message for e in done.view.events)

    slow = alice.submit_sweep("sleep 60", count=5, max_parallel=2)
    wait_for(lambda: slow.refresh().view.counts.get("running", 0) == 2, 120, 0.3, "two members running")
    killed = slow.kill()
    assert killed.view.killed
    over = slow.wait(timeout=60, poll=0.3)
    assert over.view.counts == {"killed": 5} and over.view.failures == {"killed": 5}
    assert over.view.waiting == 0
    assert len(list(over.members())) == 2  # three were never released: no run, no container
    with pytest.raises(Conflict):
        over.kill()


def test_max_parallel_changes_while_the_sweep_waits(alice):
    sweep = alice.submit_sweep("true", count=10, max_parallel=1, queue="parked")
    assert (sweep.view.waiting, sweep.view.counts) == (9, {"queued": 10})
    wider = sweep.set_max_parallel(4)
    assert (wider.view.max_parallel, wider.view.waiting) == (4, 6)
    assert len(list(alice.members(sweep.id))) == 4
    sweep.kill()


def test_the_sweep_commands(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "sweep")
    made = cli(
        devstack,
        "sweep", "run", "--param", "LR=0.1,0.01", "--param", "SEED=1..2", "--wait", "--json", "--",
        'echo "$LR $SEED" > point',
        token=token, home=tmp_path, timeout=240,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    view = json.loads(made.stdout)
    assert (view["size"], view["counts"]) == (4, {"succeeded": 4})
    status = cli(devstack, "sweep", "status", view["id"], token=token, home=tmp_path)
    assert status.stdout.strip() == f"{view['id']}: 4 succeeded of 4", status.stdout
    listed = cli(devstack, "sweep", "ls", token=token, home=tmp_path)
    assert view["id"] in listed.stdout
    dest = tmp_path / "out"
    down = cli(devstack, "download", "--sweep", view["id"], str(dest), token=token, home=tmp_path)
    assert down.returncode == 0, down.stderr
    assert {p.parent.name: p.read_text() for p in dest.glob("*/point")} == {
        "0": "0.1 1\n",
        "1": "0.1 2\n",
        "2": "0.01 1\n",
        "3": "0.01 2\n",
    }
    killed = cli(devstack, "sweep", "kill", view["id"], token=token, home=tmp_path)
    assert one_error_line(killed, 3) == f"error: sweep {view['id']} has already finished"
    retried = cli(devstack, "sweep", "retry", view["id"], token=token, home=tmp_path)
    assert retried.returncode == 0 and "no member failed" in retried.stderr
    other = cli(devstack, "sweep", "status", view["id"], home=tmp_path)  # alice's token
    assert one_error_line(other, 3) == f"error: sweep {view['id']} not found"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--param", "LR"], "error: --param must look like NAME=V1,V2 or NAME=A..B, got 'LR'"),
        (["--param", "SEED=5..1"], "error: --param SEED: the range 5..1 must go up"),
        (["--param", "A=1", "--param", "A=2"], "error: each --param NAME may be given once"),
        (["--param", "RUNPLANE_X=1"], "error: parameters: parameter 'RUNPLANE_X'"),
        (["--param", "SEED=1..10000", "--count", "2"], "error: the sweep has 20000 members; at most 10000"),
        (["--count", "0"], "error: Invalid value for '--count'"),
    ],
)
def test_bad_sweeps_are_one_line(devstack, tmp_path, args, message):
    token = new_user(devstack, tmp_path, "sweep")
    proc = cli(devstack, "sweep", "run", "--queue", "parked", *args, "--", "x", token=token, home=tmp_path)
    line = one_error_line(proc, 2)
    assert line.startswith(message), line
