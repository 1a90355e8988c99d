"""Sessions into live runs as their owners ask for them: open one (exec, shell, port-forward), list a
run's, give a fresh ticket, close one; and the reaper's expiry of those no worker took in time.

Only a run's owner opens, lists, renews or closes its sessions; an administrator too where the run's
pool has ``allow_admin_exec``. Anyone else, an administrator without it among them, is answered as
for a run that does not exist (404). A session is opened only into a running run, where its pool
has ``allow_exec`` and a slot is free (``max_sessions_per_run``: the store's create is conditional
on the slot, so the cap holds however many ask at once), on a stack with a relay. The client's
ticket is handed out once and never stored: the store keeps its hash (``domain.sessions``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from runplane.domain.errors import ConditionFailed, Conflict, InvalidRequest, NotAllowed, NotFound, PayloadTooLarge
from runplane.domain.expect import Expect
from runplane.domain.pools import Pool
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.sessions import (
    ATTACH_SLOT,
    DEFAULT_MAX_SESSIONS_PER_RUN,
    LIVE,
    MAX_COMMAND_BYTES,
    REQUEST_SECONDS,
    SESSION_ID_PATTERN,
    Asked,
    EndReason,
    RelayEndpoint,
    Session,
    SessionKind,
    SessionState,
    new_secret,
    run_of,
    session_id,
    ticket,
    with_relay,
)
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.ports import Ports, SessionRelay, SessionStore

RELAY_SETTINGS = (
    "this stack has none: on AWS the template's WebSocket API (RUNPLANE_RELAY_URL), "
    "on Azure a Web PubSub resource (RUNPLANE_WEBPUBSUB_CONNECTION_STRING)"
)
NO_RELAY = f"sessions need the stack's relay; {RELAY_SETTINGS}"
SHOWN_COMMAND = 120
"""The most characters of a command the run's timeline shows."""
EXPIRE_RUNS_PER_PASS = 500
"""The most runs whose sessions one reaper pass reads."""
_TRIES = 5


@dataclass(frozen=True)
class Opened:
    """A session and what its client joins it with: its ticket (shown once) and the relay's endpoint."""

    session: Session
    ticket: str
    endpoint: RelayEndpoint


def _pool_rules(pool: Pool | None) -> tuple[bool, bool, int]:
    """(allow_exec, allow_admin_exec, max_sessions_per_run) of ``pool``; a run's pool no longer
    configured has the defaults."""
    if pool is None:
        return True, False, DEFAULT_MAX_SESSIONS_PER_RUN
    return pool.allow_exec, pool.allow_admin_exec, pool.max_sessions_per_run


def _run(ports: Ports, principal: Principal, run_id: str) -> tuple[Run, Pool | None]:
    """The run whose sessions the caller may handle, and its pool. Raises NotFound, alike for a run
    that does not exist, another user's, and another user's asked by an administrator where the
    pool does not allow administrators' sessions."""
    run = ports.store.get(run_id)
    pool = ports.pools.get(run.queue)
    if run.owner != principal.user and not (principal.admin and _pool_rules(pool)[1]):
        raise NotFound(f"run {run_id} not found")
    return run, pool


def _stores(ports: Ports) -> tuple[SessionStore, SessionRelay]:
    if ports.sessions is None or ports.relay is None:
        raise NotAllowed(NO_RELAY)
    return ports.sessions, ports.relay


def _shown(asked: Asked) -> str:
    """What the run's timeline says of a session asked: the command (clipped), or the port."""
    if asked.command is not None:
        text = shlex.join(asked.command)
        return ": " + (text if len(text) <= SHOWN_COMMAND else text[: SHOWN_COMMAND - 3] + "...")
    return f": port {asked.port}" if asked.port is not None else ""


def _command_bytes(command: Sequence[str] | None) -> None:
    if command is None:
        return
    try:
        size = sum(len(arg.encode("utf-8")) for arg in command)
    except UnicodeEncodeError as e:
        raise InvalidRequest("command: not valid UTF-8 (a lone surrogate)") from e
    if size > MAX_COMMAND_BYTES:
        raise PayloadTooLarge(f"command: {size} bytes as UTF-8; a session's command holds at most {MAX_COMMAND_BYTES}")


