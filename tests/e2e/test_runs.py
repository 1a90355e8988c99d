"""Runs end to end: API -> run store -> run queue -> dispatcher -> local agent -> Docker ->
object store, on the real Docker engine and the embedded default stack (SQLite and files)."""

import dataclasses
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from runplane import bootstrap
from runplane.adapters.local.queues import SqliteRunQueue, pool_queue
from runplane.domain.messages import RunMessage
from runplane.domain.pools import PoolConfig
from runplane.domain.states import RunState
from runplane.services.reap import reap
from tests.conftest import DATASETS, ON_EVERY_CLOUD, TERMINAL, wait_for, wait_state
from tests.gate import GATE, open_gate, output_dir
from tests.security import test_network as contained
from tests.security.test_network import start_agent  # noqa: F401  (a fixture of this module's too)

pytestmark = pytest.mark.docker


def agents_root(devstack):
    """The work dirs of the local stack's agents (one per worker)."""
    return Path(devstack.environment["RUNPLANE_AGENT_WORK_DIR"])


def submit(client, command, **extra):
    return client.request("POST", "/v1/runs", {"command": command, **extra})


def read_all(client, run_id, stream="stdout"):
    return client.request("GET", f"/v1/runs/{run_id}/logs", query={"stream": stream})["data"]


def outputs(client, run_id):
    files = client.request("GET", f"/v1/runs/{run_id}/outputs")["files"]
    result = {}
    for f in files:
        with urllib.request.urlopen(f["url"], timeout=10) as resp:
            result[f["path"]] = resp.read()
    return result


def hints_left(pool):
    """Hints of ``pool`` waiting, taken but not deleted, or delayed: 0 once workers took them all
    (rows of the pool's queue in the local stack's database, whatever their visibility)."""
    queue = bootstrap.stack().queue
    assert isinstance(queue, SqliteRunQueue)
    with queue.db.read() as c:
        return c.execute("SELECT count(*) FROM queue_messages WHERE queue = ?", (pool_queue(pool),)).fetchone()[0]


@pytest.mark.parametrize("alice", ON_EVERY_CLOUD, indirect=True)
def test_success_with_logs_outputs_and_timeline(docker_client, alice):
    run = submit(
        alice,
        "echo hello; echo oops >&2; mkdir -p sub; echo 42 > answer; echo deep > sub/file; "
        "echo $RUNPLANE_RUN_ID > id; echo $GREETING > env",
        env={"GREETING": "hi"},
    )
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "succeeded", done
    assert done["exit_code"] == 0
    assert done["failure"] is None
    assert read_all(alice, run["id"]) == "hello\n"
    assert read_all(alice, run["id"], "stderr") == "oops\n"
    assert outputs(alice, run["id"]) == {
        "answer": b"42\n",
        "sub/file": b"deep\n",
        "id": f"{run['id']}\n".encode(),
        "env": b"hi\n",
    }
    states = [e["state"] for e in done["events"] if e["state"]]
    assert states == ["queued", "preparing", "running", "uploading", "succeeded"]
    assert done["started_at"] and done["finished_at"] and done["worker_id"]
    assert set(done["usage"]["timings"]) >= {"pull", "run", "upload"}
    logs = alice.request("GET", f"/v1/runs/{run['id']}/logs")
    assert logs["complete"] is True


def test_nonzero_exit_fails_with_code_and_stderr_tail(docker_client, alice):
    run = submit(alice, "echo 'no such file: data.csv' >&2; exit 3")
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "failed"
    assert done["exit_code"] == 3
    assert done["failure"]["reason"] == "nonzero_exit"
    assert "exited with code 3" in done["failure"]["message"]
    assert "no such file: data.csv" in done["failure"]["message"]


@pytest.mark.parametrize("alice", ON_EVERY_CLOUD, indirect=True)
def test_kill_running_run(docker_client, alice):
    """How fast a kill lands is measured by bench/kill_latency.py; here, what it does."""
    run = submit(alice, "echo started; echo partial > partial; sleep 600")
    running = wait_state(alice, run["id"], {"running"}, timeout=60)
    wait_for(lambda: read_all(alice, run["id"]) == "started\n", 60, 0.1, "the run to start")
    accepted = alice.request("POST", f"/v1/runs/{run['id']}/kill")
    assert accepted["kill_requested"] is True
    done = wait_state(alice, run["id"], TERMINAL, timeout=60)
    assert done["state"] == "killed"
    assert done["failure"]["reason"] == "killed"
    assert done["exit_code"] == 137
    assert outputs(alice, run["id"]) == {"partial": b"partial\n"}  # partial outputs still land
    labels = {"label": [f"io.runplane.run_id={run['id']}", f"io.runplane.attempt={running['attempt']}"]}
    wait_for(lambda: not docker_client.containers.list(all=True, sparse=True, filters=labels), 30, 0.2, "it to go")


