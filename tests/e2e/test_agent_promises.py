"""Promises of the worker agent (README, "The worker agent") kept end to end: agent processes of
the "manual" pool against the local stack and the real Docker engine; those about an object
store that refuses or holds an upload against the AWS local stack (moto), behind a front."""

import contextlib
import http.client
import http.server
import os
import signal
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from runplane import bootstrap
from runplane.client import ApiError
from tests.conftest import DATASETS, SHORT_LEASE, TERMINAL, TEST_IMAGE, aws_devstack_stack, wait_for, wait_state

pytestmark = pytest.mark.docker

# headers of one connection, never passed on (the relay sets its own Content-Length)
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
    | {"expect", "content-length"}
)
ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>'
)


class ObjectStoreFront(http.server.ThreadingHTTPServer):
    """The AWS APIs as one agent sees them: a loopback front of the moto server that passes every
    request on (DynamoDB, SQS, the run's logs in S3) except the uploads of run outputs
    (``runs/<id>/outputs/...``), which it refuses as S3 refuses a write the bucket denies (403
    AccessDenied). With ``hold``, each such upload is held until the front closes (after the test's
    agents have stopped) before it is refused: an upload that cannot end while the test looks."""

    daemon_threads = True

    def __init__(self, upstream: str, *, hold: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream = urlsplit(upstream).netloc
        self.hold = hold
        self.released = threading.Event()
        self.refused: list[str] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, name="object-store-front", daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.shutdown()
        self.server_close()


class _Relay(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and "100 Continue" for botocore's uploads
    server: ObjectStoreFront

    def log_message(self, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)

    def _relay(self) -> None:
        body = self._body()
        path = urlsplit(self.path).path
        if self.command in ("PUT", "POST") and "/outputs/" in path:
            self.server.refused.append(path)
            if self.server.hold:
                self.server.released.wait(300)
            self._answer(403, [("Content-Type", "application/xml")], ACCESS_DENIED)
            return
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self._answer(response.status, response.getheaders(), data, response.getheader("Content-Length"))
        finally:
            upstream.close()

    def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes, head_length: str | None = None) -> None:
        self.send_response_only(status)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        length = head_length if self.command == "HEAD" else str(len(data))
        if length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay


@pytest.fixture
def fronts(moto_endpoint):
    made = []

    def make(*, hold=False):
        front = ObjectStoreFront(moto_endpoint, hold=hold)
        made.append(front)
        return front

    yield make
    for front in made:
        front.close()


@pytest.fixture
def aws_agents(fronts, aws_agents):
    """Set up after the fronts, so they stop before the fronts they may reach the APIs through."""
    return aws_agents


def submit(client, command, **extra):
    return client.request("POST", "/v1/runs", {"command": command, "queue": "manual", **extra})


def logs(client, run_id):
    return client.request("GET", f"/v1/runs/{run_id}/logs")["data"]


def states(run):
    return [e["state"] for e in run["events"] if e["state"]]


def through(front):
    """What an agent that reaches the AWS APIs through ``front`` has in its environment."""
    return {"RUNPLANE_AWS_ENDPOINT_URL": front.url}


# -- finishing: an upload that fails or outlasts its deadline ends the run ----------------------


@pytest.mark.parametrize("alice", ["aws_devstack"], indirect=True)
def test_an_upload_the_object_store_refuses_fails_the_run(docker_client, alice, aws_devstack, aws_agents, fronts):
    front = fronts()
    aws_agents(env=through(front))
    run = submit(alice, "echo made; echo 42 > answer")
    done = wait_state(alice, run["id"], TERMINAL)
    assert (done["state"], done["failure"]["reason"], done["exit_code"]) == ("failed", "upload_failed", 0)
    assert "upload of answer failed" in done["failure"]["message"]
    assert "AccessDenied" in done["failure"]["message"]
    assert states(done) == ["queued", "preparing", "running", "uploading", "failed"]
    bucket = aws_devstack_stack(aws_devstack).data_bucket
    assert front.refused == [f"/{bucket}/runs/{run['id']}/outputs/1/answer"]
    assert logs(alice, run["id"]) == "made\n"  # only the outputs were refused
    assert alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"] == []


@pytest.mark.parametrize("alice", ["aws_devstack"], indirect=True)
def test_an_upload_past_its_deadline_fails_the_run_and_the_agent_still_exits(
    docker_client, alice, aws_devstack, aws_agents, fronts
):
    """The upload is held by the front until the test is over: it cannot finish in time, however
    fast or slow this machine is. The agent, done with its one run, exits though that upload hangs
    on (its thread would hold the process until the object store answered)."""
    front = fronts(hold=True)
    agent = aws_agents("--upload-deadline-seconds", "0.5", "--exit-after-num-runs", "1", env=through(front))
    run = submit(alice, "echo 42 > answer")
    done = wait_state(alice, run["id"], TERMINAL)
    assert (done["state"], done["failure"]["reason"], done["exit_code"]) == ("failed", "upload_failed", 0)
    assert done["failure"]["message"] == "1 file(s) not uploaded within 0.5s"
    assert states(done) == ["queued", "preparing", "running", "uploading", "failed"]
    assert agent.wait(30) == 0
    assert "finished 1 run(s)" in agent.log.read_text()
    assert not front.released.is_set()  # the upload was still held when the agent went
    bucket = aws_devstack_stack(aws_devstack).data_bucket
    assert set(front.refused) == {f"/{bucket}/runs/{run['id']}/outputs/1/answer"}


# -- watching: exit 137 is out_of_memory only when Docker says OOMKilled --------------------------


def test_exit_137_without_an_oom_kill_is_nonzero_exit(docker_client, alice, agents):
    agents("--slots", "2")
    by_itself = submit(alice, "exit 137")
    # a child of the command killed by SIGKILL (not the command itself: init ignores it)
    child = submit(alice, "sh -c 'kill -9 $$'; exit $?")
    from_outside = submit(alice, "echo up; sleep 60")
    wait_for(lambda: logs(alice, from_outside["id"]) == "up\n", 60, 0.1, "the third run to start")
    labels = [f"io.runplane.run_id={from_outside['id']}", "io.runplane.attempt=1"]
    (container,) = docker_client.containers.list(filters={"label": labels})
    container.kill()  # SIGKILL by someone else than runplane (an operator, a host's own killer)
    for run in (by_itself, child, from_outside):
        done = wait_state(alice, run["id"], TERMINAL)
        assert (done["state"], done["failure"]["reason"], done["exit_code"]) == ("failed", "nonzero_exit", 137)
        assert done["failure"]["message"].startswith("command exited with code 137")


# -- restarts: a stack's orphaned containers are removed, another stack's are left alone --------


def run_containers(docker_client, run_id, **labels):
    wanted = [f"io.runplane.run_id={run_id}"] + [f"io.runplane.{k}={v}" for k, v in labels.items()]
    return docker_client.containers.list(all=True, sparse=True, filters={"label": wanted})


def foreign_twin(docker_client, labels):
    """A container of another stack sharing this engine whose run id, attempt and worker id are
    those of ``labels``: only its stack label tells it apart."""
    return docker_client.containers.run(
        TEST_IMAGE,
        ["sleep", "120"],
        detach=True,
        network_mode="none",
        labels={**labels, "io.runplane.stack": "another-stack"},
    )


def orphan_of_a_sigkilled_agent(docker_client, alice, agents, worker_id, *args):
    """A run of ``worker_id`` whose agent was SIGKILLed while it ran: (run, its container's labels)."""
    agent = agents(*args, worker_id=worker_id)
    run = submit(alice, "sleep 60")
    wait_state(alice, run["id"], {"running"})
    (container,) = run_containers(docker_client, run["id"])
    agent.signal(signal.SIGKILL)
    agent.wait(10)
    labels = container.attrs["Labels"]
    assert labels["io.runplane.stack"] == bootstrap.stack().settings.stack_id()
    assert labels["io.runplane.worker_id"] == worker_id
    return run, {k: v for k, v in labels.items() if k.startswith("io.runplane.")}


def test_an_agent_restarted_under_its_id_removes_its_orphans_and_no_other_stacks(docker_client, alice, agents):
    worker_id = f"manual-own-{os.urandom(3).hex()}"
    run, labels = orphan_of_a_sigkilled_agent(docker_client, alice, agents, worker_id)
    stack = labels["io.runplane.stack"]
    twin = foreign_twin(docker_client, labels)
    try:
        alice.request("POST", f"/v1/runs/{run['id']}/kill")  # so that the run ends, not runs again
        assert run_containers(docker_client, run["id"], stack=stack), "the container outlived its agent"
        again = agents("--idle-seconds", "1", worker_id=worker_id)
        assert again.wait(30) == 0, again.log.read_text()[-3000:]
        assert run_containers(docker_client, run["id"], stack=stack) == []
        twin.reload()
        assert twin.status == "running"
        ended = alice.request("GET", f"/v1/runs/{run['id']}")
        assert (ended["state"], ended["failure"]["message"]) == ("killed", "killed; its worker restarted")
    finally:
        twin.remove(force=True)


def test_another_agent_of_the_stack_removes_orphans_of_a_dead_one_and_no_other_stacks(docker_client, alice, agents):
    worker_id = f"manual-dead-{os.urandom(3).hex()}"
    run, labels = orphan_of_a_sigkilled_agent(docker_client, alice, agents, worker_id, *SHORT_LEASE)
    stack = labels["io.runplane.stack"]
    twin = foreign_twin(docker_client, labels)
    try:
        alice.request("POST", f"/v1/runs/{run['id']}/kill")
        # the reaper ends the run once its lease runs out: its container is then nobody's
        assert wait_state(alice, run["id"], TERMINAL)["state"] == "killed"
        assert run_containers(docker_client, run["id"], stack=stack), "the container outlived its agent"
        other = agents("--idle-seconds", "1")
        assert other.wait(30) == 0, other.log.read_text()[-3000:]
        assert run_containers(docker_client, run["id"], stack=stack) == []
        twin.reload()
        assert twin.status == "running"
    finally:
        twin.remove(force=True)


# -- inputs: the cache is evicted, least recently used first, above --max-work-dir-size --------


def cached_sources(cache: Path) -> set[str]:
    """The sources of the complete entries of the input cache (each entry's ``done`` names it)."""
    sources = set()
    for done in cache.glob("*/done"):
        try:
            sources.add(done.read_text())
        except FileNotFoundError:  # evicted meanwhile
            continue
    return sources


def test_the_input_cache_is_evicted_above_max_work_dir_size(docker_client, alice, agents, tmp_path):
    limit = 150 * 1024  # room for one input of 100,000 bytes, not two
    datasets = bootstrap.stack().objects.within(DATASETS)
    prefix = f"evict-{uuid.uuid4().hex[:8]}"
    a, b, c = (f"s3://{DATASETS}/{prefix}/{name}" for name in "abc")
    for name in "abc":
        datasets.put_bytes(f"{prefix}/{name}", bytes(100_000))
    agent = agents("--slots", "2", "--max-work-dir-size", "150k")
    cache = tmp_path / "work" / "cache"

    holding = submit(alice, "sleep 60", inputs={"a": a})
    try:
        wait_state(alice, holding["id"], {"running"})
        assert cached_sources(cache) == {a}
        reader = submit(alice, "wc -c < /inputs/b", inputs={"b": b})
        assert wait_state(alice, reader["id"], TERMINAL)["state"] == "succeeded"
        assert logs(alice, reader["id"]).strip() == "100000"
        # over the limit after it: b goes, though a is older, for a run still reads a
        wait_for(lambda: cached_sources(cache) == {a}, 30, 0.1, "b to be evicted")
        assert alice.request("GET", f"/v1/runs/{holding['id']}")["state"] == "running"
    finally:  # never left running, whatever failed above
        with contextlib.suppress(ApiError):
            alice.request("POST", f"/v1/runs/{holding['id']}/kill")
    assert wait_state(alice, holding["id"], TERMINAL)["state"] == "killed"
    last = submit(alice, "wc -c < /inputs/c", inputs={"c": c})
    assert wait_state(alice, last["id"], TERMINAL)["state"] == "succeeded"
    # a, now used by no run and the least recently used, goes
    wait_for(lambda: cached_sources(cache) == {c}, 30, 0.1, "a to be evicted")
    size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and not p.is_symlink())
    assert 100_000 <= size <= limit

    def reported():
        workers = alice.request("GET", "/v1/workers")["workers"]
        return next((w["cached_inputs"] for w in workers if w["id"] == agent.id), None) == 1

    wait_for(reported, 30, 0.2, "the worker to report one cached input")
