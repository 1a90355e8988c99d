"""Runs that wait for runs on the local stack (its SQLite stores, the dispatcher, local agents, Docker): a run
naming a running run waits, holding no worker, starts after it and reads its output; a run
waiting for a failing run ends dependency_failed naming it; a run waits for a whole sweep; and the
command line."""

import json
import urllib.request

import pytest

from runplane.client import NotFound
from tests.conftest import ON_EVERY_CLOUD, wait_for
from tests.e2e.test_cli import cli, new_user, one_error_line

pytestmark = pytest.mark.docker


def contents(run):
    return {f.path: urllib.request.urlopen(f.url, timeout=10).read().decode() for f in run.outputs()}


def test_a_run_waiting_on_a_running_run_starts_after_it_and_reads_its_output(alice, bob):
    first = alice.submit("sleep 3; echo trained > model.txt", name="train")
    wait_for(lambda: first.refresh().view.state == "running", timeout=120, what="the first run to run")
    second = alice.submit("cat /inputs/model/model.txt > copied.txt", inputs={"model": f"run:{first.id}"})
    assert second.view.state == "queued" and second.view.waiting_on == [first.id]
    assert second.view.waiting_reason == f"waiting for run {first.id} (running)"
    assert second.refresh().view.waiting_reason == f"waiting for run {first.id} (running)"
    with pytest.raises(NotFound):
        bob.submit("true", after=[first.id])  # another user's run is none to wait for
    done = second.wait(timeout=180)
    assert done.view.state == "succeeded", done.view
    assert contents(done)["copied.txt"] == "trained\n"
    upstream = first.refresh().view
    assert upstream.state == "succeeded" and done.view.started_at >= upstream.finished_at
    messages = [e.message for e in done.view.events]
    assert "everything it waited for succeeded: released to pool default" in messages


@pytest.mark.parametrize("alice", ON_EVERY_CLOUD, indirect=True)
def test_a_run_waiting_on_a_failing_run_ends_dependency_failed(alice):
    first = alice.submit("sleep 2; exit 3")
    second = alice.submit("echo never", after=[first])
    third = alice.submit("echo never", after=[second.id])  # and what waits for that one
    ended = third.wait(timeout=180).view
    assert ended.state == "failed" and ended.failure.reason == "dependency_failed"
    assert second.id in ended.failure.message
    middle = second.refresh().view
    assert (middle.state, middle.failure.reason, middle.attempt) == ("failed", "dependency_failed", 0)
    assert middle.failure.message.startswith(f"run {first.id} ended failed (nonzero_exit")


def test_a_run_waits_for_every_member_of_a_sweep(alice):
    sweep = alice.submit_sweep("sleep 1; echo $I > i", parameters={"I": [1, 2, 3]})
    fan_in = alice.submit("echo gathered > all", after_sweep=sweep)
    assert fan_in.view.state == "queued" and fan_in.view.waiting_on == [f"sweep:{sweep.id}"]
    assert fan_in.view.waiting_reason.startswith(f"waiting for sweep {sweep.id} (")
    done = fan_in.wait(timeout=240).view
    assert done.state == "succeeded", done
    finished = alice.sweep(sweep.id).view
    assert finished.counts == {"succeeded": 3} and done.started_at >= finished.finished_at


def test_a_sweep_waits_for_a_run_and_its_status_says_so(devstack, alice, tmp_path):
    first = alice.submit("sleep 8; echo 7 > seed")
    wait_for(lambda: first.refresh().view.state == "running", timeout=120, what="the first run to run")
    made = cli(
        devstack, "sweep", "run", "--json", "--param", "I=1,2", "--after", first.id, "--", "echo $I", home=tmp_path
    )
    assert made.returncode == 0, made.stderr
    sweep_id = json.loads(made.stdout)["id"]
    shown = cli(devstack, "sweep", "status", "--once", sweep_id, home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"(2 not released yet); waiting for run {first.id} (running)" in shown.stdout
    done = alice.sweep(sweep_id).wait(timeout=180).view
    assert done.counts == {"succeeded": 2}
    assert min(m.view.started_at for m in alice.members(sweep_id)) >= first.refresh().view.finished_at


def test_the_cli_submits_runs_that_wait(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "waits")
    first = cli(devstack, "run", "--json", "--", "sleep 2; echo one > out", token=token, home=tmp_path)
    assert first.returncode == 0, first.stderr
    first_id = json.loads(first.stdout)["id"]
    second = cli(devstack, "run", "--after", first_id, "--wait", "--", "echo two", token=token, home=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout == "two\n"
    missing = cli(devstack, "run", "--after", "r-nosuchrun", "--", "true", token=token, home=tmp_path)
    assert "run r-nosuchrun not found" in one_error_line(missing, 3)
    bad = cli(devstack, "run", "--after", "not an id!", "--", "true", token=token, home=tmp_path)
    one_error_line(bad, 2)
