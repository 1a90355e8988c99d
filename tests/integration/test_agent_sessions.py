"""The worker's side of sessions (worker_agent/sessions/) with the real Docker engine: an agent holds
two runs of the local stack; a session asked of one (written to the stack's store and counted on the
run, as the API does) is taken by the agent, which meets the test's client at the one-machine relay
(runplane/devstack/relay.py, behind the stack's front). An exec gives its output and exit code;
stdin reaches the command; a terminal's size follows RESIZE; a client that drops leaves nothing of
the session running; a port-forward reaches a listener inside a run without network, never a port
of the host nor one of another run."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from runplane.adapters.local.relay import FrontSessionRelay
from runplane.bootstrap import Stack, build_stack
from runplane.devstack.front import FrontServer
from runplane.devstack.relay import RelayHub
from runplane.domain.errors import RunplaneError
from runplane.domain.expect import Expect
from runplane.domain.runs import Run, RunSpec
from runplane.domain.session_wire import (
    STDERR,
    STDIN,
    STDOUT,
    Frame,
    FrameType,
    decode,
    json_frame,
    resize,
    signal_frame,
)
from runplane.domain.sessions import (
    LIVE,
    REQUEST_SECONDS,
    EndReason,
    Session,
    SessionKind,
    SessionState,
    new_secret,
    session_id,
    ticket,
)
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services.runs import kill_run, submit_run
from runplane.settings import StackSettings
from tests.conftest import POOLS_FILE, TEST_IMAGE, wait_for
from tests.object_front import ObjectsOnly
from worker_agent.agent import Agent
from worker_agent.container_spec import container_name
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig
from worker_agent.run_state import RunStateWriter
from worker_agent.sessions.host import SessionHost
from worker_agent.sessions.procs import Procs, can_see

pytestmark = pytest.mark.docker

PAGE = "hello-from-run"
# a listener on the run's own loopback (the run has no network), then the run idles
SERVING = (
    f"mkdir -p /tmp/www && echo {PAGE} > /tmp/www/index.html && httpd -p 127.0.0.1:8000 -h /tmp/www"
    " && while :; do sleep 1; done"
)
OTHER = SERVING.replace(PAGE, "other").replace(":8000", ":8001")

RESOURCES = {"cpus": 1, "memory": "64m", "disk": "1g"}


@dataclass
class Site:
    stack: Stack
    relay_url: str
    run: Run
    other: Run
    docker: Any
    hub: RelayHub

    def container(self, run: Run) -> Any:
        stored = self.stack.store.get(run.id)
        return self.docker.containers.get(container_name(self.stack.settings.stack_id(), run.id, stored.attempt))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("sessions")
    state = root / "state"
    objects = ObjectsOnly(state)
    front = FrontServer(("127.0.0.1", 0), objects)  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{front.server_address[1]}"
    stack = build_stack(StackSettings(cloud="local", state_dir=str(state), public_url=url, pools=str(POOLS_FILE)))
    assert stack.sessions is not None
    objects.secret = stack.tokens.secret
    front.relay = RelayHub(stack.sessions)
    serving = threading.Thread(target=front.serve_forever, name="front", daemon=True)
    serving.start()
    alice = Principal(user="alice")
    runs = [
        submit_run(
            stack.ports,
            alice,
            RunSpec.model_validate(
                {"command": command, "queue": "manual", "image": TEST_IMAGE, "resources": RESOURCES}
            ),
            None,
        ).run
        for command in (SERVING, OTHER)
    ]
    work_dir = root / "w"
    config = AgentConfig(
        pool="manual",
        worker_id="w-sessions",
        work_dir=work_dir,
        cpuset=(0, 1),
        slots=2,
        poll_seconds=1,
        executor=ExecutorConfig(
            worker_id="w-sessions", work_dir=work_dir, stack_id=stack.settings.stack_id(), kill_poll_seconds=0.5
        ),
    )
    ports = AgentPorts(stack.store, stack.queue, stack.objects, sessions=stack.sessions)
    agent = Agent(config, ports, stack.workers, docker_client, time.time)
    thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    thread.start()
    try:
        for run in runs:
            wait_for(lambda r=run: stack.store.get(r.id).state == RunState.RUNNING, 60, 0.1, f"run {run.id} to run")
        mine, other = (stack.store.get(r.id) for r in runs)
        site = Site(stack, FrontSessionRelay(url, front.relay).url, mine, other, docker_client, front.relay)
        box = site.container(site.run)
        box.reload()
        if not can_see(Procs(), int(box.attrs["State"]["Pid"]), box.id):
            pytest.skip("this test's process does not share the Docker engine's PID namespace, which sessions need")
        wait_for(lambda: b"httpd" in box.exec_run("ps").output, 10, 0.1, "the run's listener")
        yield site
    finally:
        for run in runs:
            with contextlib.suppress(RunplaneError):  # ended already
                kill_run(stack.ports, alice, run.id)
        for run in runs:
            wait_for(lambda r=run: stack.store.get(r.id).state.terminal, 60, 0.2, f"run {run.id} to end")
        agent.stop()
        thread.join(60)
        front.shutdown()
        front.server_close()


class Client:
    """The test's side of a session: its WebSocket at the relay and the frames that came."""

    def __init__(self, conn: ClientConnection, session: Session) -> None:
        self.conn, self.session = conn, session
        self.out: dict[int, bytes] = {STDOUT: b"", STDERR: b""}

    def send(self, frame: Frame) -> None:
        self.conn.send(frame.encode())

    def recv(self, timeout: float = 20) -> Frame:
        frame = decode(self.conn.recv(timeout=timeout))  # type: ignore[arg-type]
        if frame.type == FrameType.DATA and frame.channel in self.out:
            self.out[frame.channel] += frame.payload
        return frame

    def until(self, kind: FrameType, timeout: float = 20) -> Frame:
        deadline = time.monotonic() + timeout
        while (frame := self.recv(deadline - time.monotonic())).type != kind:
            pass
        return frame

    def wait_output(self, text: bytes, channel: int = STDOUT, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out[channel]:
            self.recv(deadline - time.monotonic())


def ask(site: Site, run: Run, kind: SessionKind, count: bool = True, **fields: Any) -> tuple[Session, str]:
    """A session of ``run`` as the API makes it: requested in a free slot, then counted on the run
    (unless not ``count``: then its agent is not told)."""
    store = site.stack.sessions
    assert store is not None
    taken = {s.slot for s in store.for_run(run.id) if not s.state.over}
    slot = min(set(range(4)) - taken)
    secret, hashed = new_secret()
    now = time.time()
    session = store.create(
        Session(
            id=session_id(run.id, slot), run_id=run.id, slot=slot, attempt=run.attempt, owner="alice",
            asked_by="alice", kind=kind, relay=site.relay_url, client_secret_hash=hashed, created_at=now,
            expires_at=now + REQUEST_SECONDS, **fields,
        )
    )  # fmt: skip
    current = site.stack.store.get(run.id)
    if not count:
        return session, ticket(session.id, secret)
    site.stack.store.update(
        current,
        Expect(states=frozenset({RunState.RUNNING}), attempt=run.attempt),
        {"sessions_asked": current.sessions_asked + 1},
    )
    return session, ticket(session.id, secret)


def join(site: Site, run: Run, kind: SessionKind, hello: dict[str, Any] | None = None, **fields: Any) -> Client:
    session, text = ask(site, run, kind, **fields)
    conn = connect(
        site.relay_url, additional_headers={"Authorization": f"Bearer {text}"}, compression=None, open_timeout=10
    )
    client = Client(conn, session)
    client.send(json_frame(FrameType.HELLO, {"v": 1, "side": "client", **(hello or {})}))
    first = client.recv()
    assert first.type == FrameType.HELLO and first.json()["side"] == "worker"
    return client


def ended(site: Site, session: Session) -> Session:
    store = site.stack.sessions
    assert store is not None
    return wait_for(lambda: (s := store.get(session.id)).state.over and s, 20, 0.1, f"session {session.id} to end")


def test_an_exec_gives_its_output_and_exit_code_and_ends_on_the_runs_timeline(site: Site) -> None:
    client = join(site, site.run, SessionKind.EXEC, command=["sh", "-c", "echo hi; echo err >&2; exit 3"])
    with client.conn:
        exit_frame = client.until(FrameType.EXIT)
    assert exit_frame.json()["code"] == 3
    assert client.out == {STDOUT: b"hi\n", STDERR: b"err\n"}
    session = ended(site, client.session)
    assert (session.end_reason, session.exit_code, session.worker_id) == (EndReason.EXITED, 3, "w-sessions")
    assert session.bytes_out == len(b"hi\nerr\n")
    timeline = [e.message for e in site.stack.store.get(site.run.id).events]
    assert any(m.startswith("exec by alice: sh -c 'echo hi;") and m.endswith(", exit 3") for m in timeline), timeline


def test_stdin_reaches_the_command_as_the_runs_user_with_the_sessions_name(site: Site) -> None:
    client = join(site, site.run, SessionKind.EXEC, command=["sh"], stdin=True)
    with client.conn:
        client.send(Frame(FrameType.DATA, STDIN, 0, b'echo $((6 * 7)) "$RUNPLANE_SESSION" $(id -u)\n'))
        client.send(Frame(FrameType.EOF, STDIN))
        assert client.until(FrameType.EXIT).json()["code"] == 0
    user = (site.container(site.run).attrs["Config"]["User"] or "0").split(":")[0]
    assert client.out[STDOUT].decode().split() == ["42", client.session.id, user]


def test_a_command_silent_past_the_engine_clients_timeout_is_not_over(site: Site) -> None:
    """The exec's stream keeps no timeout of the Docker client that started it (docker-py's request
    timeout, 60 s by default, here 2 s): a command quiet for longer goes on, and its output and exit
    status come when it has them."""
    import docker

    run = site.stack.store.get(site.run.id)
    api = docker.from_env(timeout=2).api  # the engine the site's agent uses, with a short request timeout
    host = SessionHost(
        site.stack.sessions,
        RunStateWriter(run, AgentPorts(site.stack.store, site.stack.queue, site.stack.objects), time.time),
        api,
        site.container(run),
        "w-patient",
        time.time,
    )
    session, text = ask(site, run, SessionKind.EXEC, count=False, command=["sh", "-c", "sleep 4; echo late; exit 4"])
    try:
        host.look()
        conn = connect(
            site.relay_url, additional_headers={"Authorization": f"Bearer {text}"}, compression=None, open_timeout=10
        )
        client = Client(conn, session)
        client.send(json_frame(FrameType.HELLO, {"v": 1, "side": "client"}))
        with client.conn:
            assert client.until(FrameType.EXIT).json()["code"] == 4
        assert client.out[STDOUT] == b"late\n"
    finally:
        host.stop()
        api.close()


def test_a_terminals_size_follows_resize(site: Site) -> None:
    client = join(site, site.run, SessionKind.SHELL, {"rows": 40, "cols": 132}, tty=True, stdin=True)
    with client.conn:
        client.send(Frame(FrameType.DATA, STDIN, 0, b"stty size\n"))
        client.wait_output(b"40 132")
        client.send(resize(30, 100))
        client.send(Frame(FrameType.DATA, STDIN, 0, b"stty size; exit 5\n"))
        assert client.until(FrameType.EXIT).json()["code"] == 5
    assert b"30 100" in client.out[STDOUT]
    assert client.out[STDERR] == b""  # with a terminal everything comes on stdout


def test_a_signal_with_a_terminal_reaches_its_foreground_job(site: Site) -> None:
    client = join(site, site.run, SessionKind.SHELL, {"rows": 24, "cols": 80}, tty=True, stdin=True)
    with client.conn:
        client.send(Frame(FrameType.DATA, STDIN, 0, b"sleep 1009\n"))
        wait_for(lambda: any("sleep 1009" in p for p in _sleeps(site)), 10, 0.1, "the foreground sleep")
        client.send(signal_frame(signal.SIGINT))  # as ^C would: the sleep, not the shell
        wait_for(lambda: _sleeps(site) == [], 10, 0.1, "the sleep to end")
        client.send(Frame(FrameType.DATA, STDIN, 0, b"echo after $?\n"))  # the shell is there still
        client.wait_output(b"after 130")
        client.send(Frame(FrameType.DATA, STDIN, 0, b"exit 7\n"))
        assert client.until(FrameType.EXIT).json()["code"] == 7


def _sleeps(site: Site) -> list[str]:
    top = site.container(site.run).top()
    return [" ".join(p) for p in top["Processes"] if "sleep 100" in " ".join(p)]


def test_a_client_that_drops_leaves_nothing_of_its_session_running(site: Site) -> None:
    # the last leaves the session and clears its environment, once the session runs (its "ready" sent)
    command = [
        "sh",
        "-c",
        "sleep 1001 & (setsid sleep 1002 &); echo ready; read go; (setsid env -i sleep 1008 &); sleep 1003",
    ]
    client = join(site, site.run, SessionKind.EXEC, command=command, stdin=True)
    client.wait_output(b"ready")
    client.send(Frame(FrameType.DATA, STDIN, 0, b"go\n"))
    wait_for(lambda: len(_sleeps(site)) == 4, 10, 0.1, "the session's four sleeps")
    client.conn.socket.close()  # dropped, no goodbye
    client.conn.close()
    session = ended(site, client.session)
    assert session.end_reason == EndReason.CLIENT_GONE and session.exit_code is None
    assert _sleeps(site) == []
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith(f"session-{session.id}")],
        10, 0.1, "the session's threads to end",
    )  # fmt: skip


