"""``Client`` and ``Run``: the blocking flavour. Every decision lives in ``_core``; this file only
sends requests, sleeps and writes files."""

from __future__ import annotations

import time as time_module
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx

from runplane.api.checkpoint_models import CheckpointPage
from runplane.api.models import LogPage, OutputFile, PoolView, RunPage, WorkerView
from runplane.api.tenancy_models import Me, QuotaView, SecretView, Token, TokenCreated, UsageReport, UserView
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
from runplane.client._pack import pack
from runplane.client._plans import Plans
from runplane.client._session_calls import SessionCalls
from runplane.client._sync_run import Run, Sweep
from runplane.client._uploads import Upload, check_put, counted, put_args, start, uploaded, with_uploads
from runplane.client.errors import DownloadFailed, UploadFailed
from runplane.domain.states import RunState
from runplane.domain.uploads import DEFAULT_MAX_UPLOAD_BYTES

T = TypeVar("T")


class Client(SessionCalls):
    """A blocking client of the runplane API.

    ``url`` and ``token`` each come from the first place that gives one: the argument,
    ``RUNPLANE_API_URL`` / ``RUNPLANE_TOKEN``, the profile (``profile``, ``RUNPLANE_PROFILE``, the
    config file's ``default_profile`` or "default"), ``~/.runplane/dev.json`` (a running
    ``runplane dev``); the URL defaults to ``http://127.0.0.1:8080``. Raises ValueError for a
    named profile that does not exist, a config file that cannot be parsed, or a URL that is not
    http(s).

    Every method raises an ``ApiError`` subclass for an answer that is not a success
    (``errors.py``). Requests that are safe to repeat are tried again, up to ``retries`` more
    times, after no answer, a 429 or a 5xx (``RetryPolicy``). ``sleep`` and ``random`` replace
    ``time.sleep`` and ``random.random`` (tests). Use it as a context manager, or ``close()`` it.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        profile: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
        random: Callable[[], float] | None = None,
    ) -> None:
        self._plans = Plans(url, token, profile, timeout=timeout, retries=retries, random=random)
        self.url: str = self._plans.url
        self.token: str | None = self._plans.token
        self.profile: str | None = self._plans.profile
        self._sleep = sleep or time_module.sleep
        self._http = httpx.Client(transport=transport, timeout=timeout, follow_redirects=False)

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}, profile={self.profile!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # --- the driver: performs a plan's steps ----------------------------------------------

    def _steps(self, plan: Plan[T]) -> Generator[Any, None, T]:
        """Perform ``plan``'s steps, yielding what it emits; returns what it returns."""
        reply: Any = None
        try:
            while True:
                try:
                    step = plan.send(reply)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                reply = None
                if isinstance(step, Emit):
                    yield step.item
                elif isinstance(step, Send):
                    reply = self._exchange(step)
                elif isinstance(step, Pause):
                    self._sleep(step.seconds)
                else:
                    self._fetch(step)
        finally:
            plan.close()

    def _drive(self, plan: Plan[T]) -> T:
        """Perform a plan that emits nothing; return what it returns."""
        steps = self._steps(plan)
        try:
            item = next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        steps.close()
        raise TypeError(f"a plan run for its value emitted {item!r}")

    def _exchange(self, step: Send) -> Exchange | Dropped:
        try:
            r = self._http.request(**self._plans.http_args(step.request))
        except httpx.TransportError as e:
            return dropped(self.url, e, *self._plans.url_from)
        return Exchange(r.status_code, r.headers, r.content)

    def _fetch(self, step: Fetch) -> None:
        sink = PartFile(step)
        try:
            with self._http.stream("GET", step.url, headers={"User-Agent": USER_AGENT}, follow_redirects=True) as r:
                sink.start(r.status_code, r.headers)
                for chunk in r.iter_raw(1 << 20):
                    sink.write(chunk)
            sink.finish()
        except (httpx.HTTPError, OSError, DownloadFailed) as e:
            raise sink.fail(e) from None

    # --- the raw escape hatch ---------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The parsed JSON body of a successful answer to ``method path`` (None when it has none);
        raises ApiError for any other. Query values that are None are left out."""
        return self.request_with_status(method, path, body, query, headers).body

    def request_with_status(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> RawResponse:
        """Like ``request``, with the answer's HTTP status kept."""
        return self._drive(self._plans.raw(method, path, body, query, headers))

    # --- runs -------------------------------------------------------------------------------

    def upload(
        self, directory: str | Path, *, progress: Progress | None = None, max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    ) -> Upload:
        """Pack ``directory`` (one gzip'd tar, the same bytes for the same content; what its
        ``.gitignore`` and ``.runplaneignore`` name left out) and send it, unless the stack holds it
        already (``sent`` False). A run names it as an input: ``inputs={"code": upload.source}``.
        ``progress`` is called with (bytes sent, bytes in all). Raises PackError for a directory
        that cannot be packed (a symlink out of it, over ``max_bytes``), PayloadTooLarge over the
        stack's limit, UploadFailed when the store refuses the bytes (docs/uploads.md)."""
        with pack(directory, max_bytes) as packed:
            view = self._drive(start(self._plans, packed))
            if not view.present:
                url, headers = put_args(self._plans, view)
                try:
                    r = self._http.put(url, content=counted(packed, progress), headers=headers)
                except httpx.HTTPError as e:
                    raise UploadFailed(0, "upload_failed", f"upload of {packed.directory} failed: {e}") from None
                check_put(packed, r.status_code)
            return uploaded(packed, view)

    def _with_uploads(self, options: RunOptions, uploads: Mapping[str, str | Path] | None) -> RunOptions:
        if not uploads:
            return options
        return with_uploads(options, {name: self.upload(d).source for name, d in uploads.items()})

    def submit(
        self,
        command: str,
        *,
        idempotency_key: str | None = None,
        uploads: Mapping[str, str | Path] | None = None,
        **options: Unpack[RunOptions],
    ) -> Run:
        """Submit ``command`` (run with ``sh -c``). ``cpus``..``time`` override ``resources``;
        sizes take "512m", "2g", durations "90s", "1h". Always sends an Idempotency-Key (a fresh
        one when none is given), so trying again after no answer makes no second run; with the
        same ``idempotency_key`` and request, the earlier run comes back with ``created`` False.
        ``group``: the group the run is charged to besides you (one of yours; default your only
        group, if you have exactly one). ``priority``: 0..100 (default 50), its place in its pool's
        line; above the pool's ``max_user_priority`` only for admins. Raises InvalidRequest for a
        request no pool can run, a group that is not yours or a run that alone exceeds a quota,
        Forbidden for a priority above what you may give, Conflict for a key used for a
        different request. ``retry``: when it goes again after failing, e.g. ``{"attempts": 3,
        "on": ["nonzero_exit"], "memory_factor": 2}`` (a ``RetryRule``; docs/workflows.md).
        ``after``: runs (or run ids) of yours it waits for, ``after_sweep``: a sweep (or its id)
        of yours: it stays queued, holding no worker, until each has succeeded, and ends failed
        (``dependency_failed``) if one does not; a ``run:<id>`` input waits the same way.
        ``uploads``: input name -> a local directory, each ``upload``ed and read-only at
        ``/inputs/NAME`` in the run (``workdir="/inputs/NAME"`` runs the command there)."""
        options = self._with_uploads(options, uploads)
        view, created = self._drive(self._plans.submit(command, options, idempotency_key))
        return Run(self, view, created)

    def submit_sweep(
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
    ) -> Sweep:
        """Make a sweep of ``command``: one run per combination of ``parameters`` values (each
        name is an environment variable of its runs), times ``count``; at most ``max_parallel``
        out at once. ``run`` takes what ``submit`` takes (``image``, ``gpus``, ``memory``,
        ``queue``, ``env``, ``retry``, ...). Members also get RUNPLANE_SWEEP_ID and
        RUNPLANE_SWEEP_INDEX. Raises InvalidRequest for more than 10,000 members or a template
        no pool can run (docs/workflows.md). ``uploads``: as for ``submit``, one upload each that
        every member reads."""
        plan = self._plans.create_sweep(
            run_body(command, self._with_uploads(run, uploads)),
            parameters=parameters,
            count=count,
            max_parallel=max_parallel,
            name=sweep_name,
            idempotency_key=idempotency_key,
        )
        view, created = self._drive(plan)
        return Sweep(self, view, created)

    def sweep(self, sweep_id: str) -> Sweep:
        """The sweep (NotFound for an unknown id or another user's)."""
        return Sweep(self, self._drive(self._plans.sweep(sweep_id)))

    def sweeps(self, *, owner: str | None = None, limit: int | None = None) -> Iterator[Sweep]:
        """Your sweeps (an admin: ``owner``'s), newest first, counted as last recorded."""
        for view in self._steps(self._plans.sweeps(owner, limit)):
            yield Sweep(self, view)

    def kill_sweep(self, sweep_id: str) -> Sweep:
        """End every unfinished member (Conflict once the sweep has finished)."""
        return Sweep(self, self._drive(self._plans.kill_sweep(sweep_id)))

    def retry_sweep(self, sweep_id: str) -> tuple[Sweep, int]:
        """Run again the members whose latest try failed, was killed or timed out; returns the
        sweep and how many go again."""
        answer = self._drive(self._plans.retry_sweep(sweep_id))
        return Sweep(self, answer), answer.retried

    def set_max_parallel(self, sweep_id: str, max_parallel: int | None) -> Sweep:
        """How many members may be out at once from now on (None: what the pool can run)."""
        return Sweep(self, self._drive(self._plans.set_max_parallel(sweep_id, max_parallel)))

    def members(self, sweep_id: str, *, state: RunState | str | None = None, page_size: int = 100) -> Iterator[Run]:
        """The sweep's member runs released so far (their latest tries), in index order."""
        for view in self._steps(self._plans.members(sweep_id, state, page_size)):
            yield Run(self, view)

    def get(self, run_id: str) -> Run:
        """The run (NotFound for an unknown id or another user's run)."""
        return Run(self, self._drive(self._plans.get(run_id)))

    def runs(
        self,
        *,
        state: RunState | str | None = None,
        queue: str | None = None,
        owner: str | None = None,
        label: str | None = None,
        limit: int | None = None,
        page_size: int = 100,
    ) -> Iterator[Run]:
        """Your runs (an admin: ``owner``'s), newest first, fetched ``page_size`` at a time (at
        most 500), ending after ``limit`` runs if given; ``label``: only those labelled so
        (``"key=value"``)."""
        for view in self._steps(
            self._plans.runs({"state": state, "queue": queue, "owner": owner, "label": label}, limit, page_size)
        ):
            yield Run(self, view)

    def runs_page(
        self,
        *,
        state: RunState | str | None = None,
        queue: str | None = None,
        owner: str | None = None,
        label: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> RunPage:
        """One page of runs; pass its ``next_cursor`` as ``cursor`` for the next."""
        return self._drive(
            self._plans.runs_page({"state": state, "queue": queue, "owner": owner, "label": label}, limit, cursor)
        )

    def kill(self, run_id: str) -> Run:
        """Kill the run: a queued one at once, a running one within seconds (Conflict if it has
        already ended)."""
        return Run(self, self._drive(self._plans.kill(run_id)))

    def set_priority(self, run_id: str, priority: int) -> Run:
        """Give a queued run ``priority`` (0..100): it moves in its pool's line at once. Raises
        Forbidden above the pool's ``max_user_priority`` (unless you are an admin), Conflict when
        the run is no longer queued, NotFound for an unknown id or another user's run,
        InvalidRequest for a number out of range."""
        return Run(self, self._drive(self._plans.set_priority(run_id, priority)))

    def keep(self, run_id: str, keep: bool = True) -> Run:
        """Keep the run (``keep=False``: let it go): while kept, its pool's retention deletes none of
        its outputs, logs or record; ``run.retention`` says until when each is kept. A run that has
        not ended may be kept. Raises NotFound for an unknown id or another user's run."""
        return Run(self, self._drive(self._plans.keep(run_id, keep)))

    def logs(self, run_id: str, stream: str = "stdout", offset: int = 0, *, attempt: int | None = None) -> LogPage:
        """One page of a log stream from byte ``offset``, of ``attempt`` (default: the latest)."""
        return self._drive(self._plans.logs(run_id, stream, offset, attempt))

    def outputs(self, run_id: str, *, attempt: int | None = None) -> Iterator[OutputFile]:
        """Every output file of the run (of ``attempt``; default the latest) with a download URL."""
        yield from self._steps(self._plans.outputs(run_id, attempt))

    def checkpoint(self, run_id: str) -> CheckpointPage:
        """The run's newest checkpoint (else the one it starts from) with every file's download URL.
        Raises NotFound (no such run, or no checkpoint yet)."""
        return self._drive(self._plans.checkpoint(run_id))

    def download_file(self, url: str, dest: Path, *, progress: Progress | None = None) -> None:
        """Stream ``url`` (an output's presigned URL) to ``dest`` through ``dest.part``, renamed
        when complete; ``progress(bytes_so_far, length_or_None)`` after each chunk. Raises
        DownloadFailed."""
        done = 0

        def on_chunk(n: int, length: int | None) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, length)

        self._fetch(Fetch(url, Path(dest), True, on_chunk))

    # --- pools, workers, tokens -------------------------------------------------------------

    def pools(self) -> list[PoolView]:
        return self._drive(self._plans.pools())

    def workers(self, pool: str | None = None) -> list[WorkerView]:
        """Every worker (of ``pool``), read a page at a time."""
        return self._drive(self._plans.workers(pool))

    def me(self) -> Me:
        """Who the token acts for."""
        return self._drive(self._plans.me())

    def health(self) -> None:
        """Returns when the API answers; raises ConnectionFailed or ServerError otherwise."""
        self._drive(self._plans.health())

    def tokens(self, user: str | None = None) -> list[Token]:
        """Tokens (of ``user``), never their secrets (admin)."""
        return self._drive(self._plans.tokens(user))

    def create_token(
        self,
        user: str,
        *,
        groups: tuple[str, ...] | list[str] = (),
        scopes: list[str] | None = None,
        expires_in: str | float | None = None,
    ) -> TokenCreated:
        """A token for ``user`` (admin); its secret (``.token``) is shown only in this answer.
        Tried again only after a 429 or 503 (nothing was made), never after a broken connection."""
        return self._drive(self._plans.create_token(user, groups, scopes, expires_in))

    def revoke_token(self, token_id: str) -> None:
        self._drive(self._plans.revoke_token(token_id))

    def user(self, user: str) -> UserView:
        """A user's groups (those of their tokens now) and default group (admin)."""
        return self._drive(self._plans.user(user))

    def set_default_group(self, user: str, group: str | None) -> UserView:
        """Charge ``user``'s runs and sweeps that name no group to ``group`` when their token
        carries several (admin); None: no default, they must name one."""
        return self._drive(self._plans.set_default_group(user, group))

    # --- quotas -----------------------------------------------------------------------------

    def quotas(self) -> list[QuotaView]:
        """Quotas with their use: every one (an admin), or those that apply to you (your own and
        your groups')."""
        return self._drive(self._plans.quotas())

    def quota(self, subject: str) -> QuotaView:
        """The quota of ``subject`` (a user, ``alice``, or a group, ``@vision``) with its use.
        NotFound when there is none, or when it is not yours to see."""
        return self._drive(self._plans.quota(subject))

    def set_quota(
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
        """Set the quota of ``subject`` (``alice`` or ``@vision``; admin). The limits given replace
        all it had: one left out does not apply. Budgets count per ``period`` (day, week or
        month, UTC; default month). Raises InvalidRequest for a limit that is not acceptable."""
        limits = {
            "max_running": max_running,
            "max_gpus": max_gpus,
            "max_cpus": max_cpus,
            "gpu_hours": gpu_hours,
            "cpu_hours": cpu_hours,
            "period": period,
        }
        return self._drive(self._plans.set_quota(subject, limits))

    def delete_quota(self, subject: str) -> None:
        """Remove the quota of ``subject`` (admin); NotFound when there is none."""
        self._drive(self._plans.delete_quota(subject))

    # --- secrets ----------------------------------------------------------------------------

    def set_secret(self, name: str, value: str, *, group: str | None = None) -> SecretView:
        """Store ``value`` as your secret ``name`` (runs name it ``name``), or as ``group``'s
        (admin; the group's members' runs name it ``group/name``), in place of any value it had:
        runs that start afterwards get the new one. The answer describes it, never holds the
        value, and no call ever reads a value back. Raises InvalidRequest (422) for a name or value
        the API refuses (empty, a NUL, more than 32,768 characters), PayloadTooLarge (413) for a
        value of at most 32,768 characters that is over 32 KiB as UTF-8 (text beyond ASCII takes 2
        to 4 bytes a character), TypeError for a value that is not text, ServerError (503) on a
        stack without a secrets store."""
        return self._drive(self._plans.set_secret(name, value, group))

    def secrets(self, *, group: str | None = None) -> list[SecretView]:
        """The secrets you may use, by scope then name: your own and those of your token's groups
        (names and sizes, never values); ``group``: that group's (admin)."""
        return self._drive(self._plans.secrets(group))

    def delete_secret(self, name: str, *, group: str | None = None) -> None:
        """Delete your secret ``name``, or ``group``'s (admin): runs that start afterwards and name
        it fail ``secret_unavailable``. NotFound when there is none."""
        self._drive(self._plans.delete_secret(name, group))

    # --- usage ------------------------------------------------------------------------------

    def usage(
        self,
        *,
        user: str | None = None,
        group: str | None = None,
        pool: str | None = None,
        since: datetime | float | str | None = None,
        until: datetime | float | str | None = None,
        by: str = "user",
    ) -> UsageReport:
        """What the runs submitted in ``[since, until)`` used (CPU- and GPU-seconds, cost), per
        ``by`` (``user``, ``group`` or ``pool``), with the totals. Yours only, unless you are an
        admin (another user's: Forbidden). ``since`` and ``until`` are datetimes (naive: UTC), Unix
        seconds or ISO 8601 strings; by default the month so far (UTC). Raises BadRequest for a
        moment the API cannot read, InvalidRequest for an unknown ``by`` or pool."""
        filters = {"user": user, "group": group, "pool": pool, "since": since, "until": until, "by": by}
        return self._drive(self._plans.usage(filters))
