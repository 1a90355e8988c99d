"""``AsyncRun`` and ``AsyncSweep``: ``Run`` and ``Sweep`` for ``AsyncClient``, their methods as
coroutines and async iterators."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runplane.api.checkpoint_models import CheckpointPage
from runplane.api.models import OutputFile, RunView, SweepView
from runplane.client._core import Progress, StateSeen
from runplane.client._forward import PortForward, loopback_listener, open_forward
from runplane.client._run import RunBase, SweepBase
from runplane.client.errors import ApiError
from runplane.client.sessions import Access, ExecResult, exec_captured, over_unless_running
from runplane.domain.states import RunState

_closing: set[asyncio.Task[Any]] = set()
"""Sessions being closed from the event loop's own thread (held until done)."""

if TYPE_CHECKING:
    from runplane.client._async import AsyncClient


class PlanResult:
    """Where ``AsyncClient._steps`` leaves its plan's return value (an async generator has none)."""

    value: Any = None


class AsyncRun(RunBase):
    """``Run`` for ``AsyncClient``: the same methods as coroutines; ``follow`` and
    ``follow_chunks`` are async iterators."""

    def __init__(self, client: AsyncClient, view: RunView, created: bool = False) -> None:
        super().__init__(view, created)
        self._client = client

    async def refresh(self, *, wait: float = 0) -> AsyncRun:
        plans = self._client._plans
        self.view = await self._client._drive(plans.changed(self.view, wait) if wait > 0 else plans.get(self.view.id))
        return self

    async def wait(self, timeout: float | None = None, poll: float = 0.5) -> AsyncRun:
        self.view = await self._client._drive(self._client._plans.wait(self.view.id, timeout, poll, self.view))
        return self

    async def logs(self, stream: str = "stdout", *, attempt: int | None = None) -> str:
        return await self._client._drive(self._client._plans.all_logs(self.view.id, stream, attempt))

    async def follow(self, streams: tuple[str, ...] = ("stdout",), *, poll: float = 0.5) -> AsyncIterator[str]:
        async for _, text in self.follow_chunks(streams, poll=poll):
            yield text

    async def follow_chunks(
        self,
        streams: tuple[str, ...] = ("stdout", "stderr"),
        *,
        on_state: Callable[[AsyncRun], None] | None = None,
        poll: float = 0.5,
    ) -> AsyncIterator[tuple[str, str]]:
        result = PlanResult()
        async for item in self._client._steps(self._client._plans.follow(self.view.id, tuple(streams), poll), result):
            if isinstance(item, StateSeen):
                self.view = item.view
                if on_state is not None:
                    on_state(self)
            else:
                yield item
        self.view = result.value

    async def kill(self) -> AsyncRun:
        self.view = (await self._client.kill(self.view.id)).view
        return self

    async def set_priority(self, priority: int) -> AsyncRun:
        self.view = (await self._client.set_priority(self.view.id, priority)).view
        return self

    async def keep(self, keep: bool = True) -> AsyncRun:
        self.view = (await self._client.keep(self.view.id, keep)).view
        return self

    def outputs(self, *, attempt: int | None = None) -> AsyncIterator[OutputFile]:
        return self._client.outputs(self.view.id, attempt=attempt)

    async def download(
        self, dest: Path | str = ".", *, force: bool = False, progress: Progress | None = None
    ) -> list[Path]:
        return await self._client._drive(self._client._plans.download(self.view.id, dest, force, progress))

    async def checkpoint_files(self) -> CheckpointPage:
        """See ``Run.checkpoint_files``."""
        return await self._client.checkpoint(self.view.id)

    async def download_checkpoint(
        self, dest: Path | str = ".", *, force: bool = False, progress: Progress | None = None
    ) -> list[Path]:
        """See ``Run.download_checkpoint``."""
        return await self._client._drive(self._client._plans.download_checkpoint(self.view.id, dest, force, progress))

    async def exec(self, command: Sequence[str], stdin: bytes | None = None) -> ExecResult:
        """``Run.exec``: the session's frames move on a thread, the event loop stays free."""
        answer = await self._client.open_session(self.view.id, "exec", command=list(command), stdin=stdin is not None)
        access = Access.read(answer)
        async with self._closed_unjoined(access):
            return await asyncio.to_thread(
                exec_captured, access, stdin, run_over=self._run_over(), renew=self._renew(access)
            )

    async def attach(self, stdin: bytes | None = None) -> ExecResult:
        """``Run.attach``: the session's frames move on a thread, the event loop stays free."""
        access = Access.read(await self._client.open_session(self.view.id, "attach"))
        async with self._closed_unjoined(access):
            return await asyncio.to_thread(
                exec_captured, access, stdin, run_over=self._run_over(), renew=self._renew(access)
            )

    async def port_forward(self, remote: int, local: int = 0) -> PortForward:
        """``Run.port_forward``: the forward runs on threads of its own; ``close()`` it (or use it
        with ``with``) when done."""
        listener = loopback_listener(local)
        try:
            answer = await self._client.open_session(self.view.id, "port_forward", port=remote)
        except BaseException:
            listener.close()
            raise
        access = Access.read(answer)
        async with self._closed_unjoined(access):
            return await asyncio.to_thread(
                open_forward,
                access,
                remote,
                listener,
                self._run_over(),
                renew=self._renew(access),
                leave=self._leave(access),
            )

    def _renew(self, access: Access) -> Callable[[], Access]:
        """``Run._renew``, asked from the link's thread: the call runs on this run's event loop."""
        loop = asyncio.get_running_loop()

        def renew() -> Access:
            call = self._client.session_ticket(self.view.id, access.session_id)
            return Access.read(asyncio.run_coroutine_threadsafe(call, loop).result(timeout=30))

        return renew

    def _leave(self, access: Access) -> Callable[[], None]:
        """Closes the session of ``access`` on this run's event loop: waited for from another thread,
        started (not waited for) from the loop's own."""
        loop = asyncio.get_running_loop()

        def leave() -> None:
            call = self._client.close_session(self.view.id, access.session_id)
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                _closing.add(task := loop.create_task(call))
                task.add_done_callback(_closing.discard)
            else:
                asyncio.run_coroutine_threadsafe(call, loop).result(timeout=30)

        return leave

    def _run_over(self) -> Callable[[], str | None]:
        """``Run._run_over``, asked from the session's thread: the read runs on this run's event loop."""
        loop = asyncio.get_running_loop()

        def state() -> str:
            return asyncio.run_coroutine_threadsafe(self._client.get(self.view.id), loop).result(timeout=30).state

        return over_unless_running(state)

    @contextlib.asynccontextmanager
    async def _closed_unjoined(self, access: Access) -> AsyncIterator[None]:
        """``Run._closed_unjoined``."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(ApiError, OSError):
                await self._client.close_session(self.view.id, access.session_id)
            raise


class AsyncSweep(SweepBase):
    """``Sweep`` for ``AsyncClient``."""

    def __init__(self, client: AsyncClient, view: SweepView, created: bool = False) -> None:
        super().__init__(view, created)
        self._client = client

    async def refresh(self) -> AsyncSweep:
        self.view = await self._client._drive(self._client._plans.sweep(self.view.id))
        return self

    async def wait(
        self,
        timeout: float | None = None,
        poll: float = 1.0,
        *,
        on_progress: Callable[[AsyncSweep], None] | None = None,
    ) -> AsyncSweep:
        result = PlanResult()
        async for view in self._client._steps(self._client._plans.wait_sweep(self.view.id, timeout, poll), result):
            self.view = view
            if on_progress is not None:
                on_progress(self)
        self.view = result.value
        return self

    async def kill(self) -> AsyncSweep:
        self.view = (await self._client.kill_sweep(self.view.id)).view
        return self

    async def retry(self) -> int:
        sweep, count = await self._client.retry_sweep(self.view.id)
        self.view = sweep.view
        return count

    async def set_max_parallel(self, max_parallel: int | None) -> AsyncSweep:
        self.view = (await self._client.set_max_parallel(self.view.id, max_parallel)).view
        return self

    def members(self, *, state: RunState | str | None = None) -> AsyncIterator[AsyncRun]:
        return self._client.members(self.view.id, state=state)