def test_a_closed_session_ends_its_command(site: Site) -> None:
    client = join(site, site.run, SessionKind.EXEC, command=["sh", "-c", "sleep 1004"])
    wait_for(lambda: any("sleep 1004" in p for p in _sleeps(site)), 10, 0.1, "the session's sleep")
    store = site.stack.sessions
    assert store is not None
    live = store.get(client.session.id)
    store.update(live, LIVE, {"state": SessionState.ENDED, "end_reason": "closed", "ended_at": time.time()})
    site.hub.close(client.session.id, "closed")  # as the API's DELETE does: the record first
    with client.conn:
        assert client.until(FrameType.GONE).json()["reason"] == "closed"
    assert ended(site, client.session).end_reason == EndReason.CLOSED
    wait_for(lambda: _sleeps(site) == [], 10, 0.1, "the session's sleep to end")
    _noted(site, "exec by alice: sh -c 'sleep 1004', ", ", closed")


def test_a_client_cannot_end_its_session_as_the_run_ending(site: Site) -> None:
    client = join(site, site.run, SessionKind.EXEC, command=["sh", "-c", "sleep 1005"])
    wait_for(lambda: any("sleep 1005" in p for p in _sleeps(site)), 10, 0.1, "the session's sleep")
    with client.conn:
        client.send(json_frame(FrameType.GONE, {"reason": "run_ended"}))
    assert ended(site, client.session).end_reason == EndReason.CLIENT_GONE
    assert site.stack.store.get(site.run.id).state == RunState.RUNNING
    _noted(site, "exec by alice: sh -c 'sleep 1005', ", ", client_gone")