def open_session(ports: Ports, principal: Principal, run_id: str, asked: Asked) -> Opened:
    """Open a session into the caller's running run: stored ``requested`` in the first free slot,
    then the run's ``sessions_asked`` bumped (its agent notices and takes it) with a timeline event.
    Raises NotFound (see ``_run``), Conflict (the run is not running), NotAllowed (the pool does not
    allow sessions, every slot is taken, or the stack has no relay), PayloadTooLarge (a command
    over MAX_COMMAND_BYTES)."""
    run, pool = _run(ports, principal, run_id)
    if run.state != RunState.RUNNING:
        raise Conflict(f"run {run.id} is not running ({run.state})")
    allowed, _, most = _pool_rules(pool)
    if not allowed:
        raise NotAllowed(f"run {run.id}'s pool {run.queue} does not allow sessions (allow_exec: false)")
    _command_bytes(asked.command)
    attach = asked.kind == SessionKind.ATTACH
    if attach and not run.spec.interactive:
        raise Conflict(f"run {run.id} is not interactive: it has no input to attach to (runplane exec or shell)")
    store, relay = _stores(ports)
    shell = asked.kind == SessionKind.SHELL
    tty = run.spec.tty if attach else asked.tty if asked.tty is not None else shell
    stdin = attach or (asked.stdin if asked.stdin is not None else shell)
    secret, digest = new_secret()
    now = ports.clock()
    session, endpoint = None, None
    for slot in _slots(run, most, attach):
        sid = session_id(run.id, slot)
        draft = Session(
            id=sid, run_id=run.id, slot=slot, attempt=run.attempt, owner=run.owner, asked_by=principal.user,
            kind=asked.kind, command=list(asked.command) if asked.command is not None and not attach else None,
            tty=tty, stdin=stdin, term=asked.term, rows=asked.rows, cols=asked.cols, port=asked.port, relay="",
            client_secret_hash=digest, created_at=now, expires_at=now + REQUEST_SECONDS,
        )  # fmt: skip
        endpoint = relay.endpoint(draft, ticket(sid, secret))
        session = _take_slot(store, with_relay(draft, endpoint, ticket(sid, secret)), run, now)
        if session is not None:
            break
    if (session is None or endpoint is None) and attach:
        raise Conflict(f"run {run.id} has an attach session already (one at a time): close it, or wait for it to end")
    if session is None or endpoint is None:
        raise NotAllowed(
            f"run {run.id} has {most} sessions open already, the most its pool allows (max_sessions_per_run)"
        )
    _count_asked(ports, run, session, f"{asked.kind.value.replace('_', '-')} asked by {principal.user}{_shown(asked)}")
    return Opened(session, ticket(session.id, secret), endpoint)


def _slots(run: Run, most: int, attach: bool) -> list[int]:
    """The slots a new session of ``run`` may take: an attach session ATTACH_SLOT alone (whatever
    ``max_sessions_per_run`` says: it is the run's own terminal), any other one of the first
    ``most`` but that one."""
    if attach:
        return [ATTACH_SLOT]
    return [slot for slot in range(most) if not (run.spec.interactive and slot == ATTACH_SLOT)]


def check_interactive(ports: Ports, pool: Pool, spec: RunSpec) -> None:
    """NotAllowed for an interactive run no one could attach to (a submit's check): on a stack
    without a relay, or in a pool that allows no sessions."""
    if not spec.interactive:
        return
    if ports.relay is None:
        raise NotAllowed(f"interactive runs need the stack's relay; {RELAY_SETTINGS}")
    if not pool.allow_exec:
        raise NotAllowed(f"pool {pool.name} allows no sessions (allow_exec: false), which an interactive run needs")


def _take_slot(store: SessionStore, session: Session, run: Run, now: float) -> Session | None:
    """``session`` stored in its slot; None when a live session holds the slot. One there that is
    over in truth is ended first (the reaper's work, done where it is in the way): a requested one
    past its ``expires_at``, one of another attempt of ``run`` (``_settle``)."""
    try:
        return store.create(session)
    except Conflict as e:
        held = e.details.get("session")
        if not isinstance(held, Session) or _settle(store, held, run, now) is None:
            return None
    try:
        return store.create(session)
    except Conflict:
        return None


def _count_asked(ports: Ports, run: Run, session: Session, message: str) -> None:
    """Bump ``run.sessions_asked`` while it runs the same attempt (what its agent watches), with an
    event. A run that stopped running meanwhile: the session is expired, and Conflict raised."""
    for _ in range(_TRIES):
        if run.state != RunState.RUNNING or run.attempt != session.attempt:
            break
        try:
            ports.store.update(
                run,
                Expect(states=frozenset({RunState.RUNNING}), attempt=session.attempt),
                {"sessions_asked": run.sessions_asked + 1},
                Event(at=ports.clock(), message=message),
            )
            return
        except ConditionFailed as e:
            run = e.details["run"]
    if ports.sessions is not None:
        _expire(ports.sessions, session, ports.clock(), asked_in_vain=True)
    if run.state == RunState.RUNNING and run.attempt == session.attempt:
        raise Conflict(f"run {run.id} changed too often; try again")
    raise Conflict(f"run {run.id} is not running ({run.state})")


def _expire(store: SessionStore, session: Session, now: float, *, asked_in_vain: bool = False) -> Session | None:
    """``session`` made ``expired`` if it is still ``requested`` and past its ``expires_at`` at
    ``now`` (or at once: ``asked_in_vain``, its run stopped running as it was asked); None when it
    is not (or no longer) so."""
    if session.state != SessionState.REQUESTED or (session.expires_at >= now and not asked_in_vain):
        return None
    ended = min(now, session.expires_at)
    try:
        return store.update(
            session, frozenset({SessionState.REQUESTED}), {"state": SessionState.EXPIRED, "ended_at": ended}
        )
    except (ConditionFailed, NotFound):
        return None


