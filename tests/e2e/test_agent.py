"""The worker agent as a process, started by the test on the "manual" pool, against the local
stack and the real Docker engine."""

import http.server
import json
import os
import signal
import threading

import pytest

from runplane import bootstrap
from runplane.domain.expect import Expect
from runplane.domain.states import RunState
from tests.conftest import TERMINAL, AgentProcess, wait_for, wait_state
from tests.gate import GATE, open_gate, output_dir

pytestmark = pytest.mark.docker


def submit(client, command, **extra):
    return client.request("POST", "/v1/runs", {"command": command, "queue": "manual", **extra})


def logs(client, run_id):
    return client.request("GET", f"/v1/runs/{run_id}/logs")["data"]


def test_two_slots_run_at_once_on_disjoint_cores(docker_client, alice, agents, tmp_path):
    agents("--slots", "2", "--cpuset", "0,1", "--idle-seconds", "30")
    cmd = f"grep Cpus_allowed_list /proc/self/status | cut -f2; {GATE}"
    runs = [submit(alice, cmd, resources={"cpus": 1}) for _ in range(2)]
    for r in runs:  # each holds at its gate: both run at once
        wait_for(lambda r=r: logs(alice, r["id"]), 60, 0.1, "the run to print its cores")
    assert [alice.request("GET", f"/v1/runs/{r['id']}")["state"] for r in runs] == ["running", "running"]
    cores = sorted(logs(alice, r["id"]).strip() for r in runs)
    assert cores == ["0", "1"]
    for r in runs:
        open_gate(output_dir(tmp_path / "work", r["id"]))
    done = [wait_state(alice, r["id"], TERMINAL) for r in runs]
    assert [d["state"] for d in done] == ["succeeded", "succeeded"]
    starts = sorted((d["started_at"], d["finished_at"]) for d in done)
    assert starts[1][0] < starts[0][1], "the two runs did not overlap"


def test_sigterm_with_pass_down_requeues_and_another_agent_finishes(docker_client, alice, agents):
    first = agents("--pass-down-termination")
    # the first attempt ends only by the agent's hand
    run = submit(
        alice, 'echo attempt $RUNPLANE_ATTEMPT; [ "$RUNPLANE_ATTEMPT" = 1 ] && sleep 600; echo $RUNPLANE_ATTEMPT > done'
    )
    wait_for(lambda: logs(alice, run["id"]), 60, 0.1, "the run to print")
    first.signal(signal.SIGTERM)
    assert first.wait(20) == 0
    queued = alice.request("GET", f"/v1/runs/{run['id']}")
    assert queued["state"] == "queued"
    assert queued["attempt"] == 1  # attempt count kept
    assert "worker terminated" in queued["waiting_reason"]
    agents()
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "succeeded"
    assert done["attempt"] == 2
    files = alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    assert [f["path"] for f in files] == ["done"]


def test_sigterm_without_pass_down_finishes_the_current_run(docker_client, alice, agents, tmp_path):
    agent = agents()
    run = submit(alice, f"{GATE}; echo finished")
    wait_state(alice, run["id"], {"running"}, timeout=60)
    agent.signal(signal.SIGTERM)
    wait_for(lambda: "signal 15: stopping" in agent.log.read_text(), 30, 0.1, "the agent to take the signal")
    assert agent.proc.poll() is None, "the agent left before its run ended"
    assert alice.request("GET", f"/v1/runs/{run['id']}")["state"] == "running"
    open_gate(output_dir(tmp_path / "work", run["id"]))
    assert agent.wait(30) == 0
    done = alice.request("GET", f"/v1/runs/{run['id']}")
    assert (done["state"], done["attempt"]) == ("succeeded", 1)
    assert logs(alice, run["id"]) == "finished\n"


def test_agent_restarted_mid_run_hands_its_run_back(docker_client, alice, agents):
    first = agents(worker_id="manual-restart")
    run = submit(alice, "echo $RUNPLANE_ATTEMPT > attempt; sleep 30")
    wait_state(alice, run["id"], {"running"}, timeout=60)
    first.signal(signal.SIGKILL)
    first.wait(10)
    label = "io.runplane.worker_id=manual-restart"
    assert docker_client.containers.list(sparse=True, filters={"label": label}), "the container outlived its agent"
    agents(worker_id="manual-restart")  # the same worker comes back
    requeued = wait_for(
        lambda: (r := alice.request("GET", f"/v1/runs/{run['id']}"))["attempt"] == 2 and r, 60, 0.2, "attempt 2"
    )
    assert any("its worker restarted" in e["message"] for e in requeued["events"])
    # the first attempt's container went before the second attempt was claimed
    containers = wait_for(
        lambda: docker_client.containers.list(all=True, sparse=True, filters={"label": label}),
        60,
        0.2,
        "the second attempt's container",
    )
    assert [c.attrs["Labels"]["io.runplane.attempt"] for c in containers] == ["2"]
    alice.request("POST", f"/v1/runs/{run['id']}/kill")
    assert wait_state(alice, run["id"], TERMINAL)["state"] == "killed"


