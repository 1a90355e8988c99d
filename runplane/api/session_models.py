"""The answers of the sessions routes (``POST/GET /v1/runs/{run_id}/sessions`` and below): a session
as every answer shows it, and, to the caller who opened it or asked a fresh ticket, how to join it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue

from runplane.api.models import Timestamp, WireModel, timestamp
from runplane.domain.sessions import RelayEndpoint, Session, SessionKind, SessionState
from runplane.domain.wire import Extensible

_TICKET = "r-4f9c2a7be0d14d3aa1c05e21.0.1a2b3c4d.hS0c6m1Zq0yH2vQmXo3Jr9bLw4kTtA7uE5nD8pGfYiC"
_EXAMPLE: dict[str, JsonValue] = {
    "id": "r-4f9c2a7be0d14d3aa1c05e21.0.1a2b3c4d",
    "run_id": "r-4f9c2a7be0d14d3aa1c05e21",
    "kind": "exec",
    "state": "ended",
    "command": ["sh", "-c", "echo hi; exit 3"],
    "tty": False,
    "stdin": True,
    "port": None,
    "created_at": "2026-11-23T09:30:00.125Z",
    "expires_at": "2026-11-23T09:31:00.125Z",
    "ended_at": "2026-11-23T09:30:02.500Z",
    "exit_code": 3,
    "end_reason": "exited",
}


class SessionView(WireModel):
    """A session into a run (exec, shell, port-forward or attach) as every answer shows it: never its ticket,
    nor anything a ticket could be made from."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [_EXAMPLE]})

    id: str = Field(description="the session's id: the run's, its slot and 8 hex digits")
    run_id: str
    kind: Annotated[SessionKind, Extensible]
    state: Annotated[SessionState, Extensible] = Field(
        description="requested (no worker took it yet), accepted, active (both sides joined), ended, expired (no "
        "worker took it in time) or refused"
    )
    command: list[str] | None = Field(description="exec: the command; else null")
    tty: bool
    stdin: bool
    port: int | None = Field(description="port_forward: the run's port; else null")
    created_at: Timestamp
    expires_at: Timestamp = Field(
        description="a requested session no worker took by then expires; the client's ticket is not taken after it"
    )
    ended_at: Timestamp | None
    exit_code: int | None = Field(description="exec, shell, attach: the command's exit code, once it exited")
    end_reason: str | None = Field(
        description="why it ended: exited, client_gone, closed, run_ended, worker_lost, relay_lost"
    )


class RelayView(WireModel):
    """Where the client side of a session dials: a WebSocket URL and the headers to send with it."""

    url: str = Field(description="ws:// or wss://")
    headers: dict[str, str] = Field(description="to send with the WebSocket's opening request (the ticket)")
    max_frame: int = Field(description="the most payload bytes one frame may carry")
    encoding: Literal["binary", "base64"] = Field(
        default="binary",
        description="how a frame travels: a binary message of its bytes, or a text message of their "
        "base64 (relays that refuse binary messages)",
    )


class SessionAccess(SessionView):
    """A session with what its client joins it with: the relay, and a ticket for it. Only the answers
    of ``POST .../sessions`` and ``POST .../sessions/{session_id}/ticket`` hold a ticket; it is not
    stored anywhere (the store keeps its hash) and cannot be asked for again, only replaced."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    **_EXAMPLE,
                    "state": "requested",
                    "ended_at": None,
                    "exit_code": None,
                    "end_reason": None,
                    "relay": {
                        "url": "ws://127.0.0.1:8080/v1/relay",
                        "headers": {"Authorization": f"Bearer {_TICKET}"},
                        "max_frame": 65536,
                        "encoding": "binary",
                    },
                    "ticket": _TICKET,
                }
            ]
        },
    )

    relay: RelayView
    ticket: str = Field(description="the client's ticket: the session's id and a secret; good until expires_at")


class SessionList(WireModel):
    """``GET /v1/runs/{run_id}/sessions``: the run's sessions, live and over, by slot (a slot keeps the
    last session it held)."""

    sessions: list[SessionView]


def session_view(session: Session) -> SessionView:
    return SessionView(
        id=session.id,
        run_id=session.run_id,
        kind=session.kind,
        state=session.state,
        command=session.command,
        tty=session.tty,
        stdin=session.stdin,
        port=session.port,
        created_at=timestamp(session.created_at),
        expires_at=timestamp(session.expires_at),
        ended_at=timestamp(session.ended_at),
        exit_code=session.exit_code,
        end_reason=session.end_reason,
    )


def session_access(session: Session, ticket: str, endpoint: RelayEndpoint) -> SessionAccess:
    relay = RelayView(
        url=endpoint.url, headers=dict(endpoint.headers), max_frame=endpoint.max_frame, encoding=endpoint.encoding
    )
    return SessionAccess(**session_view(session).model_dump(), relay=relay, ticket=ticket)
