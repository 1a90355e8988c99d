"""The relays the session relay contract (test_session_relay.py) runs against, each as it is served:
the one-machine hub behind the dev front (SQLite sessions); the AWS relay (the relay function behind
the API Gateway WebSocket fake, its connections and sessions in DynamoDB on the moto server).

A stack here is a ``RelayStack``: its port (``relay``: what the API asks for an endpoint and to
close a session), the sessions store it checks tickets against, the clock tickets are judged at,
and how frames travel through it (``encoding``). A test talks to the relay with plain WebSocket
clients and raw frames (``Side``), never through the Links, so the contract is the relay's own.

A new relay registers here: a context manager ``(tmp_path, **fixtures) -> RelayStack`` in ``STACKS``,
and in ``FIXTURES`` the names of the session fixtures it takes (the services it needs).
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from functions.aws import relay as relay_function
from runplane import bootstrap
from runplane.adapters.aws.provision import provision
from runplane.adapters.aws.relay import RELAY_FRAME, SIDES, AwsSessionRelay
from runplane.adapters.local.relay import FrontSessionRelay
from runplane.devstack.apigw_ws import ApiGatewayWebSocket
from runplane.devstack.front import FrontServer
from runplane.devstack.local import LocalCloud
from runplane.devstack.relay import RelayHub
from runplane.domain.sessions import (
    BASE64,
    BINARY,
    Session,
    SessionKind,
    SessionState,
    new_secret,
    secret_hash,
    session_id,
    ticket,
)
from runplane.ports import SessionRelay, SessionStore
from runplane.settings import StackSettings

POOLS = """pools:
  - {name: default, backend: local, cpus: 1, memory: 1g, disk: 1g, max_workers: 0, default_image: busybox}
"""


@dataclass
class Side:
    """One side's WebSocket at a relay: frames (bytes) in and out in the relay's ``encoding``."""

    ws: ClientConnection
    encoding: str

    def send(self, frame: bytes) -> None:
        self.ws.send(base64.b64encode(frame).decode() if self.encoding == BASE64 else frame)

    def send_raw(self, message: str | bytes) -> None:
        """A message as it is, whatever the relay's encoding."""
        self.ws.send(message)

    def recv(self, timeout: float = 10) -> bytes:
        message = self.ws.recv(timeout=timeout)
        if self.encoding == BASE64:
            assert isinstance(message, str), "a base64 relay delivers text messages"
            return base64.b64decode(message, validate=True)
        assert isinstance(message, bytes), "a binary relay delivers binary messages"
        return message

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> Side:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.close()


