"""The one-machine relay (runplane/devstack/relay.py) behind both fronts of the embedded stack (the
dev front and cheroot's, of ``runplane serve``, plain and HTTPS), with sessions in the stack's SQLite
store: what is the front's and the hub's own. The two sides meet and every byte crosses while plain
HTTP is served; a side's leaving ends the session behind each front; a side waits a while alone; the
hub holds at most so many sides; a peer that reads slowly holds its sender back. What every relay
must do (tickets, pairing, GONE, close, oversize frames) is the contract of
tests/integration/contracts/test_session_relay.py."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from runplane import bootstrap
from runplane.adapters.local.relay import FrontSessionRelay
from runplane.devstack.front import FrontServer
from runplane.devstack.local import LocalCloud
from runplane.devstack.relay import RelayHub
from runplane.devstack.stack import DevConfig, DevStack, free_port
from runplane.devstack.wsgi import ProductionFront
from runplane.domain import session_wire
from runplane.domain.session_wire import Frame, FrameType
from runplane.domain.sessions import (
    Session,
    SessionKind,
    SessionState,
    new_secret,
    session_id,
    ticket,
)
from runplane.ports import SessionStore
from runplane.settings import StackSettings
from tests.integration.test_serve_front import self_signed

POOLS = """pools:
  - {name: default, backend: local, cpus: 1, memory: 1g, disk: 1g, max_workers: 0, default_image: busybox}
"""
MAX_FRAME = 64 * 1024


@dataclass
class Relay:
    url: str
    """The front's http(s):// URL."""
    hub: RelayHub
    store: SessionStore
    now: list[float]
    tls: ssl.SSLContext | None = None
    """What a side trusts of an https:// front."""

    def session(self, run_id: str = "r-relay", slot: int = 0, **changes: Any) -> tuple[Session, str, str]:
        """A session taken by a worker, and the client's and the worker's tickets."""
        client_secret, client_hash = new_secret()
        worker_secret, worker_hash = new_secret()
        fields: dict[str, Any] = {
            "id": session_id(run_id, slot),
            "run_id": run_id,
            "slot": slot,
            "attempt": 1,
            "owner": "alice",
            "asked_by": "alice",
            "kind": SessionKind.EXEC,
            "command": ["sh"],
            "relay": self.ws_url,
            "state": SessionState.ACCEPTED,
            "worker_id": "w-1",
            "client_secret_hash": client_hash,
            "worker_secret_hash": worker_hash,
            "created_at": self.now[0],
            "expires_at": self.now[0] + 60,
            **changes,
        }
        session = self.store.create(Session(**fields))
        return session, ticket(session.id, client_secret), ticket(session.id, worker_secret)

    @property
    def ws_url(self) -> str:
        return FrontSessionRelay(self.url, self.hub).url

    def dial(self, ticket_text: str | None) -> ClientConnection:
        headers = {"Authorization": f"Bearer {ticket_text}"} if ticket_text is not None else {}
        return connect(
            self.ws_url,
            additional_headers=headers,
            max_size=2 * MAX_FRAME,
            open_timeout=10,
            compression=None,
            ssl=self.tls,
        )


def _serve_dev(address: tuple[str, int], cloud: LocalCloud, hub: RelayHub) -> tuple[str, Callable[[], None]]:
    server = FrontServer(address, cloud)
    server.relay = hub
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_address[1]}", stop


def _serve_cheroot(
    address: tuple[str, int], cloud: LocalCloud, hub: RelayHub, tls: tuple[Path, Path] | None = None
) -> tuple[str, Callable[[], None]]:
    front = ProductionFront(address, cloud, *(tls or (None, None)))
    front.relay = hub
    thread = threading.Thread(target=front.serve_forever, daemon=True)
    thread.start()
    return f"{'https' if tls else 'http'}://127.0.0.1:{front.server_address[1]}", front.shutdown