def _noted(site: Site, begins: str, ends: str) -> None:
    """Wait for the run's timeline to say a session's end so."""

    def said() -> bool:
        events = site.stack.store.get(site.run.id).events
        return any(e.message.startswith(begins) and e.message.endswith(ends) for e in events)

    wait_for(said, 10, 0.1, f"the timeline to say {begins}...{ends}")


def test_an_agent_that_cannot_see_the_runs_processes_refuses_sessions(site: Site, tmp_path: Path) -> None:
    store = site.stack.sessions
    assert store is not None
    run = site.stack.store.get(site.run.id)
    blind = SessionHost(
        store,
        RunStateWriter(run, AgentPorts(site.stack.store, site.stack.queue, site.stack.objects), time.time),
        site.docker.api,
        site.container(run),
        "w-blind",
        time.time,
        procs=Procs(tmp_path),  # a /proc with none of the container's processes in it
    )
    session, _ = ask(site, run, SessionKind.EXEC, count=False, command=["true"])  # the run's own agent is not told
    blind.look()
    refused = store.get(session.id)
    assert refused.state == SessionState.REFUSED and refused.worker_id is None
    assert refused.end_reason is not None and "PID namespace" in refused.end_reason
    assert blind.threads == []


def test_a_port_forward_reaches_the_runs_own_loopback_only(site: Site) -> None:
    client = join(site, site.run, SessionKind.PORT_FORWARD, port=8000)
    with client.conn:
        for chan in (16, 18):  # two connections at once
            client.send(json_frame(FrameType.OPEN, {"port": 8000}, channel=chan))
            assert client.recv().type == FrameType.OPEN_OK
        for chan in (16, 18):
            client.send(Frame(FrameType.DATA, chan, 0, b"GET /index.html HTTP/1.0\r\n\r\n"))
        got: dict[int, bytes] = {16: b"", 18: b""}
        done: set[int] = set()
        while done != {16, 18}:
            frame = client.recv()
            if frame.type == FrameType.DATA:
                got[frame.channel] += frame.payload
            elif frame.type in (FrameType.EOF, FrameType.CLOSE):
                done.add(frame.channel)
        assert all(PAGE.encode() in body for body in got.values()), got
        client.send(json_frame(FrameType.OPEN, {"port": 8001}, channel=20))  # not the session's port
        refused = client.recv()
        assert refused.type == FrameType.OPEN_FAIL and "port 8000 only" in refused.json()["reason"]
    assert ended(site, client.session).end_reason in (EndReason.CLIENT_GONE, EndReason.RELAY_LOST)


