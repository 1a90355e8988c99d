"""``AsyncClient`` and ``AsyncRun``: the asyncio flavour of ``Client`` and ``Run``, with the same
names and behaviour (coroutines, and async iterators where those yield). Every decision lives in
``_core``; this file only sends requests, sleeps and writes files."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from runplane.api.checkpoint_models import CheckpointPage
from runplane.api.models import LogPage, OutputFile, PoolView, RunPage, WorkerView
from runplane.api.tenancy_models import Me, QuotaView, SecretView, Token, TokenCreated, UsageReport, UserView
from runplane.client._async_run import AsyncRun, AsyncSweep, PlanResult
from runplane.client._core import (
    USER_AGENT,
    Dropped,
    Emit,
    Exchange,
    Fetch,
    Pause,
    Plan,
    Progress,
    RawResponse,
    Send,
    dropped,
)
from runplane.client._files import PartFile
from runplane.client._options import RunOptions, run_body
from runplane.client._pack import Packed, pack
from runplane.client._plans import Plans
from runplane.client._session_calls import AsyncSessionCalls
from runplane.client._uploads import Upload, check_put, counted, put_args, start, uploaded, with_uploads
from runplane.client.errors import DownloadFailed, UploadFailed
from runplane.domain.states import RunState
from runplane.domain.uploads import DEFAULT_MAX_UPLOAD_BYTES

T = TypeVar("T")


class AsyncClient(AsyncSessionCalls):
    """The asyncio client of the runplane API: ``Client``'s settings, methods and errors, as
    coroutines. ``sleep`` replaces ``asyncio.sleep`` (tests). Use it as an async context manager,
    or ``await close()``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        profile: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] | None = None,
    ) -> None:
        self._plans = Plans(url, token, profile, timeout=timeout, retries=retries, random=random)
        self.url: str = self._plans.url
        self.token: str | None = self._plans.token
        self.profile: str | None = self._plans.profile
        self._sleep = sleep or asyncio.sleep
        self._http = httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False)

    def __repr__(self) -> str:
        return f"AsyncClient(url={self.url!r}, profile={self.profile!r})"

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    # --- the driver: performs a plan's steps ----------------------------------------------

    async def _steps(self, plan: Plan[Any], result: PlanResult | None = None) -> AsyncIterator[Any]:
        """Perform ``plan``'s steps, yielding what it emits; its return value goes to ``result``."""
        reply: Any = None
        try:
            while True:
                try:
                    step = plan.send(reply)
                except StopIteration as stop:
                    if result is not None:
                        result.value = stop.value
                    return
                reply = None
                if isinstance(step, Emit):
                    yield step.item
                elif isinstance(step, Send):
                    reply = await self._exchange(step)
                elif isinstance(step, Pause):
                    await self._sleep(step.seconds)
                else:
                    await self._fetch(step)
        finally:
            plan.close()

    async def _drive(self, plan: Plan[T]) -> T:
        """Perform a plan that emits nothing; return what it returns."""
        result = PlanResult()
        async for item in self._steps(plan, result):
            raise TypeError(f"a plan run for its value emitted {item!r}")
        return result.value  # type: ignore[no-any-return]

    async def _exchange(self, step: Send) -> Exchange | Dropped:
        try:
            r = await self._http.request(**self._plans.http_args(step.request))
        except httpx.TransportError as e:
            return dropped(self.url, e, *self._plans.url_from)
        return Exchange(r.status_code, r.headers, r.content)

    async def _fetch(self, step: Fetch) -> None:
        sink = PartFile(step)
        try:
            headers = {"User-Agent": USER_AGENT}
            async with self._http.stream("GET", step.url, headers=headers, follow_redirects=True) as r:
                sink.start(r.status_code, r.headers)
                async for chunk in r.aiter_raw(1 << 20):
                    sink.write(chunk)
            sink.finish()
        except (httpx.HTTPError, OSError, DownloadFailed) as e:
            raise sink.fail(e) from None

    # --- the raw escape hatch ---------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """See ``Client.request``."""
        return (await self.request_with_status(method, path, body, query, headers)).body

    async def request_with_status(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> RawResponse:
        """See ``Client.request_with_status``."""
        return await self._drive(self._plans.raw(method, path, body, query, headers))

    # --- runs -------------------------------------------------------------------------------

    async def upload(
        self, directory: str | Path, *, progress: Progress | None = None, max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    ) -> Upload:
        """See ``Client.upload`` (the directory is packed in a thread)."""
        with await asyncio.to_thread(pack, directory, max_bytes) as packed:
            view = await self._drive(start(self._plans, packed))
            if not view.present:
                url, headers = put_args(self._plans, view)
                try:
                    r = await self._http.put(url, content=_chunks(packed, progress), headers=headers)
                except httpx.HTTPError as e:
                    raise UploadFailed(0, "upload_failed", f"upload of {packed.directory} failed: {e}") from None
                check_put(packed, r.status_code)
            return uploaded(packed, view)

    async def _with_uploads(self, options: RunOptions, uploads: Mapping[str, str | Path] | None) -> RunOptions:
        if not uploads:
            return options
        return with_uploads(options, {name: (await self.upload(d)).source for name, d in uploads.items()})

    async def submit(
        self,
        command: str,
        *,
        idempotency_key: str | None = None,
        uploads: Mapping[str, str | Path] | None = None,
        **options: Unpack[RunOptions],
    ) -> AsyncRun:
        """See ``Client.submit`` (``after``, ``after_sweep``: what it waits for; ``uploads``)."""
        options = await self._with_uploads(options, uploads)
        view, created = await self._drive(self._plans.submit(command, options, idempotency_key))
        return AsyncRun(self, view, created)

    async def submit_sweep(
        self,
        command: str,
        *,
        parameters: Mapping[str, Sequence[Any]] | None = None,
        count: int | None = None,
        max_parallel: int | None = None,
        sweep_name: str | None = None,
        idempotency_key: str | None = None,
        uploads: Mapping[str, str | Path] | None = None,
        **run: Unpack[RunOptions],
    ) -> AsyncSweep:
        """See ``Client.submit_sweep``."""
        plan = self._plans.create_sweep(
            run_body(command, await self._with_uploads(run, uploads)),
            parameters=parameters,
            count=count,
            max_parallel=max_parallel,
            name=sweep_name,
            idempotency_key=idempotency_key,
        )
        view, created = await self._drive(plan)
        return AsyncSweep(self, view, created)

    async def sweep(self, sweep_id: str) -> AsyncSweep:
        return AsyncSweep(self, await self._drive(self._plans.sweep(sweep_id)))

    async def sweeps(self, *, owner: str | None = None, limit: int | None = None) -> AsyncIterator[AsyncSweep]:
        async for view in self._steps(self._plans.sweeps(owner, limit)):
            yield AsyncSweep(self, view)

    async def kill_sweep(self, sweep_id: str) -> AsyncSweep:
        return AsyncSweep(self, await self._drive(self._plans.kill_sweep(sweep_id)))

    async def retry_sweep(self, sweep_id: str) -> tuple[AsyncSweep, int]:
        answer = await self._drive(self._plans.retry_sweep(sweep_id))
        return AsyncSweep(self, answer), answer.retried

    async def set_max_parallel(self, sweep_id: str, max_parallel: int | None) -> AsyncSweep:
        return AsyncSweep(self, await self._drive(self._plans.set_max_parallel(sweep_id, max_parallel)))

    async def members(
        self, sweep_id: str, *, state: RunState | str | None = None, page_size: int = 100
    ) -> AsyncIterator[AsyncRun]:
        async for view in self._steps(self._plans.members(sweep_id, state, page_size)):
            yield AsyncRun(self, view)

    async def get(self, run_id: str) -> AsyncRun:
        return AsyncRun(self, await self._drive(self._plans.get(run_id)))

    async def runs(
        self,
        *,
        state: RunState | str | None = None,
        queue: str | None = None,
        owner: str | None = None,
        label: str | None = None,
        limit: int | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[AsyncRun]:
        """See ``Client.runs``."""
        async for view in self._steps(
            self._plans.runs({"state": state, "queue": queue, "owner": owner, "label": label}, limit, page_size)
        ):
            yield AsyncRun(self, view)

    async def runs_page(
        self,
        *,
        state: RunState | str | None = None,
        queue: str | None = None,
        owner: str | None = None,
        label: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> RunPage:
        return await self._drive(
            self._plans.runs_page({"state": state, "queue": queue, "owner": owner, "label": label}, limit, cursor)
        )

    async def kill(self, run_id: str) -> AsyncRun:
        return AsyncRun(self, await self._drive(self._plans.kill(run_id)))

    async def set_priority(self, run_id: str, priority: int) -> AsyncRun:
        """See ``Client.set_priority``."""
        return AsyncRun(self, await self._drive(self._plans.set_priority(run_id, priority)))

    async def keep(self, run_id: str, keep: bool = True) -> AsyncRun:
        """See ``Client.keep``."""
        return AsyncRun(self, await self._drive(self._plans.keep(run_id, keep)))

    async def logs(
        self, run_id: str, stream: str = "stdout", offset: int = 0, *, attempt: int | None = None
    ) -> LogPage:
        return await self._drive(self._plans.logs(run_id, stream, offset, attempt))

    async def outputs(self, run_id: str, *, attempt: int | None = None) -> AsyncIterator[OutputFile]:
        async for file in self._steps(self._plans.outputs(run_id, attempt)):
            yield file

    async def checkpoint(self, run_id: str) -> CheckpointPage:
        """See ``Client.checkpoint``."""
        return await self._drive(self._plans.checkpoint(run_id))

    async def download_file(self, url: str, dest: Path, *, progress: Progress | None = None) -> None:
        """See ``Client.download_file``."""
        done = 0

        def on_chunk(n: int, length: int | None) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, length)

        await self._fetch(Fetch(url, Path(dest), True, on_chunk))

    # --- pools, workers, tokens -------------------------------------------------------------

    async def pools(self) -> list[PoolView]:
        return await self._drive(self._plans.pools())

    async def workers(self, pool: str | None = None) -> list[WorkerView]:
        """Every worker (of ``pool``), read a page at a time."""
        return await self._drive(self._plans.workers(pool))

    async def me(self) -> Me:
        return await self._drive(self._plans.me())

    async def health(self) -> None:
        await self._drive(self._plans.health())

    async def tokens(self, user: str | None = None) -> list[Token]:
        return await self._drive(self._plans.tokens(user))

    async def create_token(
        self,
        user: str,
        *,
        groups: tuple[str, ...] | list[str] = (),
        scopes: list[str] | None = None,
        expires_in: str | float | None = None,
    ) -> TokenCreated:
        return await self._drive(self._plans.create_token(user, groups, scopes, expires_in))

    async def revoke_token(self, token_id: str) -> None:
        await self._drive(self._plans.revoke_token(token_id))

    async def user(self, user: str) -> UserView:
        """See ``Client.user``."""
        return await self._drive(self._plans.user(user))

    async def set_default_group(self, user: str, group: str | None) -> UserView:
        """See ``Client.set_default_group``."""
        return await self._drive(self._plans.set_default_group(user, group))

    # --- quotas -----------------------------------------------------------------------------

    async def quotas(self) -> list[QuotaView]:
        """See ``Client.quotas``."""
        return await self._drive(self._plans.quotas())

    async def quota(self, subject: str) -> QuotaView:
        """See ``Client.quota``."""
        return await self._drive(self._plans.quota(subject))

    async def set_quota(
        self,
        subject: str,
        *,
        max_running: int | None = None,
        max_gpus: int | None = None,
        max_cpus: float | None = None,
        gpu_hours: float | None = None,
        cpu_hours: float | None = None,
        period: str | None = None,
    ) -> QuotaView:
        """See ``Client.set_quota``."""
        limits = {
            "max_running": max_running,
            "max_gpus": max_gpus,
            "max_cpus": max_cpus,
            "gpu_hours": gpu_hours,
            "cpu_hours": cpu_hours,
            "period": period,
        }
        return await self._drive(self._plans.set_quota(subject, limits))

    async def delete_quota(self, subject: str) -> None:
        """See ``Client.delete_quota``."""
        await self._drive(self._plans.delete_quota(subject))

    # --- secrets ----------------------------------------------------------------------------

    async def set_secret(self, name: str, value: str, *, group: str | None = None) -> SecretView:
        """See ``Client.set_secret``."""
        return await self._drive(self._plans.set_secret(name, value, group))

    async def secrets(self, *, group: str | None = None) -> list[SecretView]:
        """See ``Client.secrets``."""
        return await self._drive(self._plans.secrets(group))

    async def delete_secret(self, name: str, *, group: str | None = None) -> None:
        """See ``Client.delete_secret``."""
        await self._drive(self._plans.delete_secret(name, group))

    # --- usage ------------------------------------------------------------------------------

    async def usage(
        self,
        *,
        user: str | None = None,
        group: str | None = None,
        pool: str | None = None,
        since: datetime | float | str | None = None,
        until: datetime | float | str | None = None,
        by: str = "user",
    ) -> UsageReport:
        """See ``Client.usage``."""
        filters = {"user": user, "group": group, "pool": pool, "since": since, "until": until, "by": by}
        return await self._drive(self._plans.usage(filters))


async def _chunks(packed: Packed, progress: Progress | None) -> AsyncIterator[bytes]:
    for chunk in counted(packed, progress):
        yield chunk