def test_time_limit(docker_client, alice):
    run = submit(alice, "sleep 60", resources={"time": "2s"})
    done = wait_state(alice, run["id"], TERMINAL, timeout=60)
    assert done["state"] == "timed_out"
    assert done["failure"]["reason"] == "time_limit"
    assert "2s" in done["failure"]["message"]


def test_memory_limit_is_out_of_memory(docker_client, alice):
    run = submit(alice, "x=aaaaaaaa; while true; do x=$x$x; done", resources={"memory": "16m"})
    done = wait_state(alice, run["id"], TERMINAL, timeout=60)
    assert done["state"] == "failed"
    assert done["failure"]["reason"] == "out_of_memory"
    assert "16m" in done["failure"]["message"]
    assert done["exit_code"] == 137


def test_missing_image(docker_client, alice):
    run = submit(alice, "echo never", image="runplane/does-not-exist:1")
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "failed"
    assert done["failure"]["reason"] == "image_not_found"
    assert "runplane/does-not-exist:1" in done["failure"]["message"]
    assert [e["state"] for e in done["events"] if e["state"]] == ["queued", "preparing", "failed"]


def test_duplicate_queue_delivery_runs_once(docker_client, alice):
    run = submit(alice, "sleep 1; echo once")
    queue = bootstrap.stack().queue
    for _ in range(3):  # the same hint delivered again and again
        queue.send("default", RunMessage(run_id=run["id"], attempt=0))
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "succeeded"
    assert done["attempt"] == 1
    claims = [e for e in done["events"] if e["state"] == "preparing"]
    assert len(claims) == 1
    assert read_all(alice, run["id"]) == "once\n"
    wait_for(lambda: hints_left("default") == 0, 60, 0.2, "the workers to take every duplicate")
    assert alice.request("GET", f"/v1/runs/{run['id']}")["events"] == done["events"]


def test_idempotent_submit_runs_once(docker_client, alice):
    key = {"Idempotency-Key": f"once-{time.time()}"}
    first = alice.request("POST", "/v1/runs", {"command": "echo x"}, headers=key)
    second = alice.request("POST", "/v1/runs", {"command": "echo x"}, headers=key)
    assert first["id"] == second["id"]
    done = wait_state(alice, first["id"], TERMINAL)
    assert done["state"] == "succeeded"
    assert len([e for e in done["events"] if e["state"] == "preparing"]) == 1


def test_logs_readable_while_running(docker_client, alice, devstack):
    run = submit(alice, f"echo first; {GATE}; echo second")
    page = wait_for(
        lambda: (p := alice.request("GET", f"/v1/runs/{run['id']}/logs"))["data"] and p, 60, 0.1, "the first log line"
    )
    assert page["data"] == "first\n"
    assert page["complete"] is False
    assert alice.request("GET", f"/v1/runs/{run['id']}")["state"] == "running"
    open_gate(output_dir(agents_root(devstack), run["id"]))
    rest = wait_for(
        lambda: (
            (p := alice.request("GET", f"/v1/runs/{run['id']}/logs", query={"offset": page["next_offset"]}))["complete"]
            and p
        ),
        60,
        0.2,
        "the logs to complete",
    )
    assert rest["data"] == "second\n"


def _dead(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_sigkilled_worker_run_is_requeued_and_finished_by_another(docker_client, alice, devstack):
    # the first attempt ends only with its worker (its container is removed below)
    command = (
        'echo attempt $RUNPLANE_ATTEMPT; [ "$RUNPLANE_ATTEMPT" = 1 ] && sleep 600; echo $RUNPLANE_ATTEMPT > attempt'
    )
    run = submit(alice, command)
    running = wait_state(alice, run["id"], {"running"}, timeout=60)
    worker_id = running["worker_id"]
    state_dir = Path(devstack.settings.local_state_dir) / "default"
    pid = json.loads((state_dir / f"{worker_id}.json").read_text())["pid"]
    first = {"label": [f"io.runplane.run_id={run['id']}", "io.runplane.attempt=1"]}
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _dead(pid), 30, 0.1, f"worker {worker_id} to die")
        # The stack's reaper, its clock past the lease the dead worker left (the lease of the
        # stack's agents is long: no stall may cost a live worker its run). Tried again should a
        # renewal sent just before the kill land after the lease was read.
        stack = bootstrap.stack()
        pools = PoolConfig(pools=[stack.pools.get("default")])

        def reaped():
            expires = stack.store.get(run["id"]).lease_expires_at
            ports = dataclasses.replace(bootstrap.make_ports(stack, lambda: expires + 1), pools=pools)
            return reap(ports, rehint_after=3600).requeued

        assert wait_for(reaped, 30, 0.5, "the reaper to re-queue the run") == [run["id"]]
        done = wait_state(alice, run["id"], TERMINAL, timeout=90)
    finally:
        for container in docker_client.containers.list(all=True, filters=first):
            container.remove(force=True)
    assert done["state"] == "succeeded", done
    assert done["attempt"] == 2
    assert done["worker_id"] != worker_id
    assert any("re-queued" in e["message"] and worker_id in e["message"] for e in done["events"])
    assert outputs(alice, run["id"]) == {"attempt": b"2\n"}