def test_a_port_forward_never_reaches_the_host_nor_another_run(site: Site) -> None:
    host = socket.create_server(("127.0.0.1", 0))  # a port only the host listens on
    host.settimeout(0.5)
    host_port = host.getsockname()[1]
    with host:
        for port in (host_port, 8001):  # and one only the other run listens on
            client = join(site, site.run, SessionKind.PORT_FORWARD, port=port)
            with client.conn:
                client.send(json_frame(FrameType.OPEN, {"port": port}, channel=16))
                refused = client.recv()
            assert refused.type == FrameType.OPEN_FAIL, port
            assert "refused" in refused.json()["reason"].lower(), refused.json()
        with pytest.raises(TimeoutError):
            host.accept()
    # the other run's listener is there: only its own sessions reach it
    client = join(site, site.other, SessionKind.PORT_FORWARD, port=8001)
    with client.conn:
        client.send(json_frame(FrameType.OPEN, {"port": 8001}, channel=16))
        assert client.recv().type == FrameType.OPEN_OK
        client.send(Frame(FrameType.DATA, 16, 0, b"GET /index.html HTTP/1.0\r\n\r\n"))
        body = b""
        while (frame := client.recv()).type == FrameType.DATA:
            body += frame.payload
    assert b"other" in body


def test_a_session_ends_with_its_run(site: Site) -> None:
    client = join(site, site.other, SessionKind.EXEC, command=["sleep", "1000"])
    kill_run(site.stack.ports, Principal(user="alice"), site.other.id)
    with client.conn:
        gone = client.until(FrameType.GONE)
        assert gone.json()["reason"] == "run_ended"
        with pytest.raises(ConnectionClosed):
            while True:
                client.recv()
    assert ended(site, client.session).end_reason == EndReason.RUN_ENDED
    timeline = [e.message for e in site.stack.store.get(site.other.id).events]
    assert any(m.startswith("exec by alice: sleep 1000, ") and m.endswith(", run_ended") for m in timeline), timeline


def test_a_session_asked_once_the_runs_container_is_gone_is_ended_not_left_waiting(site: Site) -> None:
    store = site.stack.sessions
    assert store is not None
    run = site.stack.store.get(site.run.id)
    gone = site.docker.containers.create(TEST_IMAGE, "true", network_mode="none")
    gone.remove()  # its run's container, as the run ends: a session asked now has nothing to serve
    host = SessionHost(
        store,
        RunStateWriter(run, AgentPorts(site.stack.store, site.stack.queue, site.stack.objects), time.time),
        site.docker.api,
        gone,
        "w-late",
        time.time,
    )
    session, _ = ask(site, run, SessionKind.EXEC, count=False, command=["true"])  # the run's own agent is not told
    host.look()
    over = store.get(session.id)
    assert (over.state, over.end_reason, over.worker_id) == (SessionState.ENDED, "run_ended", None)
    assert over.ended_at is not None and host.threads == []
