"""Sessions into a running run of the caller's: open (exec, shell, port-forward), list, renew a
ticket, close. The bytes go through the stack's relay, never through these routes."""

from __future__ import annotations

from runplane.api.requests import SessionRequest
from runplane.api.routes.common import RUN_ID
from runplane.api.routes.examples import SESSION_EXAMPLES
from runplane.api.routing import Answer, Call, PathParam, operation
from runplane.api.session_models import SessionAccess, SessionList, SessionView, session_access, session_view
from runplane.domain import errors
from runplane.domain.sessions import SESSION_ID_PATTERN, Asked
from runplane.services import sessions

SESSION = {**RUN_ID, "session_id": PathParam(SESSION_ID_PATTERN, "session", "the session's id")}
_HIDDEN = "a run that does not exist, another user's (an admin's too, unless the run's pool has allow_admin_exec)"


@operation(
    "POST",
    "/v1/runs/{run_id}/sessions",
    operation_id="openSession",
    summary="Open a session into a running run of yours: a command (exec), the image's shell, or a port's "
    "connections; the answer's ticket joins it through the relay (shown once)",
    scope="runs:write",
    path_params=RUN_ID,
    body=SessionRequest,
    examples=SESSION_EXAMPLES,
    answers={201: Answer(SessionAccess, "requested: the run's worker takes it; join it with the ticket")},
    raises=(errors.NotFound, errors.Conflict, errors.NotAllowed, errors.PayloadTooLarge),
    valid_refusals={
        errors.NotFound: _HIDDEN,
        errors.Conflict: "the run is not running",
        errors.NotAllowed: "its pool does not allow sessions (allow_exec), every slot is taken "
        "(max_sessions_per_run), or the stack has no relay",
        errors.PayloadTooLarge: "a command of more bytes of UTF-8 in all than a session takes",
    },
)
def open_session(call: Call, run_id: str, body: SessionRequest) -> SessionAccess:
    opened = sessions.open_session(call.ports, call.principal, run_id, Asked(**body.model_dump()))
    return session_access(opened.session, opened.ticket, opened.endpoint)


@operation(
    "GET",
    "/v1/runs/{run_id}/sessions",
    operation_id="listSessions",
    summary="A run's sessions, live and over, by slot (never a ticket)",
    scope="runs:write",
    path_params=RUN_ID,
    answers={200: Answer(SessionList)},
    raises=(errors.NotFound,),
    valid_refusals={errors.NotFound: _HIDDEN},
)
def list_sessions(call: Call, run_id: str) -> SessionList:
    found = sessions.list_sessions(call.ports, call.principal, run_id)
    return SessionList(sessions=[session_view(s) for s in found])


@operation(
    "POST",
    "/v1/runs/{run_id}/sessions/{session_id}/ticket",
    operation_id="renewSessionTicket",
    summary="A fresh ticket for a live session of yours (to join it again); the last one stops working",
    scope="runs:write",
    path_params=SESSION,
    answers={200: Answer(SessionAccess, "the session, with its new ticket (shown once)")},
    raises=(errors.NotFound, errors.Conflict, errors.NotAllowed),
    valid_refusals={
        errors.NotFound: f"no such session of the run, or {_HIDDEN}",
        errors.Conflict: "the session is over",
        errors.NotAllowed: "the stack has no relay",
    },
)
def renew_ticket(call: Call, run_id: str, session_id: str) -> SessionAccess:
    opened = sessions.new_ticket(call.ports, call.principal, run_id, session_id)
    return session_access(opened.session, opened.ticket, opened.endpoint)


@operation(
    "DELETE",
    "/v1/runs/{run_id}/sessions/{session_id}",
    operation_id="closeSession",
    summary="Close a session of yours: both sides are hung up and what it ran is stopped (a session already "
    "over is answered as it is)",
    scope="runs:write",
    path_params=SESSION,
    answers={200: Answer(SessionView, "the session, ended (closed), or as it ended before")},
    raises=(errors.NotFound, errors.Conflict),
    valid_refusals={
        errors.NotFound: f"no such session of the run, or {_HIDDEN}",
        errors.Conflict: "it changed too often; try again",
    },
)
def close_session(call: Call, run_id: str, session_id: str) -> SessionView:
    return session_view(sessions.close_session(call.ports, call.principal, run_id, session_id))