@dataclass
class RelayStack:
    name: str
    relay: SessionRelay
    store: SessionStore
    now: list[float]
    """The time tickets are judged at (``admits``): a test moves it."""
    url: str
    """The WebSocket URL sides dial."""
    encoding: str
    max_frame: int
    held: Callable[[str], list[str]]
    """The sides of a session the relay holds now (sorted)."""
    filters_gone: bool = True
    """Whether a GONE frame a side sends is kept from its peer (only the relay says GONE)."""
    other_kind_ends: bool = True
    """Whether a message of the other kind (text on a binary relay, binary on a base64 one) ends its side."""
    ticket_header: str = "Authorization"
    """The header a side's ticket travels in (``Bearer <ticket>``)."""
    largest_message: int | None = None
    """The most bytes one message may have (one more ends its sender); None: a frame of ``max_frame``."""
    extras: dict[str, Any] = field(default_factory=dict)

    def session(self, slot: int = 0, run_id: str | None = None, **changes: Any) -> tuple[Session, str, str]:
        """A session taken by a worker (of a run of its own unless ``run_id``), and the client's and the
        worker's tickets."""
        client_secret, client_hash = new_secret()
        worker_secret, worker_hash = new_secret()
        run_id = run_id or f"r-{uuid.uuid4().hex[:24]}"
        fields: dict[str, Any] = {
            "id": session_id(run_id, slot),
            "run_id": run_id,
            "slot": slot,
            "attempt": 1,
            "owner": "alice",
            "asked_by": "alice",
            "kind": SessionKind.EXEC,
            "command": ["sh"],
            "relay": self.url,
            "relay_encoding": self.encoding,
            "relay_frame": self.max_frame,
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

    def dial(self, session: Session | None, ticket_text: str | None) -> Side:
        """A side dialled as the API tells it to (``relay.endpoint``) with ``ticket_text``; None: no
        ticket at all."""
        if session is None or ticket_text is None:
            url, headers = self.url, {}
        else:
            endpoint = self.relay.endpoint(session, ticket_text)
            url, headers = endpoint.url, endpoint.headers
            if endpoint.worker_url and secret_hash(ticket_text.rsplit(".", 1)[-1]) == session.worker_secret_hash:
                url = endpoint.worker_url  # where the worker dials (worker_endpoint)
        ws = connect(url, additional_headers=headers, max_size=None, open_timeout=10, compression=None)
        return Side(ws, self.encoding)


@contextlib.contextmanager
def local_relay(tmp_path: Path) -> Iterator[RelayStack]:
    """The one-machine hub behind the dev front, sessions in the stack's SQLite."""
    state = tmp_path / "local-relay"
    settings = StackSettings(cloud="local", state_dir=str(state), public_url="http://127.0.0.1", pools=POOLS)
    stack = bootstrap.build_stack(settings)
    assert stack.sessions is not None
    now = [time.time()]
    hub = RelayHub(stack.sessions, clock=lambda: now[0])
    server = FrontServer(("127.0.0.1", 0), LocalCloud(state, "http://127.0.0.1"))
    server.relay = hub
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    relay = FrontSessionRelay(f"http://127.0.0.1:{server.server_address[1]}", hub)
    try:
        held: Callable[[str], list[str]] = lambda sid: list(hub.held(sid))  # noqa: E731
        yield RelayStack("local", relay, stack.sessions, now, relay.url, BINARY, relay.max_frame, held, True)
    finally:
        hub.stop()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def aws_relay(tmp_path: Path, moto_endpoint: str) -> Iterator[RelayStack]:
    """The relay function behind the API Gateway WebSocket fake, its connections and the sessions in
    DynamoDB on the moto server."""
    gateway = ApiGatewayWebSocket(relay_function.lambda_handler)
    settings = StackSettings(
        prefix=f"t{uuid.uuid4().hex[:8]}", aws_endpoint_url=moto_endpoint, pools=POOLS, relay_url=gateway.url
    )
    clients = bootstrap.aws_clients(settings)
    stack = bootstrap.build_stack(settings, clients)
    provision(bootstrap.aws_names(settings), [], clients["dynamodb"], clients["sqs"], clients["s3"])
    assert stack.sessions is not None and isinstance(stack.relay, AwsSessionRelay)
    now = [time.time()]
    stack.clock = lambda: now[0]
    connections = stack.relay.connections
    before = bootstrap.use(stack)  # the function's stack
    gateway.start()

    def held(sid: str) -> list[str]:
        return [side for side in SIDES if connections.side(sid, side) is not None]

    try:
        extras = {"gateway": gateway}  # the WebSocket API fake (its throttle)
        yield RelayStack("aws", stack.relay, stack.sessions, now, gateway.url, BASE64, RELAY_FRAME, held, extras=extras)
    finally:
        gateway.stop()
        bootstrap.use(before)


from tests.integration.contracts.relay_azure import azure_relay  # noqa: E402  (it builds on what is above)

STACKS: dict[str, Callable[..., contextlib.AbstractContextManager[RelayStack]]] = {
    "local": local_relay,
    "azure": azure_relay,
    "aws": aws_relay,
}
"""Each relay of the contract, by name."""
FIXTURES: dict[str, tuple[str, ...]] = {"aws": ("moto_endpoint",)}
"""The session fixtures a relay's entry takes (by name, as keyword arguments)."""
