"""The sessions calls of ``Client`` and ``AsyncClient`` (open, list, renew a ticket, close): the API's
side only; joining a session through its relay is ``runplane.client.sessions``'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from runplane.api.session_models import SessionAccess, SessionView
from runplane.client._core import Plan
from runplane.client._plans import Plans
from runplane.domain.sessions import SessionKind

T = TypeVar("T")


class SessionCalls:
    """``Client``'s sessions calls."""

    _plans: Plans

    if TYPE_CHECKING:

        def _drive(self, plan: Plan[T]) -> T: ...

    def open_session(
        self,
        run_id: str,
        kind: SessionKind | str,
        *,
        command: Sequence[str] | None = None,
        tty: bool | None = None,
        stdin: bool | None = None,
        term: str | None = None,
        rows: int | None = None,
        cols: int | None = None,
        port: int | None = None,
    ) -> SessionAccess:
        """Open a session into your running run: ``exec`` (``command``, a list of arguments),
        ``shell`` (the image's shell; ``tty`` and ``stdin`` by default), ``port_forward``
        (``port``, inside the run) or ``attach`` (an interactive run's own command, with the run's
        ``tty``; one at a time). The answer holds the relay to dial and the ticket to dial it
        with (shown once; ``session_ticket`` gives a fresh one). Raises NotFound (no such run, or
        another user's), Conflict (the run is not running; attach: not interactive, or attached
        already), InvalidRequest (422: the pool does not allow sessions, every slot is taken,
        the stack has no relay, or the request does not fit its kind), PayloadTooLarge (a command
        over 64 KiB), TypeError (a command given as one string)."""
        fields = {"command": command, "tty": tty, "stdin": stdin, "term": term, "rows": rows, "cols": cols}
        return self._drive(self._plans.open_session(run_id, kind, {**fields, "port": port}))

    def sessions(self, run_id: str) -> list[SessionView]:
        """Your run's sessions, live and over, by slot (never a ticket)."""
        return self._drive(self._plans.sessions(run_id))

    def session_ticket(self, run_id: str, session_id: str) -> SessionAccess:
        """A fresh ticket for a live session of your run (the last one stops working). Raises
        NotFound, Conflict (the session is over)."""
        return self._drive(self._plans.session_ticket(run_id, session_id))

    def close_session(self, run_id: str, session_id: str) -> SessionView:
        """Close a session of your run: both sides are hung up and what it ran is stopped; one
        already over is answered as it is. Raises NotFound."""
        return self._drive(self._plans.close_session(run_id, session_id))


class AsyncSessionCalls:
    """``AsyncClient``'s sessions calls: those of ``SessionCalls``, as coroutines."""

    _plans: Plans

    if TYPE_CHECKING:

        async def _drive(self, plan: Plan[T]) -> T: ...

    async def open_session(
        self,
        run_id: str,
        kind: SessionKind | str,
        *,
        command: Sequence[str] | None = None,
        tty: bool | None = None,
        stdin: bool | None = None,
        term: str | None = None,
        rows: int | None = None,
        cols: int | None = None,
        port: int | None = None,
    ) -> SessionAccess:
        """See ``Client.open_session``."""
        fields = {"command": command, "tty": tty, "stdin": stdin, "term": term, "rows": rows, "cols": cols}
        return await self._drive(self._plans.open_session(run_id, kind, {**fields, "port": port}))

    async def sessions(self, run_id: str) -> list[SessionView]:
        """See ``Client.sessions``."""
        return await self._drive(self._plans.sessions(run_id))

    async def session_ticket(self, run_id: str, session_id: str) -> SessionAccess:
        """See ``Client.session_ticket``."""
        return await self._drive(self._plans.session_ticket(run_id, session_id))

    async def close_session(self, run_id: str, session_id: str) -> SessionView:
        """See ``Client.close_session``."""
        return await self._drive(self._plans.close_session(run_id, session_id))
