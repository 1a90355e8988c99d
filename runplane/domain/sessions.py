"""A look inside a live run: a session (``runplane exec``, ``shell``, ``port-forward``) between the
run's owner and the worker that holds the run, carried by a relay neither side listens on.

The API makes a session (``requested``) in a free slot of the run (``max_sessions_per_run`` of
its pool) and bumps the run's ``sessions_asked``, which the agent's one-second look at the run's
control state notices; the agent takes it (``accepted``: its own ticket's hash written, on the
condition that it still holds the run), dials the relay and starts the command or the port's
connections; ``active`` once both sides met; ``ended`` (with ``end_reason``), or ``expired`` (no
agent took it in time) or ``refused`` (the agent could not). A ticket is ``<session id>.<secret>``:
the store holds only the secret's SHA-256, so a ticket is never stored anywhere a reader could use.

The bytes between the sides are frames of ``session_wire``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import Field

from runplane.domain.common import RUN_ID_PATTERN
from runplane.domain.wire import Record

DEFAULT_MAX_SESSIONS_PER_RUN = 4
"""Sessions one run may have at once, unless its pool says otherwise."""
MAX_SESSIONS_PER_RUN = 16
"""The most a pool may allow."""
ATTACH_SLOT = MAX_SESSIONS_PER_RUN - 1
"""The slot of an interactive run's attach session (one at a time; its other sessions keep off it)."""
MAX_COMMAND_ARGS = 256
MAX_COMMAND_BYTES = 64 * 1024
REQUEST_SECONDS = 60.0
BINARY, BASE64 = "binary", "base64"
"""RelayEndpoint.encoding: how a frame travels as a WebSocket message."""
DEFAULT_FRAME = 64 * 1024
"""A relay's most payload bytes per frame unless it says fewer."""
"""How long a requested session waits for its worker, and a ticket for its side to connect."""
TERM_PATTERN = r"^[A-Za-z0-9._+-]{1,64}$"
SESSION_ID_PATTERN = rf"^{RUN_ID_PATTERN}\.\d{{1,2}}\.[0-9a-f]{{8}}$"
TICKET_PATTERN = rf"^{RUN_ID_PATTERN}\.\d{{1,2}}\.[0-9a-f]{{8}}\.[A-Za-z0-9_-]{{43}}$"

Side = Literal["client", "worker"]


class SessionKind(StrEnum):
    EXEC = "exec"
    """A command in the run's container, as the run's user, with its environment and limits."""
    SHELL = "shell"
    """The image's shell, with a terminal."""
    PORT_FORWARD = "port_forward"
    """Connections to ``127.0.0.1:port`` inside the run's own network namespace."""
    ATTACH = "attach"
    """The input and output of an interactive run's own command (``RunSpec.interactive``), with a
    terminal where the run has one; one at a time, in the run's last slot (ATTACH_SLOT)."""


class SessionState(StrEnum):
    REQUESTED = "requested"
    ACCEPTED = "accepted"
    ACTIVE = "active"
    ENDED = "ended"
    EXPIRED = "expired"
    REFUSED = "refused"

    @property
    def over(self) -> bool:
        return self in OVER


OVER = frozenset({SessionState.ENDED, SessionState.EXPIRED, SessionState.REFUSED})
LIVE = frozenset(set(SessionState) - OVER)


class EndReason(StrEnum):
    EXITED = "exited"
    """The command exited (its code is ``exit_code``)."""
    CLIENT_GONE = "client_gone"
    """The client went and did not come back."""
    CLOSED = "closed"
    """The user closed it (``DELETE``)."""
    RUN_ENDED = "run_ended"
    WORKER_LOST = "worker_lost"
    RELAY_LOST = "relay_lost"


