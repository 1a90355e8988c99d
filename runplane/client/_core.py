"""Everything the sync and async clients share, with no I/O: building requests, reading answers,
deciding retries, and each multi-request operation (pagination, wait, follow, download) as a
*plan*.

A plan is a generator of steps: ``Send`` (one HTTP exchange; the driver sends back an
``Exchange`` or a ``Dropped``), ``Pause`` (sleep), ``Fetch`` (stream a file to disk) and ``Emit``
(hand an item to the caller of an iterator). ``Client`` and ``AsyncClient`` each have one small
driver that performs these steps with blocking or asynchronous I/O, so every decision is written
once, here.
"""

from __future__ import annotations

import email.utils
import json
import math
import random as random_module
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from runplane import __version__
from runplane.api.models import (
    LogPage,
    Me,
    OutputFile,
    OutputPage,
    PoolList,
    PoolView,
    QuotaList,
    QuotaView,
    RunPage,
    RunView,
    SweepPage,
    SweepRetried,
    SweepView,
    Token,
    TokenCreated,
    TokenList,
    UsageReport,
    UserView,
    WorkerList,
    WorkerView,
)
from runplane.client.config import resolve
from runplane.client.errors import ApiError, ConnectionFailed, DownloadFailed, WaitTimeout, error_from_answer
from runplane.domain.runs import Resources, RetryRule
from runplane.domain.states import TERMINAL_STATES, RunState

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

USER_AGENT = f"runplane-sdk/{__version__}"
BACKOFF_BASE = 0.2
"""Seconds before the first retry (before jitter); doubled for each retry after it."""
BACKOFF_CAP = 5.0
"""The longest backoff between two tries (before jitter)."""
RETRY_AFTER_CAP = 30.0
"""The longest a server's Retry-After is obeyed for."""
MAX_RUNS_PAGE = 500
"""The most runs the API lists in one page."""
MAX_WORKERS_PAGE = 500
"""The most workers the API lists in one page."""
MAX_SWEEPS_PAGE = 100
LINE_HOLD = 64 * 1024
"""``follow`` holds back a partial line until it is this long, then hands it over as it is."""


# --- requests and answers -------------------------------------------------------------------


@dataclass(frozen=True)
class ApiRequest:
    """One API request as it is sent, every try alike (the same Idempotency-Key included)."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RawResponse:
    """A successful answer: its HTTP status (201 for a run made, 200 for one its
    ``Idempotency-Key`` found, ...) and its parsed JSON body (None when it has none)."""

    status: int
    body: Any


@dataclass(frozen=True)
class Exchange:
    """An answer as it came: status, headers and body bytes."""

    status: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True)
class Dropped:
    """No answer. ``sent``: the request may have reached the server (the connection broke after
    it was made), so repeating it may repeat its effect."""

    error: ConnectionFailed
    sent: bool


# --- plan steps -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    request: ApiRequest


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Fetch:
    """Stream ``url`` to ``dest`` through ``dest.part``. Unless ``force``, an existing ``dest``
    whose bytes differ is kept and DownloadFailed raised. ``on_chunk(n, length)`` is called with
    each chunk's size and the file's length (None when the answer does not say)."""

    url: str
    dest: Path
    force: bool
    on_chunk: Callable[[int, int | None], None] | None = None


@dataclass(frozen=True)
class Emit(Generic[T]):
    item: T


Step = Send | Pause | Fetch | Emit[Any]
Plan = Generator[Step, Any, T]
"""A plan: steps out, the driver's results in (an Exchange or Dropped for Send, None else)."""

Progress = Callable[[int, int | None], None]
"""Called with (bytes written so far, bytes expected in all or None when not known)."""


@dataclass(frozen=True)
class StateSeen:
    """What ``follow_chunks`` emits when it reads the run in a new state (not handed to callers:
    the driver updates the run and calls ``on_state``)."""

    view: RunView


def _quote(segment: str) -> str:
    """A path segment: a run id cannot walk to another route (``r-1/../x``)."""
    return quote(segment, safe="")


