"""The sessions of one running run on this worker.

The run's ``sessions_asked`` grows with each session its owner asks for; the agent's look at the
run's control state hands every fresher copy of the run to ``observe``, and a change wakes the
host's one thread, which reads the run's sessions and takes each ``requested`` one of this attempt:
a conditional write (``requested`` -> ``accepted``, with the hash of a ticket secret made here, so
that no usable ticket is ever stored). Each taken session has a thread of its own, which dials the
relay, says HELLO, waits for the client's (``active`` then), runs the command or the port's
connections (exec.py, ports.py; each with one more thread for what goes to the client), and at the
end writes the session ``ended`` and the run's timeline (through the run's one writer). ``stop``
ends every session (GONE first, with the reason), when the run ends or its attempt is lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from runplane.client._link_order import Refused
from runplane.domain.errors import ConditionFailed, NotFound, RunplaneError
from runplane.domain.runs import Run
from runplane.domain.session_wire import PROTOCOL_VERSION, BadFrame, Frame, FrameType, json_frame
from runplane.domain.sessions import (
    LIVE,
    REQUEST_SECONDS,
    EndReason,
    Session,
    SessionKind,
    SessionState,
    new_secret,
    ticket,
    worker_endpoint,
)
from runplane.ports import Clock, SessionStore
from worker_agent.run_state import RunStateWriter
from worker_agent.sessions.attach import AttachSession, Input
from worker_agent.sessions.exec import ExecFailed, ExecSession, describe
from worker_agent.sessions.link import Link, RelayUnreachable, connection
from worker_agent.sessions.netns import dial
from worker_agent.sessions.ports import PortForward
from worker_agent.sessions.procs import Procs, can_see

log = logging.getLogger(__name__)

JOIN_SECONDS = 20.0
"""How long ending the sessions waits for each one's thread."""
NO_PID_NAMESPACE = "sessions are unavailable on this worker: its agent does not share the Docker engine's PID namespace"
_GONE = {
    "closed": EndReason.CLOSED,
    "client_gone": EndReason.CLIENT_GONE,
    "run_ended": EndReason.RUN_ENDED,
    "relay_lost": EndReason.RELAY_LOST,
}
"""What the session ends as, by the reason of the relay's GONE (any other: the client is gone)."""
_CHECKED = frozenset({EndReason.CLOSED, EndReason.RUN_ENDED})
"""The GONE reasons this worker can check for itself, and never takes on a frame's word: a relay
that passes frames on unread lets a client say them."""