def test_lost_lease_stops_the_container_and_writes_nothing(docker_client, alice, agents):
    agent = agents()
    run = submit(alice, "sleep 60")
    running = wait_state(alice, run["id"], {"running"}, timeout=60)
    store = bootstrap.stack().store
    stored = store.get(run["id"])
    # what the reaper does after a network partition: the run goes back to the queue
    store.update(
        stored,
        Expect(states=frozenset({RunState.RUNNING}), attempt=1),
        {"state": RunState.QUEUED, "worker_id": None, "lease_expires_at": None},
    )
    attempt = {"label": [f"io.runplane.run_id={run['id']}", "io.runplane.attempt=1"]}
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters=attempt),
        20,
        0.2,
        "the container of the lost attempt to go",
    )
    # the agent has let go of the run: nothing of the lost attempt can write any more
    wait_for(lambda: f"run {run['id']} ended" in agent.log.read_text(), 30, 0.2, "the agent to let the run go")
    after = store.get(run["id"])
    assert (after.state, after.attempt, after.worker_id) == (RunState.QUEUED, 1, None)
    assert [e.state for e in after.events] == [e.state for e in stored.events]
    assert running["worker_id"]
    alice.request("POST", f"/v1/runs/{run['id']}/kill")  # leave nothing queued for the next test


def test_disk_limit(docker_client, alice, agents):
    agents()
    run = submit(alice, "dd if=/dev/zero of=big bs=1M count=64; sleep 30", resources={"disk": "16m"})
    done = wait_state(alice, run["id"], TERMINAL, timeout=60)
    assert done["state"] == "failed"
    assert done["failure"]["reason"] == "disk_limit"
    assert "16m" in done["failure"]["message"]


class _Notices(http.server.BaseHTTPRequestHandler):
    preempt = False

    def do_GET(self):
        event = {"EventId": "1", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["spot-vm"]}
        events = [event] if self.preempt else []
        doc = {"DocumentIncarnation": 1, "Events": events}
        if self.path.startswith("/metadata/instance/compute"):
            doc = {"name": "spot-vm"}
        body = json.dumps(doc).encode()
        self.send_response(200 if self.headers.get("Metadata") == "true" else 400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_preemption_notice_hands_runs_back_and_exits(docker_client, alice, agents):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Notices)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        agent = agents("--preemption-watch", "azure", "--metadata-url", url)
        run = submit(alice, "sleep 60")
        wait_state(alice, run["id"], {"running"}, timeout=60)
        _Notices.preempt = True
        assert agent.wait(30) == 0
        back = alice.request("GET", f"/v1/runs/{run['id']}")
        assert back["state"] == "queued"
        assert "Azure scheduled event: Preempt" in agent.log.read_text()
        alice.request("POST", f"/v1/runs/{run['id']}/kill")
    finally:
        _Notices.preempt = False
        server.shutdown()


def test_exit_when_idle_and_after_n_runs(docker_client, alice, agents):
    idle = agents("--idle-seconds", "1")
    assert idle.wait(30) == 0
    assert "idle for 1s" in idle.log.read_text()
    worker = bootstrap.stack().workers.get(idle.id)
    assert worker.status == "offline"
    once = agents("--exit-after-num-runs", "1")
    run = submit(alice, "echo one")
    assert once.wait(60) == 0
    assert wait_state(alice, run["id"], TERMINAL)["state"] == "succeeded"
    assert "finished 1 run(s)" in once.log.read_text()


# 1,100 directories, one in the other: deeper than Python's recursion limit (os.walk and
# shutil.rmtree recurse) and than the agent's walks go
DEEP_TREE = "i=0; while [ $i -lt 1100 ]; do mkdir d && cd d || exit 3; i=$((i+1)); done"


def test_a_run_that_leaves_a_deep_tree_gives_its_slot_back(docker_client, alice, agents):
    """Removing such a tree raised RecursionError in the run's cleanup: the agent never got the
    slot back, stayed busy, and never exited."""
    once = agents("--exit-after-num-runs", "1")
    run = submit(alice, f"{DEEP_TREE}; sleep 5")
    assert once.wait(60) == 0
    done = wait_state(alice, run["id"], TERMINAL)
    assert (done["state"], done["failure"]["reason"]) == ("failed", "disk_limit")
    assert "deeper than 256 directories" in done["failure"]["message"]
    assert "finished 1 run(s)" in once.log.read_text()
    runs = next((once.log.parent / "work" / once.id / "runs").iterdir(), None)
    assert runs is None, f"{runs} was left behind"