def _relay(
    tmp_path: Path,
    serve: Callable[..., tuple[str, Callable[[], None]]],
    wait: float,
    tls: bool = False,
    max_connections: int = 512,
    max_per_owner: int = 64,
) -> Iterator[Relay]:
    state = tmp_path / "state"
    settings = StackSettings(cloud="local", state_dir=str(state), public_url="http://127.0.0.1", pools=POOLS)
    stack = bootstrap.build_stack(settings)
    assert stack.sessions is not None
    now = [time.time()]
    hub = RelayHub(
        stack.sessions,
        clock=lambda: now[0],
        wait_seconds=wait,
        max_connections=max_connections,
        max_per_owner=max_per_owner,
    )
    cloud = LocalCloud(state, "http://127.0.0.1")
    cloud.provision(stack)
    before = bootstrap.use(stack)
    trust = None
    if tls:
        cert, key = self_signed(tmp_path)
        url, stop = serve(("127.0.0.1", 0), cloud, hub, (cert, key))
        trust = ssl.create_default_context(cafile=str(cert))
    else:
        url, stop = serve(("127.0.0.1", 0), cloud, hub)
    try:
        yield Relay(url, hub, stack.sessions, now, trust)
    finally:
        stop()
        bootstrap.use(before)


@pytest.fixture(params=["dev", "serve", "serve-tls"])
def relay(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Relay]:
    """The relay behind the dev front and behind cheroot's (plain, and HTTPS: wss://)."""
    serve = _serve_dev if request.param == "dev" else _serve_cheroot
    yield from _relay(tmp_path, serve, 60, tls=request.param == "serve-tls")


@pytest.fixture
def dev_relay(tmp_path: Path) -> Iterator[Relay]:
    yield from _relay(tmp_path, _serve_dev, 60)


def _gone(side: ClientConnection) -> str:
    """The reason of the GONE frame ``side`` gets next, once it is closed after it."""
    frame = session_wire.decode(side.recv(timeout=10))  # type: ignore[arg-type]
    assert frame.type == FrameType.GONE
    reason = str(frame.json()["reason"])
    with pytest.raises(ConnectionClosed):
        side.recv(timeout=10)
    return reason


