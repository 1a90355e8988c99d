"""What the sync and async clients share at the bottom, with no I/O: requests and answers,
retries, and the steps of a *plan*.

A plan is a generator of steps: ``Send`` (one HTTP exchange; the driver sends back an
``Exchange`` or a ``Dropped``), ``Pause`` (sleep), ``Fetch`` (stream a file to disk) and ``Emit``
(hand an item to the caller of an iterator). ``Client`` and ``AsyncClient`` each have one small
driver that performs these steps with blocking or asynchronous I/O, so every decision is written
once: the plans themselves are in ``_plans`` (runs and sweeps) and ``_admin_plans`` (the rest).
"""

from __future__ import annotations

import email.utils
import json
import random as random_module
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from runplane import __version__
from runplane.api.models import RunView
from runplane.client.errors import ApiError, ConnectionFailed, error_from_answer
from runplane.domain.wire import read_answer

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

USER_AGENT = f"runplane-sdk/{__version__}"
BACKOFF_BASE = 0.2
"""Seconds before the first retry (before jitter); doubled for each retry after it."""
BACKOFF_CAP = 5.0
"""The longest backoff between two tries (before jitter)."""
RETRY_AFTER_CAP = 30.0
"""The longest a server's Retry-After is obeyed for."""


# --- requests and answers -------------------------------------------------------------------


@dataclass(frozen=True)
class ApiRequest:
    """One API request as it is sent, every try alike (the same Idempotency-Key included)."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


class Sensitive(dict[str, Any]):
    """A request body that holds a secret's value: sent as the JSON of its items like any dict,
    shown by ``repr`` and ``str`` (a request's, a plan step's, a log line's, a traceback's) with
    every value as ``***``."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{key!r}: '***'" for key in self) + "}"

    __str__ = __repr__


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


def quote_segment(segment: str) -> str:
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


def dropped(url: str, error: httpx.TransportError, url_from: str = "default", profile: str | None = None) -> Dropped:
    """A transport error as ConnectionFailed. A request that never left (no connection could be
    made) is marked as not sent: repeating it is always safe. The message's hint says where the
    URL came from (``config.URL_FROM``), so that it names what to check."""
    unsent = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    if isinstance(error, httpx.TimeoutException):
        code, reason = "timeout", f"no answer in time ({type(error).__name__})"
    else:
        code, reason = "unreachable", str(error) or type(error).__name__
    message = f"cannot reach {url}: {reason} ({unreachable_hint(url_from, profile)})"
    return Dropped(ConnectionFailed(0, code, message), sent=not unsent)


def unreachable_hint(url_from: str, profile: str | None) -> str:
    """What to check when the API cannot be reached, by where its URL came from."""
    if url_from == "environment":
        return "the URL is RUNPLANE_API_URL's: is the stack there up, and is the variable right?"
    if url_from == "profile":
        return f"the URL is profile {profile}'s: is the stack there up? `runplane login URL` saves another"
    if url_from == "dev":
        return "the URL is the one `runplane dev` wrote to ~/.runplane/dev.json: is it still running?"
    if url_from == "argument":
        return "is runplane's API up at this URL?"
    return (
        "no URL is set, so the default: is `runplane dev` or `runplane serve` running on this machine? "
        "else set RUNPLANE_API_URL and RUNPLANE_TOKEN, or use `runplane login`"
    )


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
        return read_answer(model, response.body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        message = f"the API's answer is not a {model.__name__} ({where}: {first['msg']}); is the URL runplane's API?"
        raise ApiError(response.status, "invalid_response", message) from None


# --- retries --------------------------------------------------------------------------------

_RUN_PATH = "/v1/runs/"


def repeatable(request: ApiRequest) -> bool:
    """Whether sending ``request`` twice has the effect of sending it once: reads, deletes, a PUT
    (it stores the whole thing: a quota), a kill, a priority set (to a number, not by one), a pin set
    or lifted (keep) and a submit that carries an Idempotency-Key (the second finds the run the first
    made)."""
    method, path = request.method.upper(), request.path
    if method in ("GET", "HEAD", "OPTIONS", "DELETE", "PUT"):
        return True
    if method != "POST":
        return False
    if path == "/v1/runs":
        return any(k.lower() == "idempotency-key" for k in request.headers)
    return path.startswith(_RUN_PATH) and path.endswith(("/kill", "/priority", "/keep")) and path.count("/") == 4


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