def query_params(query: Mapping[str, Any] | None) -> dict[str, str]:
    """Query values as strings; None values are dropped, booleans are ``true``/``false``."""
    out = {}
    for key, value in (query or {}).items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def dropped(url: str, error: httpx.TransportError) -> Dropped:
    """A transport error as ConnectionFailed. A request that never left (no connection could be
    made) is marked as not sent: repeating it is always safe."""
    unsent = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    if isinstance(error, httpx.TimeoutException):
        code, reason = "timeout", f"no answer in time ({type(error).__name__})"
    else:
        code, reason = "unreachable", str(error) or type(error).__name__
    message = (
        f"cannot reach {url}: {reason} (is `runplane dev` running? "
        "set RUNPLANE_API_URL and RUNPLANE_TOKEN, or use `runplane login`)"
    )
    return Dropped(ConnectionFailed(0, code, message), sent=not unsent)


def answer(exchange: Exchange) -> RawResponse:
    """A 2xx answer as a RawResponse; any other raises its ApiError (``error_from_answer``)."""
    if not 200 <= exchange.status < 300:
        raise error_from_answer(exchange.status, exchange.content)
    if not exchange.content.strip():
        return RawResponse(exchange.status, None)
    try:
        return RawResponse(exchange.status, json.loads(exchange.content))
    except ValueError:
        text = exchange.content[:200].decode("utf-8", errors="replace")
        raise ApiError(exchange.status, "invalid_response", f"HTTP {exchange.status}: not JSON: {text}") from None