class Session(Record):
    """A session as stored: one per slot of a run (``slot``); a new session of a slot replaces
    one that is over. Read tolerantly (``stored``) like every record."""

    id: str = Field(pattern=SESSION_ID_PATTERN)
    run_id: str
    slot: int = Field(ge=0, lt=MAX_SESSIONS_PER_RUN)
    attempt: int
    """The run's attempt it was asked of: a session never outlives its attempt."""
    owner: str
    asked_by: str
    kind: SessionKind
    command: list[str] | None = None
    tty: bool = False
    stdin: bool = False
    term: str | None = None
    rows: int | None = None
    cols: int | None = None
    port: int | None = None
    """``port_forward``: the port inside the run."""
    relay: str
    """The URL both sides dial (the relay of the stack that made it)."""
    relay_encoding: str = "binary"
    """How frames travel through that relay (RelayEndpoint.encoding)."""
    relay_frame: int | None = None
    """The relay's most payload bytes per frame (RelayEndpoint.max_frame); None: 64 KiB."""
    relay_ticket_header: str = "Authorization"
    """The header a side's ticket travels in (``Bearer <ticket>``)."""
    relay_worker: str | None = None
    """The URL the worker dials when it is not ``relay`` (RelayEndpoint.worker_url)."""
    state: SessionState = SessionState.REQUESTED
    worker_id: str | None = None
    client_secret_hash: str
    worker_secret_hash: str | None = None
    created_at: float
    expires_at: float
    """A requested session no worker took by then is ``expired``; a ticket is not taken after it."""
    accepted_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    end_reason: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass(frozen=True)
class RelayEndpoint:
    """Where a side of a session dials: a WebSocket URL and the headers to send with it."""

    url: str
    headers: dict[str, str]
    max_frame: int
    """The most payload bytes a frame may carry through this relay."""
    encoding: str = BINARY
    """How a frame travels as a WebSocket message: ``binary`` (a binary message of its bytes) or
    ``base64`` (a text message of their base64: gateways that refuse binary messages)."""
    worker_url: str | None = None
    """Where the session's worker dials, when not ``url``: a relay whose URL says which way a side
    sends (Azure Web PubSub's group to publish to) gives each side its own."""


@dataclass(frozen=True)
class Asked:
    """What a caller asks of a session (the API's ``SessionRequest``, already checked for its shape)."""

    kind: SessionKind
    command: Sequence[str] | None = None
    tty: bool | None = None
    stdin: bool | None = None
    term: str | None = None
    rows: int | None = None
    cols: int | None = None
    port: int | None = None


def with_relay(session: Session, endpoint: RelayEndpoint, ticket_text: str) -> Session:
    """``session`` with what its worker dials ``endpoint``'s relay by (the URL, the encoding, the
    frame size and the header that carries ``ticket_text``, the client's ticket, as a bearer token:
    the worker sends its own ticket the same way)."""
    header = next((k for k, v in endpoint.headers.items() if v == f"Bearer {ticket_text}"), "Authorization")
    return session.model_copy(
        update={
            "relay": endpoint.url,
            "relay_encoding": endpoint.encoding,
            "relay_frame": endpoint.max_frame,
            "relay_ticket_header": header,
            "relay_worker": endpoint.worker_url,
        }
    )


def worker_endpoint(session: Session, ticket_text: str) -> RelayEndpoint:
    """Where the worker of ``session`` dials with its ``ticket_text``: the relay the session names."""
    return RelayEndpoint(
        url=session.relay_worker or session.relay,
        headers={session.relay_ticket_header: f"Bearer {ticket_text}"},
        max_frame=session.relay_frame or DEFAULT_FRAME,
        encoding=session.relay_encoding,
    )


def session_id(run_id: str, slot: int) -> str:
    return f"{run_id}.{slot}.{secrets.token_hex(4)}"


def run_of(session_id: str) -> tuple[str, int]:
    """The run id and slot a session id names (its form is ``SESSION_ID_PATTERN``)."""
    run_id, slot, _ = session_id.rsplit(".", 2)
    return run_id, int(slot)


def new_secret() -> tuple[str, str]:
    """A ticket's secret and the hash the store keeps of it."""
    secret = secrets.token_urlsafe(32)
    return secret, secret_hash(secret)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def ticket(session_id: str, secret: str) -> str:
    return f"{session_id}.{secret}"


def read_ticket(text: str) -> tuple[str, str] | None:
    """A ticket's session id and secret; None when it is not one (never raises)."""
    if not isinstance(text, str) or not re.fullmatch(TICKET_PATTERN, text):
        return None
    session, secret = text.rsplit(".", 1)
    return session, secret


def admits(session: Session, side: Side, secret: str, now: float) -> bool:
    """Whether ``secret`` is ``side``'s ticket of ``session`` and the session may be joined now:
    live, and the client's ticket not after ``expires_at`` unless the session is already active
    (a reconnect gets a fresh ticket: ``POST .../ticket``)."""
    if session.state.over:
        return False
    expected = session.client_secret_hash if side == "client" else session.worker_secret_hash
    if expected is None or not hmac.compare_digest(expected, secret_hash(secret)):
        return False
    return side == "worker" or now <= session.expires_at