def test_the_sides_meet_and_every_byte_crosses_both_ways_while_http_is_served(relay: Relay) -> None:
    session, client_ticket, worker_ticket = relay.session()
    every_byte = Frame(FrameType.DATA, session_wire.STDIN, 1, bytes(range(256))).encode()
    largest = Frame(FrameType.DATA, session_wire.STDIN, 2, bytes(range(256)) * (MAX_FRAME // 256)).encode()
    with relay.dial(client_ticket) as client:
        client.send(every_byte)  # sent before the worker is there: it waits for it
        with relay.dial(worker_ticket) as worker:
            client.send(largest)
            assert worker.recv(timeout=10) == every_byte
            assert worker.recv(timeout=10) == largest
            for n in range(3):
                back = Frame(FrameType.DATA, session_wire.STDOUT, n + 1, bytes([255 - n]) * (n + 1)).encode()
                worker.send(back)
                assert client.recv(timeout=10) == back
            assert relay.hub.held(session.id) == ["client", "worker"]
            answer = httpx.get(f"{relay.url}/v1/health", timeout=10, verify=relay.tls or True)
            assert answer.status_code == 200


@pytest.mark.parametrize("leaver", ["client", "worker"])
def test_a_side_that_goes_leaves_its_peer_a_gone_frame(relay: Relay, leaver: str) -> None:
    session, client_ticket, worker_ticket = relay.session()
    client, worker = relay.dial(client_ticket), relay.dial(worker_ticket)
    client.send(b"x" * 8)
    assert worker.recv(timeout=10) == b"x" * 8
    going, staying = (client, worker) if leaver == "client" else (worker, client)
    going.close()
    assert _gone(staying) == f"{leaver}_gone"
    _wait(lambda: relay.hub.held(session.id) == [])


def test_the_https_front_sends_no_session_ticket(tmp_path: Path) -> None:
    """A TLS 1.3 session ticket arrives just as a client writes its first request; websockets' sync
    client reads it on its reading thread while another writes the request, which OpenSSL does not
    allow, and the request was now and then lost (its relay handshake then went unanswered)."""
    for relay in _relay(tmp_path, _serve_cheroot, 60, tls=True):
        assert relay.tls is not None
        host, port = relay.url.removeprefix("https://").split(":")
        with (
            socket.create_connection((host, int(port)), timeout=10) as bare,
            relay.tls.wrap_socket(bare, server_hostname=host) as tls,
        ):
            assert tls.version() == "TLSv1.3"
            tls.sendall(f"GET /v1/health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := tls.recv(65536):  # a ticket would come before the answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
            assert tls.session is not None and not tls.session.has_ticket


def test_a_client_that_says_gone_is_hung_up_and_the_workers_gone_reaches_the_client(dev_relay: Relay) -> None:
    forged = session_wire.json_frame(FrameType.GONE, {"reason": "run_ended"}).encode()
    session, client_ticket, worker_ticket = dev_relay.session()
    with dev_relay.dial(client_ticket) as client, dev_relay.dial(worker_ticket) as worker:
        client.send(forged)
        with pytest.raises(ConnectionClosed) as closed:
            client.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert _gone(worker) == "client_gone"  # never the reason the client said
    _wait(lambda: dev_relay.hub.held(session.id) == [])
    session, client_ticket, worker_ticket = dev_relay.session(slot=1)
    with dev_relay.dial(client_ticket) as client, dev_relay.dial(worker_ticket) as worker:
        worker.send(forged)  # the worker that ends a session says why
        assert client.recv(timeout=10) == forged


def test_a_side_alone_is_let_go_after_the_wait(tmp_path: Path) -> None:
    for relay in _relay(tmp_path, _serve_dev, 0.5):
        session, client_ticket, _ = relay.session()
        with relay.dial(client_ticket) as client:
            assert _gone(client) == "peer_absent"
        assert relay.hub.held(session.id) == []


def test_sides_past_the_relays_capacity_are_refused_until_one_goes(tmp_path: Path) -> None:
    for relay in _relay(tmp_path, _serve_dev, 60, max_connections=2):
        _, a_client, a_worker = relay.session(slot=0)
        _, b_client, _ = relay.session(slot=1)
        with relay.dial(a_client) as client:
            worker = relay.dial(a_worker)
            with pytest.raises(InvalidStatus) as full:
                relay.dial(b_client)
            assert full.value.response.status_code == 503
            worker.close()
            assert _gone(client) == "worker_gone"
        with relay.dial(b_client) as b:  # both places given back
            b.send(b"waiting")


def test_one_users_sessions_past_their_share_of_the_relay_are_refused_workers_too(tmp_path: Path) -> None:
    for relay in _relay(tmp_path, _serve_dev, 60, max_per_owner=2):
        a, a_client, a_worker = relay.session(slot=0)
        _, b_client, b_worker = relay.session(slot=1)
        _, c_client, c_worker = relay.session(slot=2)
        _, bobs_client, _ = relay.session(run_id="r-bob", owner="bob", asked_by="bob")
        with relay.dial(a_client) as client, relay.dial(a_worker) as worker, relay.dial(b_worker) as waiting:
            waiting.send(b"waiting")  # alice's sessions at the relay: 2
            for side in (c_worker, c_client):  # a worker that never meets its client holds no place past the share
                with pytest.raises(InvalidStatus) as refused:
                    relay.dial(side)
                assert refused.value.response.status_code == 429
                assert b"the most one user may" in refused.value.response.body
            with relay.dial(b_client) as b:  # its peer waits: its session is counted already
                assert b.recv(timeout=10) == b"waiting"
                with relay.dial(bobs_client) as bob:  # another user's are let in
                    bob.send(b"waiting")
                client.close()
                assert _gone(worker) == "client_gone"
                _wait(lambda r=relay, sid=a.id: r.hub.held(sid) == [])
                with relay.dial(c_worker) as c:  # the place of alice's session that ended is given back
                    c.send(b"waiting")


def test_a_peer_that_does_not_read_holds_its_sender_back_and_then_gets_everything_in_order(dev_relay: Relay) -> None:
    _, client_ticket, worker_ticket = dev_relay.session()

    def frame(n: int) -> bytes:
        return Frame(FrameType.DATA, session_wire.STDIN, n + 1, n.to_bytes(4, "big") * (MAX_FRAME // 4)).encode()

    with dev_relay.dial(client_ticket) as client, dev_relay.dial(worker_ticket) as worker:
        sent, stop = [0], threading.Event()

        def push() -> None:
            with contextlib.suppress(ConnectionClosed):
                while not stop.is_set() and sent[0] < 4096:  # 256 MiB at most
                    client.send(frame(sent[0]))
                    sent[0] += 1

        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        last = -1
        while sent[0] != last:  # until the sender is held back (or has sent it all)
            last = sent[0]
            time.sleep(0.5)
        assert sent[0] < 1024, "the relay took 64 MiB from a side whose peer reads nothing"
        stop.set()
        got = 0
        while got < sent[0] or pusher.is_alive():
            if got < sent[0]:
                assert worker.recv(timeout=10) == frame(got)
                got += 1
            else:
                pusher.join(0.05)
        assert got == sent[0] > 0


def test_the_endpoint_is_the_fronts_websocket_with_the_ticket_as_bearer() -> None:
    class Hub:
        closed: list[tuple[str, str]] = []

        def close(self, session_id: str, reason: str) -> None:
            self.closed.append((session_id, reason))

    relay = FrontSessionRelay("https://gpu1.lab:8443/", Hub())
    endpoint = relay.endpoint(None, "r-1.0.0123abcd.secret")  # type: ignore[arg-type]
    assert endpoint.url == "wss://gpu1.lab:8443/v1/relay"
    assert endpoint.headers == {"Authorization": "Bearer r-1.0.0123abcd.secret"}
    assert endpoint.max_frame == MAX_FRAME
    assert FrontSessionRelay("http://127.0.0.1:8080", Hub()).url == "ws://127.0.0.1:8080/v1/relay"
    with pytest.raises(ValueError):
        FrontSessionRelay("ftp://host", Hub())


def _wait(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_the_dev_stack_serves_the_relay_its_api_names_and_hangs_up_when_it_stops(tmp_path: Path) -> None:
    config = DevConfig(port=free_port(), state_dir=tmp_path, write_dev_file=False, functions=False, workers=0)
    dev = DevStack(config)
    dev.start()
    try:
        stack = bootstrap.stack()
        assert stack.sessions is not None and stack.relay is not None
        assert stack.ports.relay is stack.relay
        # the sessions are the stack's; the hub here only makes them (the front's is the stack's own)
        relay = Relay(dev.public_url, RelayHub(stack.sessions), stack.sessions, [time.time()])
        session, client_ticket, worker_ticket = relay.session()
        sides = []
        for text in (client_ticket, worker_ticket):
            endpoint = stack.relay.endpoint(session, text)  # what the API hands a side
            assert endpoint.url == f"ws://127.0.0.1:{config.port}/v1/relay"
            sides.append(connect(endpoint.url, additional_headers=endpoint.headers, open_timeout=10))
        with pytest.raises(InvalidStatus) as refused:
            relay.dial(client_ticket[:-4] + ("AAAA" if not client_ticket.endswith("AAAA") else "BBBB"))
        assert refused.value.response.status_code == 401
        client, worker = sides
        client.send(b"through the stack's front")
        assert worker.recv(timeout=10) == b"through the stack's front"
    finally:
        dev.stop()
    assert _gone(client) == "relay_lost"
    assert _gone(worker) == "relay_lost"