def parse(model: type[M], response: RawResponse) -> M:
    """The body as ``model``; an answer of another shape raises ApiError (code invalid_response)."""
    try:
        return model.model_validate(response.body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        message = f"the API's answer is not a {model.__name__} ({where}: {first['msg']}); is the URL runplane's API?"
        raise ApiError(response.status, "invalid_response", message) from None


# --- retries --------------------------------------------------------------------------------

_RUN_PATH = "/v1/runs/"


def repeatable(request: ApiRequest) -> bool:
    """Whether sending ``request`` twice has the effect of sending it once: reads, deletes, a PUT
    (it stores the whole thing: a quota), a kill, a priority set (to a number, not by one) and a
    submit that carries an Idempotency-Key (the second finds the run the first made)."""
    method, path = request.method.upper(), request.path
    if method in ("GET", "HEAD", "OPTIONS", "DELETE", "PUT"):
        return True
    if method != "POST":
        return False
    if path == "/v1/runs":
        return any(k.lower() == "idempotency-key" for k in request.headers)
    return path.startswith(_RUN_PATH) and path.endswith(("/kill", "/priority")) and path.count("/") == 4


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a Retry-After header asks for (as seconds or an HTTP date), or None."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class RetryPolicy:
    """When to try a request again, and after how long.

    A request is tried again, at most ``retries`` times, after no answer (ConnectionFailed), a
    429, a 502/503/504, or a 500 to a GET, and only where that is safe: ``repeatable`` requests
    are; any other is tried again only when nothing can have been done (no connection was made,
    or the answer was 429 or 503, which the API gives before it acts). The wait is full-jitter
    exponential backoff (``random() * min(cap, base * 2**n)``), or the server's Retry-After
    (capped at 30 s) when it sends one.
    """

    retries: int = 4
    random: Callable[[], float] = random_module.random
    base: float = BACKOFF_BASE
    cap: float = BACKOFF_CAP

    def delay(self, request: ApiRequest, outcome: Exchange | Dropped, tried: int) -> float | None:
        """Seconds to wait before try number ``tried + 1``, or None: do not try again."""
        if tried > self.retries or not self._worth(request, outcome):
            return None
        if isinstance(outcome, Exchange):
            asked = retry_after(outcome.headers)
            if asked is not None:
                return min(asked, RETRY_AFTER_CAP)
        return self.random() * min(self.cap, self.base * 2.0 ** (tried - 1))

    @staticmethod
    def _worth(request: ApiRequest, outcome: Exchange | Dropped) -> bool:
        safe = repeatable(request)
        if isinstance(outcome, Dropped):
            return safe or not outcome.sent
        status = outcome.status
        if status in (429, 503):
            return True
        if status in (502, 504):
            return safe
        return status == 500 and request.method.upper() == "GET"


def send(policy: RetryPolicy, request: ApiRequest) -> Plan[RawResponse]:
    """Send ``request``, trying again as ``policy`` says; the successful answer, or the last
    failure's ApiError."""
    tried = 0
    while True:
        tried += 1
        outcome: Exchange | Dropped = yield Send(request)
        wait = policy.delay(request, outcome, tried)
        if wait is None:
            if isinstance(outcome, Dropped):
                raise outcome.error
            return answer(outcome)
        yield Pause(wait)


# --- the client's shared half ---------------------------------------------------------------


class Plans:
    """A client's settings, its requests and every plan; ``Client`` and ``AsyncClient`` each
    hold one and add the I/O."""

    def __init__(
        self,
        url: str | None,
        token: str | None,
        profile: str | None,
        *,
        timeout: float,
        retries: int,
        random: Callable[[], float] | None,
    ) -> None:
        found = resolve(url, token, profile)
        if found.token is not None and not (found.token.isascii() and found.token.isprintable()):
            raise ValueError("the token holds characters an HTTP header cannot carry")
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.url: str = found.url
        self.token: str | None = found.token
        self.profile: str | None = found.profile
        self.timeout = timeout
        self.retries = retries
        self._policy = RetryPolicy(retries) if random is None else RetryPolicy(retries, random)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, profile={self.profile!r})"

    # requests as httpx takes them

    def http_args(self, request: ApiRequest) -> dict[str, Any]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        content = None
        if request.body is not None:
            content = json.dumps(request.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        headers.update(request.headers)
        return {
            "method": request.method.upper(),
            "url": self.url + request.path,
            "params": dict(request.query) or None,
            "content": content,
            "headers": headers,
        }

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Plan[RawResponse]:
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path[:80]!r}")
        request = ApiRequest(method.upper(), path, query_params(query), body, dict(headers or {}))
        return send(self._policy, request)

    def _get(self, model: type[M], path: str, query: Mapping[str, Any] | None = None) -> Plan[M]:
        return parse(model, (yield from self.raw("GET", path, query=query)))

    # runs

    def submit(
        self,
        command: str,
        *,
        image: str | None,
        resources: Resources | Mapping[str, Any] | None,
        limits: Mapping[str, Any],
        queue: str | None,
        name: str | None,
        env: Mapping[str, str] | None,
        inputs: Mapping[str, str] | None,
        network: bool,
        tag: str | None,
        idempotency_key: str | None,
        group: str | None = None,
        priority: int | None = None,
        retry: RetryRule | Mapping[str, Any] | None = None,
        after: Sequence[Any] | None = None,
        after_sweep: Any = None,
    ) -> Plan[tuple[RunView, bool]]:
        """The run and whether it was made now (201) rather than found by its key (200)."""
        body = submit_body(command, image, resources, limits, queue, name, env, inputs, network, tag, group, priority)
        if retry is not None:
            body["retry"] = retry.model_dump(exclude_unset=True) if isinstance(retry, RetryRule) else dict(retry)
        add_waits(body, after, after_sweep)
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        response = yield from self.raw("POST", "/v1/runs", body, headers={"Idempotency-Key": key})
        return parse(RunView, response), response.status == 201

    def get(self, run_id: str) -> Plan[RunView]:
        return self._get(RunView, f"/v1/runs/{_quote(run_id)}")

    def kill(self, run_id: str) -> Plan[RunView]:
        return parse(RunView, (yield from self.raw("POST", f"/v1/runs/{_quote(run_id)}/kill")))

    def set_priority(self, run_id: str, priority: int) -> Plan[RunView]:
        body = {"priority": priority}
        return parse(RunView, (yield from self.raw("POST", f"/v1/runs/{_quote(run_id)}/priority", body)))

    def runs_page(
        self,
        state: RunState | str | None,
        queue: str | None,
        owner: str | None,
        limit: int | None,
        cursor: str | None,
    ) -> Plan[RunPage]:
        query = {"state": state, "queue": queue, "owner": owner, "limit": limit, "cursor": cursor}
        return self._get(RunPage, "/v1/runs", query)

    def runs(
        self, state: RunState | str | None, queue: str | None, owner: str | None, limit: int | None, page_size: int
    ) -> Plan[None]:
        """Emits RunViews, newest first, page after page, at most ``limit`` of them."""
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        page_size = min(page_size, MAX_RUNS_PAGE)
        cursor: str | None = None
        seen = 0
        while limit is None or seen < limit:
            want = page_size if limit is None else min(page_size, limit - seen)
            page = yield from self.runs_page(state, queue, owner, want, cursor)
            for view in page.runs[:want]:
                yield Emit(view)
                seen += 1
            if not page.next_cursor or not page.runs:
                return
            cursor = page.next_cursor

    # sweeps

    def create_sweep(
        self,
        run: Mapping[str, Any],
        *,
        parameters: Mapping[str, Sequence[Any]] | None,
        count: int | None,
        max_parallel: int | None,
        name: str | None,
        idempotency_key: str | None,
    ) -> Plan[tuple[SweepView, bool]]:
        """The sweep and whether it was made now (201) rather than found by its key (200)."""
        body: dict[str, Any] = {"run": dict(run)}
        if parameters:
            body["parameters"] = {k: list(v) for k, v in parameters.items()}
        optional = {"count": count, "max_parallel": max_parallel, "name": name}
        body.update({k: v for k, v in optional.items() if v is not None})
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        response = yield from self.raw("POST", "/v1/sweeps", body, headers={"Idempotency-Key": key})
        return parse(SweepView, response), response.status == 201

    def sweep(self, sweep_id: str) -> Plan[SweepView]:
        return self._get(SweepView, f"/v1/sweeps/{_quote(sweep_id)}")

    def sweeps(self, owner: str | None, limit: int | None) -> Plan[None]:
        """Emits SweepViews, newest first, at most ``limit`` of them."""
        cursor: str | None = None
        seen = 0
        while limit is None or seen < limit:
            query = {"owner": owner, "limit": MAX_SWEEPS_PAGE, "cursor": cursor}
            page = yield from self._get(SweepPage, "/v1/sweeps", query)
            for view in page.sweeps:
                if limit is not None and seen >= limit:
                    return
                yield Emit(view)
                seen += 1
            if not page.next_cursor or not page.sweeps:
                return
            cursor = page.next_cursor

    def kill_sweep(self, sweep_id: str) -> Plan[SweepView]:
        return parse(SweepView, (yield from self.raw("POST", f"/v1/sweeps/{_quote(sweep_id)}/kill")))

    def retry_sweep(self, sweep_id: str) -> Plan[SweepRetried]:
        return parse(SweepRetried, (yield from self.raw("POST", f"/v1/sweeps/{_quote(sweep_id)}/retry")))

    def set_max_parallel(self, sweep_id: str, most: int | None) -> Plan[SweepView]:
        body = {"max_parallel": most}
        return parse(SweepView, (yield from self.raw("PATCH", f"/v1/sweeps/{_quote(sweep_id)}", body)))

    def members(self, sweep_id: str, state: RunState | str | None, page_size: int) -> Plan[None]:
        """Emits the RunViews of a sweep's members released so far, in index order."""
        cursor: str | None = None
        while True:
            query = {"sweep": sweep_id, "state": state, "limit": min(page_size, MAX_RUNS_PAGE), "cursor": cursor}
            page = yield from self._get(RunPage, "/v1/runs", query)
            for view in page.runs:
                yield Emit(view)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def wait_sweep(self, sweep_id: str, timeout: float | None, poll: float) -> Plan[SweepView]:
        """Read the sweep until it has finished; emits each view read (for progress)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            view = yield from self.sweep(sweep_id)
            yield Emit(view)
            if view.finished_at is not None:
                return view
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(0, "wait_timeout", f"sweep {sweep_id} has not finished after {timeout:g}s")
            yield Pause(poll if left is None else min(poll, left))

    def logs(self, run_id: str, stream: str, offset: int, attempt: int | None = None) -> Plan[LogPage]:
        query = {"stream": stream, "offset": offset, "attempt": attempt}
        return self._get(LogPage, f"/v1/runs/{_quote(run_id)}/logs", query)

    def all_logs(self, run_id: str, stream: str, attempt: int | None = None) -> Plan[str]:
        """Everything ``stream`` (of ``attempt``; default the latest) holds so far."""
        parts, offset = [], 0
        while True:
            page = yield from self.logs(run_id, stream, offset, attempt)
            parts.append(page.data)
            if page.complete or page.next_offset == offset or not page.data:
                return "".join(parts)
            offset = page.next_offset

    def outputs(self, run_id: str, attempt: int | None = None) -> Plan[None]:
        """Emits every OutputFile of the run (of ``attempt``; default the latest), page after page."""
        cursor: str | None = None
        while True:
            query = {"cursor": cursor, "attempt": attempt}
            page = yield from self._get(OutputPage, f"/v1/runs/{_quote(run_id)}/outputs", query)
            for file in page.files:
                yield Emit(file)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def wait(self, run_id: str, timeout: float | None, poll: float) -> Plan[RunView]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            view = yield from self.get(run_id)
            if view.state in TERMINAL_STATES:
                return view
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(0, "wait_timeout", f"run {run_id} is still {view.state} after {timeout:g}s")
            yield Pause(poll if left is None else min(poll, left))

    def follow(self, run_id: str, streams: tuple[str, ...], poll: float) -> Plan[RunView]:
        """Emits ``StateSeen`` when the run's state (or why it waits) changes and ``(stream,
        text)`` as the streams grow: whole lines while the run goes, the rest once it has ended
        and every stream has been read to its end; returns the final view."""
        if not streams or any(s not in ("stdout", "stderr") for s in streams):
            raise ValueError("streams must name stdout and/or stderr")
        readers = {s: _StreamReader() for s in streams}
        last: tuple[Any, ...] | None = None
        attempt: int | None = None
        while True:
            view = yield from self.get(run_id)
            if _seen(view) != last:
                last = _seen(view)
                yield Emit(StateSeen(view))
            if attempt is not None and view.attempt != attempt:
                for stream, reader in readers.items():  # the end of the attempt that is over, then the next one's
                    yield from self._read_on(run_id, stream, reader, attempt, ended=True)
                    yield from _emit(stream, reader.restart())
            attempt = view.attempt
            for stream, reader in readers.items():  # this attempt's own logs, whatever came since the read
                yield from self._read_on(run_id, stream, reader, attempt, ended=view.state in TERMINAL_STATES)
            if all(r.complete for r in readers.values()):
                if view.state not in TERMINAL_STATES:  # complete: it ended, or goes again, since the read
                    view = yield from self.get(run_id)
                    if _seen(view) != last:
                        last = _seen(view)
                        yield Emit(StateSeen(view))
                if view.state in TERMINAL_STATES and view.attempt == attempt:
                    return view
            yield Pause(poll)

    def _read_on(self, run_id: str, stream: str, reader: _StreamReader, attempt: int, ended: bool) -> Plan[None]:
        """Read ``stream`` of ``attempt`` as far as it goes now. Before its first attempt a run has
        no logs: none are read (a read of the latest could meet the first attempt's, which are
        read from their start once the run shows it), and the stream is complete if it ``ended``."""
        if attempt == 0:
            reader.complete = ended
            return
        while not reader.complete:
            page = yield from self.logs(run_id, stream, reader.offset, attempt)
            yield from _emit(stream, reader.add(page))
            if not page.data:
                return

    def download(self, run_id: str, dest: Path | str, force: bool, progress: Progress | None) -> Plan[list[Path]]:
        """Every output file under ``dest``. Checks all of them before writing any: a path that
        leaves ``dest`` or an existing file of another size (unless ``force``) raises
        DownloadFailed and nothing is written."""
        root = Path(dest).resolve()
        files: list[OutputFile] = yield from collect(self.outputs(run_id))
        targets = [_target(root, f, force) for f in files]
        total = sum(f.size for f in files)
        done = 0

        def advance(n: int, _: int | None) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total)

        for file, target in zip(files, targets, strict=True):
            yield Fetch(file.url, target, force, advance)
        return targets

    # pools, workers, tokens

    def pools(self) -> Plan[list[PoolView]]:
        return (yield from self._get(PoolList, "/v1/pools")).pools

    def workers(self, pool: str | None) -> Plan[list[WorkerView]]:
        found: list[WorkerView] = []
        cursor: str | None = None
        while True:
            query = {"pool": pool, "limit": MAX_WORKERS_PAGE, "cursor": cursor}
            page = yield from self._get(WorkerList, "/v1/workers", query)
            found.extend(page.workers)
            if not page.next_cursor or not page.workers:
                return found
            cursor = page.next_cursor

    def me(self) -> Plan[Me]:
        return self._get(Me, "/v1/me")

    def health(self) -> Plan[None]:
        yield from self.raw("GET", "/v1/health")

    def tokens(self, user: str | None) -> Plan[list[Token]]:
        return (yield from self._get(TokenList, "/v1/tokens", {"user": user})).tokens

    def create_token(
        self, user: str, groups: tuple[str, ...] | list[str], scopes: list[str] | None, expires_in: str | float | None
    ) -> Plan[TokenCreated]:
        body: dict[str, Any] = {"user": user, "groups": list(groups)}
        if scopes is not None:
            body["scopes"] = list(scopes)
        if expires_in is not None:
            body["expires_in"] = expires_in
        return parse(TokenCreated, (yield from self.raw("POST", "/v1/tokens", body)))

    def revoke_token(self, token_id: str) -> Plan[None]:
        yield from self.raw("DELETE", f"/v1/tokens/{_quote(token_id)}")

    def user(self, user: str) -> Plan[UserView]:
        return self._get(UserView, f"/v1/users/{_quote(user)}")

    def set_default_group(self, user: str, group: str | None) -> Plan[UserView]:
        return parse(UserView, (yield from self.raw("PUT", f"/v1/users/{_quote(user)}", {"default_group": group})))

    # quotas

    def quotas(self) -> Plan[list[QuotaView]]:
        return (yield from self._get(QuotaList, "/v1/quotas")).quotas

    def quota(self, subject: str) -> Plan[QuotaView]:
        return self._get(QuotaView, quota_path(subject))

    def set_quota(self, subject: str, limits: Mapping[str, Any]) -> Plan[QuotaView]:
        """Raises ValueError for a limit that is not a finite number (JSON has no other)."""
        body = {k: v for k, v in limits.items() if v is not None}
        for key, value in body.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value}")
        return parse(QuotaView, (yield from self.raw("PUT", quota_path(subject), body)))

    def delete_quota(self, subject: str) -> Plan[None]:
        yield from self.raw("DELETE", quota_path(subject))

    # usage

    def usage(self, filters: Mapping[str, Any]) -> Plan[UsageReport]:
        """Raises ValueError for a moment that is not a datetime, a finite number or a string."""
        query = {k: moment(k, v) if k in ("since", "until") else v for k, v in filters.items()}
        return self._get(UsageReport, "/v1/usage", query)


def moment(name: str, value: datetime | float | str | None) -> str | None:
    """A moment as the API reads it: a datetime as ISO 8601 (a naive one is UTC), a number as
    Unix seconds, a string as it is (``2026-11-01``). Raises ValueError for anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value)
    raise ValueError(f"{name} must be a datetime, Unix seconds or an ISO 8601 string, got {value!r}")