def test_network_off_by_default(docker_client, aws_stack, request, tmp_path):
    """A run that does not ask for a network has none, on an agent whose runs' network reaches a
    host: a network namespace of this test's own with a stand-in server (tests/security/
    test_network.py), which a run that asks for the network does reach. (The engine here has no
    default bridge: a run left on the engine's default network would see only lo too.)"""
    with contained.stand_in(docker_client, "macvlan", tmp_path) as host:
        request.getfixturevalue("start_agent")("--network-mode", host.network)
        probe = "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' ' | sort | tr '\\n' ' '; echo; " + (
            contained.PROBE.format(targets=host.other)
        )
        runs = {net: contained.submit(aws_stack, probe, network=net) for net in (True, False)}
        done = {net: contained.finished(aws_stack, run) for net, run in runs.items()}
        assert [done[net].state for net in (True, False)] == [RunState.SUCCEEDED] * 2, done
        seen = {net: contained.stdout(aws_stack, run).splitlines() for net, run in done.items()}
        assert seen[True] == ["eth0 lo ", f"{host.other} reached"]  # this agent's runs' network works
        assert seen[False] == ["lo ", f"{host.other} blocked"]


def test_container_sees_neither_docker_socket_nor_agent_env(docker_client, alice):
    run = submit(alice, "ls /var/run/docker.sock 2>&1; env | sort")
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "succeeded"
    out = read_all(alice, run["id"])
    assert "No such file" in out
    assert "AWS_" not in out and "RUNPLANE_AWS" not in out and "RUNPLANE_POOLS" not in out
    assert "RUNPLANE_RUN_ID=" in out


def test_symlink_out_of_output_dir_is_not_uploaded(docker_client, alice):
    run = submit(
        alice,
        "echo secret-ish > /tmp/outside; ln -s /tmp/outside leak; ln -s /etc/passwd pw; "
        "echo ok > real; ln -s real inside",
    )
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "succeeded"
    assert outputs(alice, run["id"]) == {"real": b"ok\n", "inside": b"ok\n"}


def test_inputs_are_mounted_read_only(docker_client, alice):
    producer = submit(alice, "mkdir model; echo weights > model/w")
    assert wait_state(alice, producer["id"], TERMINAL)["state"] == "succeeded"
    datasets = bootstrap.stack().objects.within(DATASETS)
    datasets.put_bytes("datasets/d.txt", b"rows\n")
    run = submit(
        alice,
        "cat /inputs/model/w /inputs/data; (echo x > /inputs/data) 2>/dev/null || echo read-only",
        inputs={"model": f"run:{producer['id']}/model", "data": f"s3://{DATASETS}/datasets/d.txt"},
    )
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "succeeded", done
    assert read_all(alice, run["id"]) == "weights\nrows\nread-only\n"
    assert "inputs" in done["usage"]["timings"]

    def cached(worker_id):
        return next(w["cached_inputs"] for w in alice.request("GET", "/v1/workers")["workers"] if w["id"] == worker_id)

    # the worker reports its cache (counted between runs) at its next heartbeat
    wait_for(lambda: cached(done["worker_id"]) >= 2, 30, 0.2, "the worker to report its cached inputs")


def test_missing_input_is_input_unavailable(docker_client, alice):
    run = submit(alice, "echo never", inputs={"data": f"s3://{DATASETS}/datasets/absent.txt"})
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "failed"
    assert done["failure"]["reason"] == "input_unavailable"
    assert "absent.txt" in done["failure"]["message"]


def test_run_inputs_are_checked_at_submission(alice, bob):
    from tests.conftest import api_status

    status, code, message = api_status(lambda: submit(alice, "x", inputs={"m": "run:r-nosuchrun"}))
    assert (status, code, message) == (404, "not_found", "input m: run r-nosuchrun not found")
    bobs = bob.request("POST", "/v1/runs", {"command": "x", "queue": "parked"})
    status, code, message = api_status(lambda: submit(alice, "x", inputs={"m": f"run:{bobs['id']}"}))
    assert (status, code, message) == (404, "not_found", f"input m: run {bobs['id']} not found")


def test_container_removed_from_outside_is_a_clear_failure(docker_client, alice):
    run = submit(alice, "sleep 60")
    running = wait_state(alice, run["id"], {"running"}, timeout=60)
    labels = [f"io.runplane.run_id={run['id']}", f"io.runplane.attempt={running['attempt']}"]
    (container,) = docker_client.containers.list(filters={"label": labels})  # its name holds no run id
    container.remove(force=True)
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "failed"
    assert done["failure"]["reason"] == "container_error"
    assert "removed from the Docker engine" in done["failure"]["message"]