def test_an_agent_restarted_over_a_deep_tree_starts(docker_client, alice, agents, tmp_path):
    """A deep tree left by a run of this worker's previous life made every start of it fail
    (RecursionError clearing its runs directory): it crash-looped."""
    left = tmp_path / "work" / "manual-deep" / "runs" / "r-left-1"
    left.mkdir(parents=True)
    fd = os.open(left, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    agent = agents("--idle-seconds", "1", worker_id="manual-deep")
    assert agent.wait(30) == 0, agent.log.read_text()[-2000:]
    assert "idle for 1s" in agent.log.read_text()
    assert list(left.parent.iterdir()) == []


def test_runs_are_not_root_and_agent_log_is_uploaded(docker_client, alice, agents):
    agent = agents("--log-upload-prefix", "agent-logs", "--exit-after-num-runs", "1")
    run = submit(alice, "id -u; id -g; touch made-here")
    assert agent.wait(60) == 0
    done = wait_state(alice, run["id"], TERMINAL)
    assert done["state"] == "succeeded"
    assert logs(alice, run["id"]) == "65534\n65534\n"
    text = bootstrap.stack().objects.get_bytes(f"agent-logs/{agent.id}/agent.log").decode()
    assert f"worker {agent.id} serving pool manual" in text
    assert "exiting" in text


def test_another_stacks_containers_are_left_alone(docker_client, alice, agents):
    """Two control planes may share one Docker engine: an agent starting up must not take a
    container of the other stack (whose runs it cannot see) for an orphan."""
    foreign = docker_client.containers.run(
        "runplane/test-busybox:1",
        ["sleep", "60"],
        detach=True,
        network_mode="none",
        labels={
            "io.runplane.run_id": "r-of-another-stack",
            "io.runplane.attempt": "1",
            "io.runplane.worker_id": "w-elsewhere",
            "io.runplane.stack": "another-stack",
        },
    )
    try:
        agent = agents("--idle-seconds", "1")
        assert agent.wait(30) == 0
        foreign.reload()
        assert foreign.status == "running"
    finally:
        foreign.remove(force=True)


def test_tags_and_groups_route_runs_to_the_right_worker(docker_client, alice, devstack, agents):
    from runplane.client import Client
    from runplane.services.auth import register_token

    stack = bootstrap.stack()
    register_token(stack.tokens, "carol-token", "carol", groups=["vision"], now=stack.clock())
    carol = Client(devstack.api_url, "carol-token")
    reserved = agents("--tag", "a100-box", "--tag-exclusive", "--group", "vision", "--idle-seconds", "60")
    shared = agents("--idle-seconds", "60")
    for agent in (reserved, shared):
        wait_for(lambda a=agent: any(w["id"] == a.id for w in alice.request("GET", "/v1/workers")["workers"]), 30)
    mine = submit(carol, "echo reserved", tag="a100-box")
    assert mine["spec"]["tag"] == "a100-box"
    plain = submit(alice, "echo shared")
    outsider = submit(alice, "echo nope", tag="a100-box")  # alice is not in group vision
    assert wait_state(carol, mine["id"], TERMINAL)["worker_id"] == reserved.id
    assert wait_state(alice, plain["id"], TERMINAL)["worker_id"] == shared.id
    waiting = alice.request("GET", f"/v1/runs/{outsider['id']}")
    assert waiting["state"] == "queued"
    assert waiting["waiting_reason"] == (
        "no live worker of pool manual takes this run: this worker serves group vision only and alice is not in it"
    )
    workers = {w["id"]: w for w in alice.request("GET", "/v1/workers")["workers"]}
    assert (workers[reserved.id]["tag"], workers[reserved.id]["tag_exclusive"], workers[reserved.id]["group"]) == (
        "a100-box",
        True,
        "vision",
    )
    alice.request("POST", f"/v1/runs/{outsider['id']}/kill")
    assert wait_state(alice, outsider["id"], TERMINAL)["state"] == "killed"


def test_the_pools_containment_settings_reach_its_agents(docker_client, alice, devstack, tmp_path):
    """The "contained" pool (tests/pools.yaml): max_log_size 2m, max_output_files 50, allow_root
    (taken up by an agent with --run-user image)."""
    environment = {**os.environ, **devstack.environment}
    agent = AgentProcess(tmp_path, "--run-user", "image", "--idle-seconds", "60", pool="contained", env=environment)
    try:
        chatty = submit(alice, "yes 0123456789 | head -c 3000000", queue="contained")
        many = submit(alice, "i=0; while [ $i -lt 60 ]; do : > f$i; i=$((i+1)); done", queue="contained")
        root = submit(alice, "id -u", queue="contained")
        done = {name: wait_state(alice, r["id"], TERMINAL) for name, r in [("chatty", chatty), ("many", many)]}
        assert (done["chatty"]["state"], done["chatty"]["failure"]["reason"]) == ("failed", "log_limit")
        assert "2m" in done["chatty"]["failure"]["message"]
        shipped, offset = 0, 0
        while True:  # every page of what it shipped: exactly the limit
            page = alice.request("GET", f"/v1/runs/{chatty['id']}/logs", query={"offset": offset})
            shipped += len(page["data"])
            if page["next_offset"] == offset:
                break
            offset = page["next_offset"]
        assert shipped == 2 * 1024 * 1024
        assert (done["many"]["state"], done["many"]["failure"]["reason"]) == ("failed", "disk_limit")
        assert "more than 50 files" in done["many"]["failure"]["message"]
        assert wait_state(alice, root["id"], TERMINAL)["state"] == "succeeded"
        assert logs(alice, root["id"]) == "0\n"  # the pool allows root and this agent takes it up
    finally:
        agent.stop()


def test_metrics_port_serves_the_workers_figures_after_real_runs(docker_client, alice, agents):
    import urllib.request

    from runplane.devstack.net import free_port

    port = free_port()
    agent = agents("--metrics-port", str(port), "--slots", "2")

    def scrape():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return resp.read().decode()
        except OSError:  # not listening yet
            return ""

    wait_for(lambda: "runplane_worker_slots" in scrape(), 30, 0.1, "the metrics endpoint")
    labels = f'pool="manual",worker="{agent.id}"'
    assert f"runplane_worker_slots{{{labels}}} 2\n" in scrape()
    runs = [submit(alice, "true"), submit(alice, "exit 3")]
    assert [wait_state(alice, r["id"], TERMINAL)["state"] for r in runs] == ["succeeded", "failed"]
    ended = f"runplane_worker_runs_ended_total{{{labels},state="
    idle = f"runplane_worker_runs_active{{{labels}}} 0\n"
    # a run's end is written before its slot is given back: both show within moments of each other
    failed = f'{ended}"failed",reason="nonzero_exit"}} 1\n'

    def settled() -> str:
        text = scrape()
        return text if failed in text and idle in text else ""

    text = wait_for(settled, 30, 0.1, "the failed run counted and no run active")
    assert f'{ended}"succeeded",reason="none"}} 1\n' in text
    assert f"runplane_worker_seconds_to_running_count{{{labels}}} 2\n" in text
    assert f"runplane_worker_claim_seconds_count{{{labels}}} 2\n" in text


def test_a_metrics_port_in_use_is_one_line_and_exit_2(docker_client, agents, tmp_path):
    """README: a port that cannot be taken is one line on stderr and exit status 2; the agent's
    work directory is let go first (no mount of it is left)."""
    import socket

    from worker_agent.workdir import parse_mountinfo, read_mountinfo

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = agents("--metrics-port", str(port))
        assert agent.wait(60) == 2
    said = agent.log.read_text()
    errors = [line for line in said.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(
        f"runplane-agent: error: cannot serve metrics on 127.0.0.1:{port}: "
    )
    assert "Traceback" not in said
    work = str(tmp_path / "work")
    assert [m.mount_point for m in parse_mountinfo(read_mountinfo()) if m.mount_point.startswith(work)] == []


@pytest.mark.parametrize("alice", ["aws_devstack"], indirect=True)
def test_exit_on_exception_ends_the_agent_with_status_1(docker_client, alice, aws_agents):
    """README: with --exit-on-exception an unexpected error while taking a run ends the agent
    (status 1, the error in its log). The error is real: this agent's runs table (DynamoDB, on the
    AWS local stack) does not exist."""
    agent = aws_agents("--exit-on-exception", env={"RUNPLANE_RUNS_TABLE": "e2e-no-such-table"})
    run = submit(alice, "true")
    try:
        assert agent.wait(60) == 1
    finally:
        alice.request("POST", f"/v1/runs/{run['id']}/kill")  # no later test's agent takes it
    said = agent.log.read_text()
    assert "error while taking a run; exiting (--exit-on-exception)" in said
    assert "read run failed" in said