def quota_path(subject: str) -> str:
    """Where the quota of ``subject`` is: ``alice`` is the user alice, ``@vision`` the group
    vision (a user name never starts with @). Raises ValueError for an empty one."""
    kind, name = ("groups", subject[1:]) if subject.startswith("@") else ("users", subject)
    if not name:
        raise ValueError(f"{subject!r} names no user or group: give a user (alice) or a group (@vision)")
    return f"/v1/quotas/{kind}/{_quote(name)}"


def submit_body(
    command: str,
    image: str | None,
    resources: Resources | Mapping[str, Any] | None,
    limits: Mapping[str, Any],
    queue: str | None,
    name: str | None,
    env: Mapping[str, str] | None,
    inputs: Mapping[str, str] | None,
    network: bool,
    tag: str | None,
    group: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The body of ``POST /v1/runs``: only what was given (the API fills in the pool's defaults and
    checks every value, so a bad one comes back as InvalidRequest)."""
    if isinstance(resources, Resources):
        wanted: dict[str, Any] = resources.model_dump(exclude_unset=True)
    else:
        wanted = dict(resources or {})
    wanted.update({k: v for k, v in limits.items() if v is not None})
    body: dict[str, Any] = {"command": command}
    optional = {"image": image, "queue": queue, "name": name, "tag": tag, "group": group, "priority": priority}
    body.update({k: v for k, v in optional.items() if v is not None})
    if wanted:
        body["resources"] = wanted
    if env:
        body["env"] = dict(env)
    if inputs:
        body["inputs"] = dict(inputs)
    if network:
        body["network"] = True
    return body


_RUN_OPTIONS = frozenset(
    {
        "image",
        "resources",
        "cpus",
        "gpus",
        "memory",
        "disk",
        "time",
        "queue",
        "name",
        "env",
        "inputs",
        "network",
        "tag",
        "group",
        "priority",
        "retry",
        "after",
        "after_sweep",
    }
)


def id_of(item: Any) -> str:
    """A run's or sweep's id: given as text, or as the object the SDK returned (``.id``)."""
    return item if isinstance(item, str) else str(item.id)


def add_waits(body: dict[str, Any], after: Sequence[Any] | None, after_sweep: Any) -> None:
    """Put ``after`` (runs, or their ids) and ``after_sweep`` (a sweep, or its id) in ``body``."""
    if after:
        if isinstance(after, str):
            raise TypeError("after takes a list of runs or run ids")
        body["after"] = [id_of(run) for run in after]
    if after_sweep is not None:
        body["after_sweep"] = id_of(after_sweep)


def sweep_run_body(command: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep's template: what ``submit`` would send for ``command`` with ``options`` (its
    keyword arguments). Raises TypeError for an option ``submit`` does not take."""
    unknown = sorted(set(options) - _RUN_OPTIONS)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {unknown}")
    limits = {k: options.get(k) for k in ("cpus", "gpus", "memory", "disk", "time")}
    body = submit_body(
        command,
        options.get("image"),
        options.get("resources"),
        limits,
        options.get("queue"),
        options.get("name"),
        options.get("env"),
        options.get("inputs"),
        bool(options.get("network", False)),
        options.get("tag"),
        options.get("group"),
        options.get("priority"),
    )
    retry = options.get("retry")
    if retry is not None:
        body["retry"] = retry.model_dump(exclude_unset=True) if isinstance(retry, RetryRule) else dict(retry)
    add_waits(body, options.get("after"), options.get("after_sweep"))
    return body


def collect(plan: Plan[Any]) -> Plan[list[Any]]:
    """Run ``plan`` as a step of another, gathering what it emits into a list."""
    items: list[Any] = []
    reply: Any = None
    while True:
        try:
            step = plan.send(reply)
        except StopIteration:
            return items
        if isinstance(step, Emit):
            items.append(step.item)
            reply = None
        else:
            reply = yield step


def _seen(view: RunView) -> tuple[Any, ...]:
    """What ``follow`` reports a change of."""
    return (view.state, view.waiting_reason, view.attempt, view.kill_requested)


def _emit(stream: str, text: str) -> Generator[Step, Any, None]:
    if text:
        yield Emit((stream, text))


class _StreamReader:
    """One log stream as ``follow`` reads it: where it is, and the partial line it holds back."""

    def __init__(self) -> None:
        self.offset = 0
        self.complete = False
        self._held = ""

    def add(self, page: LogPage) -> str:
        """The text to hand over after ``page``: up to its last line end while more may come
        (everything once the stream is complete, or once the held part is long)."""
        self.offset, self.complete = page.next_offset, page.complete
        text = self._held + page.data
        if self.complete or len(text) >= LINE_HOLD:
            self._held = ""
            return text
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1
        self._held = text[cut:]
        return text[:cut]

    def restart(self) -> str:
        """Start over at offset 0 (the run's next attempt); what was held is handed over."""
        held, self._held, self.offset, self.complete = self._held, "", 0, False
        return held


def _target(root: Path, file: OutputFile, force: bool) -> Path:
    target = (root / file.path).resolve()
    if target == root or not target.is_relative_to(root):
        raise DownloadFailed(0, "unsafe_path", f"refusing output path {file.path[:200]!r}: it leaves {root}")
    if target.is_dir():
        raise DownloadFailed(0, "exists", f"{target} is a directory; output {file.path!r} cannot be written there")
    if not force and target.exists() and target.stat().st_size != file.size:
        raise DownloadFailed(0, "exists", f"{target} exists and differs; use --force to overwrite it")
    return target


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def place(part: Path, dest: Path, force: bool) -> None:
    """Move a finished ``part`` to ``dest``. Unless ``force``, an existing ``dest`` with other
    bytes is kept (``part`` removed) and DownloadFailed raised."""
    if not force and dest.exists() and not _same_bytes(part, dest):
        part.unlink(missing_ok=True)
        raise DownloadFailed(0, "exists", f"{dest} exists and differs; use --force to overwrite it")
    part.replace(dest)


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        while True:
            chunk = fa.read(1 << 20)
            if chunk != fb.read(1 << 20):
                return False
            if not chunk:
                return True


class PartFile:
    """The file side of a ``Fetch``, the same for both drivers: ``start`` with the answer's status
    and headers, ``write`` each chunk, ``finish`` (``place``s it), or ``fail`` with whatever went
    wrong, which removes the part file and returns the DownloadFailed to raise."""

    def __init__(self, step: Fetch) -> None:
        self.step = step
        self.part = part_path(step.dest)
        self._out: BinaryIO | None = None
        self._length: int | None = None

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        if status != 200:
            raise DownloadFailed(status, "download_failed", f"download of {self.step.dest.name} failed: HTTP {status}")
        length = headers.get("content-length")
        self._length = int(length) if length is not None and length.isdigit() else None
        self.step.dest.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.part.open("wb")

    def write(self, chunk: bytes) -> None:
        assert self._out is not None, "write before start"
        self._out.write(chunk)
        if self.step.on_chunk is not None:
            self.step.on_chunk(len(chunk), self._length)

    def finish(self) -> None:
        if self._out is None:
            raise DownloadFailed(0, "download_failed", f"download of {self.step.dest.name} failed: no answer")
        self._out.close()
        place(self.part, self.step.dest, self.step.force)

    def fail(self, error: Exception) -> DownloadFailed:
        if self._out is not None:
            self._out.close()
        self.part.unlink(missing_ok=True)
        if isinstance(error, DownloadFailed):
            return error
        reason = str(error) or type(error).__name__
        return DownloadFailed(0, "download_failed", f"download of {self.step.dest.name} failed: {reason}")