def _orphaned(session: Session, run: Run) -> EndReason | None:
    """Why live ``session`` is over though no worker said so: its run's command ended
    (``run_ended``), or the run is not running the session's attempt any more (``worker_lost``: the
    worker that held it lost the attempt, and no worker takes a session of another attempt); None
    while the attempt runs. A session is made only while its attempt runs, so one newer than what
    ``run`` says (an attempt to come, or the one being prepared) means ``run`` was read before it."""
    if session.state.over or session.run_id != run.id or session.attempt > run.attempt:
        return None
    if session.attempt < run.attempt:
        return EndReason.WORKER_LOST
    if run.state.terminal or run.state == RunState.UPLOADING:
        return EndReason.RUN_ENDED
    return EndReason.WORKER_LOST if run.state == RunState.QUEUED else None


def _settle(store: SessionStore, session: Session, run: Run, now: float) -> Session | None:
    """``session`` ended where it is over in truth: expired (``_expire``), or ended for the reason
    ``_orphaned`` gives; None when it is live (or changed meanwhile)."""
    reason = _orphaned(session, run)
    if reason is None:
        return _expire(store, session, now)
    changes = {"state": SessionState.ENDED, "end_reason": reason.value, "ended_at": now}
    try:
        return store.update(session, LIVE, changes)
    except (ConditionFailed, NotFound):
        return None


def list_sessions(ports: Ports, principal: Principal, run_id: str) -> list[Session]:
    """The run's sessions, live and over, by slot (those no worker took in time shown expired, those
    of an attempt that is over shown ended). Raises NotFound (see ``_run``)."""
    run, _ = _run(ports, principal, run_id)
    if ports.sessions is None:
        return []
    now = ports.clock()
    return [_settle(ports.sessions, s, run, now) or s for s in ports.sessions.for_run(run.id)]


def _session(ports: Ports, principal: Principal, run_id: str, sid: str) -> tuple[SessionStore, Session]:
    """The caller's run's session ``sid``. Raises NotFound (no such run or session, or one the
    caller may not handle)."""
    run, _ = _run(ports, principal, run_id)
    missing = NotFound(f"session {sid[:120]} not found")
    if ports.sessions is None or not re.fullmatch(SESSION_ID_PATTERN, sid) or run_of(sid)[0] != run.id:
        raise missing
    try:
        session = ports.sessions.get(sid)
    except NotFound:
        raise missing from None
    if session.run_id != run.id:
        raise missing
    return ports.sessions, session


def new_ticket(ports: Ports, principal: Principal, run_id: str, sid: str) -> Opened:
    """A fresh client ticket for a live session (the last one stops working), good for
    REQUEST_SECONDS. Raises NotFound (see ``_session``), Conflict (the session is over), NotAllowed
    (no relay), NotFound too for a caller who did not ask for the session (a live one's replay is its own)."""
    store, session = _session(ports, principal, run_id, sid)
    if session.asked_by != principal.user:
        raise NotFound(f"session {sid} not found")
    for _ in range(_TRIES):
        now = ports.clock()
        session = _expire(store, session, now) or session
        if session.state.over:
            raise Conflict(f"session {sid} is {session.state}: open another")
        relay = _stores(ports)[1]
        secret, digest = new_secret()
        try:
            session = store.update(session, LIVE, {"client_secret_hash": digest, "expires_at": now + REQUEST_SECONDS})
        except ConditionFailed as e:
            session = e.details["session"]
            continue
        text = ticket(session.id, secret)
        return Opened(session, text, relay.endpoint(session, text))
    raise Conflict(f"session {sid} changed too often; try again")


def close_session(ports: Ports, principal: Principal, run_id: str, sid: str) -> Session:
    """End a session (``closed``): both sides are hung up, and its worker stops what it ran. A
    session already over is answered as it is. Raises NotFound (see ``_session``)."""
    store, session = _session(ports, principal, run_id, sid)
    for _ in range(_TRIES):
        if session.state.over:
            return session
        try:
            session = store.update(
                session,
                LIVE,
                {"state": SessionState.ENDED, "end_reason": EndReason.CLOSED.value, "ended_at": ports.clock()},
            )
        except ConditionFailed as e:
            session = e.details["session"]
            continue
        if ports.relay is not None:
            ports.relay.close(session.id, EndReason.CLOSED.value)
        return session
    raise Conflict(f"session {sid} changed too often; try again")


def expire(ports: Ports, runs: Iterable[Run]) -> list[str]:
    """The reaper's part: the sessions of ``runs`` (at most EXPIRE_RUNS_PER_PASS of those asked any)
    that are over in truth ended: ``requested`` ones past their ``expires_at`` made ``expired``, live
    ones of an attempt that is over ``ended`` (``worker_lost``, ``run_ended``); their ids."""
    if ports.sessions is None:
        return []
    now, expired, read = ports.clock(), [], 0
    for run in runs:
        if run.sessions_asked <= 0:
            continue
        if read >= EXPIRE_RUNS_PER_PASS:
            break
        read += 1
        for session in ports.sessions.for_run(run.id):
            if _settle(ports.sessions, session, run, now) is not None:
                expired.append(session.id)
    return expired