def clock_time(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class SessionHost:
    """The sessions of the run ``state`` writes, in ``container`` (a docker Container, started).
    ``run_ending``: whether the run is to stop (its sessions then end with it, not as commands
    that exited)."""

    def __init__(
        self,
        sessions: SessionStore,
        state: RunStateWriter,
        api: Any,
        container: Any,
        worker_id: str,
        clock: Clock,
        procs: Procs | None = None,
        run_ending: Callable[[], bool] = lambda: False,
        given_input: Input | None = None,
    ) -> None:
        self.sessions, self.state, self.api, self.container = sessions, state, api, container
        self.worker_id, self.clock, self.run_ending = worker_id, clock, run_ending
        self.procs = procs or Procs()
        self.input = given_input or Input(clock)
        """An interactive run's input clock (its attach sessions touch it)."""
        self._asked = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping: str | None = None
        self._looker: threading.Thread | None = None
        self._live: dict[str, LiveSession] = {}
        self._pid: int | None = None

    @property
    def threads(self) -> list[threading.Thread]:
        """Every thread of this host still going (for a test: none once ``stop`` returned)."""
        with self._lock:
            found = [self._looker] if self._looker is not None else []
            for live in self._live.values():
                found += live.threads
        return [t for t in found if t is not None and t.is_alive()]

    def observe(self, run: Run) -> None:
        """Take in a fresher copy of the stored run: new sessions asked wake the host."""
        with self._lock:
            if self._stopping is not None or run.id != self.state.run.id or run.sessions_asked == self._asked:
                return
            self._asked = run.sessions_asked
            if self._looker is None:
                self._looker = threading.Thread(target=self._look_loop, name=f"sessions-{run.id}", daemon=True)
                self._looker.start()
        self._wake.set()

    def _look_loop(self) -> None:
        while self._wake.wait() and self._stopping is None:
            self._wake.clear()
            try:
                self.look()
            except RunplaneError as e:
                log.warning("run %s: its sessions could not be read: %s", self.state.run.id, e)
            except Exception:  # the next session asked is looked for all the same
                log.exception("run %s: looking at its sessions failed", self.state.run.id)

    def look(self) -> None:
        """Take the run's requested sessions of this attempt."""
        run = self.state.run
        for session in self.sessions.for_run(run.id):
            if self._stopping is not None:
                return
            if (
                session.state == SessionState.REQUESTED
                and session.run_id == run.id
                and session.attempt == run.attempt
                and session.id not in self._live
                and self.clock() <= session.expires_at
            ):
                self._take(session)

    def _container_pid(self) -> int:
        if self._pid is None:
            self.container.reload()
            self._pid = int((self.container.attrs.get("State") or {}).get("Pid") or 0)
        return self._pid

    def _take(self, session: Session) -> None:
        try:
            pid = self._container_pid()
        except Exception as e:  # the container went: the run is ending, its sessions with it
            log.info("run %s: no container for session %s: %s", session.run_id, session.id, e)
            # ended in the store, not left to wait: its client, polling the run, learns the rest
            self.write(
                session,
                frozenset({SessionState.REQUESTED}),
                state=SessionState.ENDED,
                end_reason=EndReason.RUN_ENDED,
                ended_at=self.clock(),
            )
            return
        if not can_see(self.procs, pid, self.container.id):
            self.write(
                session,
                frozenset({SessionState.REQUESTED}),
                state=SessionState.REFUSED,
                end_reason=NO_PID_NAMESPACE,
                ended_at=self.clock(),
            )
            return
        secret, hashed = new_secret()
        taken = self.write(
            session,
            frozenset({SessionState.REQUESTED}),
            state=SessionState.ACCEPTED,
            worker_id=self.worker_id,
            worker_secret_hash=hashed,
            accepted_at=self.clock(),
        )
        if taken is None:
            return
        live = LiveSession(self, taken, secret, pid)
        with self._lock:
            if self._stopping is not None:
                stopped = True
            else:
                stopped = False
                self._live[taken.id] = live
        if stopped:
            live.finish(EndReason.RUN_ENDED)
            return
        live.start()

    def write(self, session: Session, states: frozenset[SessionState], **changes: Any) -> Session | None:
        try:
            return self.sessions.update(session, states, changes)
        except (ConditionFailed, NotFound):
            return None  # closed or expired meanwhile
        except RunplaneError as e:
            log.warning("session %s: could not be written: %s", session.id, e)
            return None

    def done(self, session_id: str) -> None:
        """Forget an ended session (its threads end with it)."""
        with self._lock:
            self._live.pop(session_id, None)

    def note(self, message: str) -> None:
        try:
            self.state.note(self.clock(), message)
        except RunplaneError as e:  # the attempt is over: its timeline is no longer this worker's
            log.info("run %s: %s (not on its timeline: %s)", self.state.run.id, message, e)

    def stop(self, reason: EndReason = EndReason.RUN_ENDED) -> None:
        """End every session (GONE ``reason`` to each client first) and wait for all their threads."""
        with self._lock:
            if self._stopping is None:
                self._stopping = str(reason)
            looker, live = self._looker, list(self._live.values())
        self._wake.set()
        stopping = [threading.Thread(target=session.stop, args=(reason,), daemon=True) for session in live]
        for thread in stopping:  # at once: each may give its client a moment to take what it was sent
            thread.start()
        for thread in stopping:
            thread.join(JOIN_SECONDS)
        for session in live:
            session.join(JOIN_SECONDS)
        if looker is not None:
            looker.join(JOIN_SECONDS)


class LiveSession:
    """One taken session, on its own thread (``run``), ended by ``stop`` from any other."""

    def __init__(self, host: SessionHost, session: Session, secret: str, pid: int) -> None:
        self.host, self.session, self.secret, self.pid = host, session, secret, pid
        self.link: Link | None = None
        self.handler: ExecSession | PortForward | AttachSession | None = None
        self.thread = threading.Thread(target=self.run, name=f"session-{session.id}", daemon=True)
        self.began: float | None = None
        self._stopped: EndReason | None = None
        self._gone: str | None = None
        self._lock = threading.Lock()

    @property
    def threads(self) -> list[threading.Thread]:
        handler = self.handler
        output = getattr(handler, "_output", None)
        return [self.thread] + ([output] if output is not None else [])

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        if self.thread.ident is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("session %s: its thread did not end within %.0f s", self.session.id, timeout)

    def stop(self, reason: EndReason) -> None:
        with self._lock:
            if self._stopped is None:
                self._stopped = reason
            link, handler = self.link, self.handler
        if link is not None:
            with contextlib.suppress(ConnectionClosed):
                link.send(json_frame(FrameType.GONE, {"reason": str(reason)}))
            link.close()
        if handler is not None:
            handler.stop()

    def run(self) -> None:
        reason = EndReason.RELAY_LOST
        try:
            reason = self._serve()
        except Exception:  # a session's failure must still end it, and never the run
            log.exception("session %s: failed", self.session.id)
        finally:
            with self._lock:
                link, handler = self.link, self.handler
                stopped = self._stopped
            if handler is not None:
                handler.stop()
            if link is not None:
                link.close()
            exit_code = handler.exit_code if handler is not None else None
            if exit_code is not None:
                reason = EndReason.EXITED
            elif stopped is not None:
                reason = stopped
            self.finish(reason, exit_code)
            self.host.done(self.session.id)

    def _serve(self) -> EndReason:
        session = self.session
        try:
            link = Link.dial(worker_endpoint(session, ticket(session.id, self.secret)), self._redial)
        except RelayUnreachable as e:
            log.warning("session %s: %s", session.id, e)
            return EndReason.RELAY_LOST
        with self._lock:
            self.link = link
            if self._stopped is not None:
                return self._stopped
        said: dict[str, object] = {"v": PROTOCOL_VERSION, "side": "worker"}
        if session.kind == SessionKind.ATTACH and self.host.input.ended:
            said["input"] = "ended"  # the command had its EOF: this attach gets its output only
        link.send(json_frame(FrameType.HELLO, said))
        hello = self._client_hello(link)
        if hello is None:
            return self._ended_by(link)
        active = self.host.write(session, frozenset({SessionState.ACCEPTED}), state=SessionState.ACTIVE)
        if active is None:  # closed meanwhile
            return EndReason.CLOSED
        self.began = self.host.clock()
        rows, cols = _size(hello, session)
        with self._lock:
            if self._stopped is not None:
                return self._stopped
            self.handler = handler = self._handler(link)
        try:
            handler.start(rows, cols)
        except ExecFailed as e:
            link.send(json_frame(FrameType.EXIT, {"code": 127, "reason": str(e)[:500]}))
            return EndReason.EXITED
        while (frame := link.recv()) is not None:
            if frame.type == FrameType.GONE:
                self._gone = _reason(frame)
                break
            handler.on_frame(frame)
        return self._ended_by(link)

    def _redial(self) -> ClientConnection:
        """The link's connection again, after a drop: with a new ticket, its hash written into the
        session while it is live (it is this worker's: it took it). Raises Refused once it is over."""
        secret, hashed = new_secret()
        try:
            live = self.host.sessions.update(
                self.session, frozenset({SessionState.ACCEPTED, SessionState.ACTIVE}), {"worker_secret_hash": hashed}
            )
        except (ConditionFailed, NotFound):
            raise Refused("the session is over") from None
        return connection(worker_endpoint(live, ticket(live.id, secret)))

    def _handler(self, link: Link) -> ExecSession | PortForward | AttachSession:
        host = self.host
        if self.session.kind == SessionKind.ATTACH:
            return AttachSession(host.api, host.container, self.session, link, host.input, host.run_ending)
        if self.session.kind == SessionKind.PORT_FORWARD:
            return PortForward(self.session, link, partial(dial, self.pid, host.container.id, procs=host.procs))
        return ExecSession(host.api, host.container, self.session, link, host.procs, host.run_ending)

    def _client_hello(self, link: Link) -> Frame | None:
        until = link.clock() + REQUEST_SECONDS
        while (frame := link.recv(until)) is not None:
            if frame.type == FrameType.HELLO:
                return frame
            if frame.type == FrameType.GONE:
                self._gone = _reason(frame)
                return None
        return None

    def _ended_by(self, link: Link) -> EndReason:
        if self._gone is None:
            return EndReason.RELAY_LOST
        stored: Session | None = None
        if _GONE.get(self._gone) in _CHECKED:
            try:
                stored = self.host.sessions.get(self.session.id)
            except RunplaneError as e:
                log.info("session %s: could not be read to check its end: %s", self.session.id, e)
        return ended_by(self._gone, self.host.run_ending(), stored)

    def finish(self, reason: EndReason, exit_code: int | None = None) -> None:
        """Write the session's end and the run's timeline."""
        host, session, link = self.host, self.session, self.link
        now = host.clock()
        changes: dict[str, Any] = {"state": SessionState.ENDED, "end_reason": str(reason), "ended_at": now}
        if exit_code is not None:
            changes["exit_code"] = exit_code
        if link is not None:
            changes.update(bytes_in=link.bytes_in, bytes_out=link.bytes_out)
        host.write(session, LIVE, **changes)
        host.note(self.summary(reason, exit_code, now))

    def summary(self, reason: EndReason, exit_code: int | None, now: float) -> str:
        session = self.session
        took = clock_time(now - self.began) if self.began is not None else "00:00:00"
        ending = f"exit {exit_code}" if exit_code is not None else str(reason)
        if session.kind == SessionKind.PORT_FORWARD:
            opened = self.handler.opened if isinstance(self.handler, PortForward) else 0
            return f"port-forward by {session.asked_by}: port {session.port}, {took}, {opened} connections, {ending}"
        if session.kind == SessionKind.ATTACH:
            return f"attach by {session.asked_by}, {took}, {ending}"
        if session.kind == SessionKind.SHELL:
            return f"shell by {session.asked_by}, {took}, {ending}"
        return f"exec by {session.asked_by}: {describe(session)}, {took}, {ending}"


def ended_by(gone: str, run_ending: bool, stored: Session | None) -> EndReason:
    """What a session ends as when the relay said GONE ``gone``: ``run_ended`` only while the run is
    ending (``run_ending``) or its stored record says so, ``closed`` only when its stored record
    (``stored``: None when it could not be read) says so (the API writes it before it hangs up);
    any other reason, or one that does not hold: the client is gone."""
    reason = _GONE.get(gone, EndReason.CLIENT_GONE)
    if reason not in _CHECKED:
        return reason
    said = stored is not None and stored.state.over and stored.end_reason == reason.value
    if said or (reason == EndReason.RUN_ENDED and run_ending):
        return reason
    return EndReason.CLIENT_GONE


def _reason(frame: Frame) -> str:
    try:
        reason = frame.json().get("reason")
    except BadFrame:
        return ""
    return reason if isinstance(reason, str) else ""


def _size(hello: Frame, session: Session) -> tuple[int | None, int | None]:
    try:
        data = hello.json()
    except BadFrame:
        data = {}
    rows, cols = data.get("rows", session.rows), data.get("cols", session.cols)
    ok: Callable[[Any], bool] = lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1000  # noqa: E731
    return (rows if ok(rows) else session.rows), (cols if ok(cols) else session.cols)
