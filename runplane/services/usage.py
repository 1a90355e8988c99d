"""Usage reports: what runs used, per user, group or pool, over a window of time.

A run counts in the window it was submitted in (``created_at`` in ``[since, until)``), with the
figures its agent recorded (``Run.usage``: CPU-seconds, GPU-seconds and cost, all attempts
together; a run under way with what it used so far). A user sees only their own runs; asking for
another user's is refused (403) rather than answered with an empty report, so that a script that
asks for the wrong user learns it. Admins see anyone's.

What a report reads: the runs submitted since ``since``, newest first, stopping at the first one
older than the window. One user's (every report of a user who is not an admin): through the runs
table's owner index. An admin's report of every user: each pool's runs through the queue-and-state
index, one listing per pool and state, so its cost grows with the runs of all users since
``since``. A report that would read more than MAX_REPORT_RUNS runs (a user's own included) is
refused (422) and asks for a narrower window (or one user, or one pool): no request makes the API
read more runs than that.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, cast, get_args

from runplane.domain.errors import BadRequest, Forbidden, InvalidRequest, UnknownName
from runplane.domain.runs import Run
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.ports import Ports

By = Literal["user", "group", "pool"]

MAX_REPORT_RUNS = 5_000
"""The most runs one report reads (whoever asks it)."""
PAGE = 500
"""Runs asked for per listing call."""
LATEST = 253402300799.0
"""9999-12-31T23:59:59Z: the latest moment a window may name."""

# Forward in the lifecycle, terminal states last: a run that moves on while an admin-wide report
# lists the states meets the listing again further on (its later copy counts), so only a run
# handed back to the queue meanwhile can be missed.
_STATE_ORDER = (
    RunState.QUEUED,
    RunState.PREPARING,
    RunState.RUNNING,
    RunState.UPLOADING,
    *(s for s in RunState if s.terminal),
)


@dataclass
class Row:
    """What the runs of one key used."""

    key: str | None
    runs: int = 0
    cpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    cost: float | None = None

    def add(self, run: Run) -> None:
        self.runs += 1
        self.cpu_seconds += run.usage.cpu_seconds or 0.0
        self.gpu_seconds += run.usage.gpu_seconds or 0.0
        if run.usage.cost is not None:
            self.cost = (self.cost or 0.0) + run.usage.cost


@dataclass
class Report:
    by: By
    since: float
    until: float
    user: str | None
    group: str | None
    pool: str | None
    rows: list[Row] = field(default_factory=list)
    total: Row = field(default_factory=lambda: Row(None))


def parse_by(raw: str | None) -> By:
    """``by`` as a query gives it (default ``user``). Raises InvalidRequest for another value."""
    if raw is None or raw == "":
        return "user"
    if raw in get_args(By):
        return cast(By, raw)
    raise InvalidRequest(f"by must be user, group or pool, not {raw[:40]!r}")


def parse_moment(name: str, raw: str) -> float:
    """A moment given as ISO 8601 (``2026-11-01``, ``2026-11-01T09:30:00Z``; UTC when it names no
    zone) or as Unix seconds (``1793491200``). Raises BadRequest for anything else."""
    text = raw.strip()
    wrong = BadRequest(
        f"{name} must be an ISO 8601 date or time (2026-11-01, 2026-11-01T09:30:00Z) or Unix seconds, not {raw[:40]!r}"
    )
    if not text or len(text) > 64:
        raise wrong
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError as e:
            raise wrong from e
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = moment.timestamp()
    if not math.isfinite(seconds) or not 0 <= seconds <= LATEST:
        raise BadRequest(f"{name} must be between 1970-01-01 and 9999-12-31, not {raw[:40]!r}")
    return seconds


def month_start(now: float) -> float:
    """The start of the calendar month (UTC) that ``now`` falls in: a report's default ``since``."""
    moment = datetime.fromtimestamp(now, UTC)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def usage_report(
    ports: Ports,
    principal: Principal,
    *,
    user: str | None = None,
    group: str | None = None,
    pool: str | None = None,
    since: float | None = None,
    until: float | None = None,
    by: By = "user",
    max_runs: int = MAX_REPORT_RUNS,
) -> Report:
    """What the runs submitted in ``[since, until)`` (default: from the start of this month, UTC,
    until now) used, per ``by``, optionally only ``user``'s, those charged to ``group`` or those
    of ``pool``. Raises Forbidden when a user who is not an admin asks for another user's,
    InvalidRequest for an unknown pool, a window that ends before it starts, or a report that
    would read more than ``max_runs`` runs (listings stop at the first run older than ``since``)."""
    if not principal.admin:
        if user is not None and user != principal.user:
            raise Forbidden(f"only admins may read another user's usage; {principal.user} may read their own")
        user = principal.user
    if pool is not None and ports.pools.get(pool) is None:
        names = ", ".join(p.name for p in ports.pools.pools)
        raise UnknownName(f"no pool {pool[:80]!r}; pools are {names}")
    now = ports.clock()
    start = month_start(now) if since is None else since
    end = now if until is None else until
    if end < start:
        raise InvalidRequest("until is before since: the window would be empty")
    rows: dict[str | None, Row] = {}
    total = Row(None)
    for run in _runs(ports, user, pool, start, end, max_runs):
        if group is not None and run.group != group:
            continue
        key = {"user": run.owner, "group": run.group, "pool": run.queue}[by]
        rows.setdefault(key, Row(key)).add(run)
        total.add(run)
    ordered = sorted(rows.values(), key=lambda r: (r.key is None, r.key or ""))
    return Report(by, start, end, user, group, pool, ordered, total)


def report(
    ports: Ports,
    principal: Principal,
    *,
    user: str | None = None,
    group: str | None = None,
    pool: str | None = None,
    since: str | None = None,
    until: str | None = None,
    by: str | None = None,
) -> Report:
    """``usage_report`` for a window and a ``by`` as a query gives them (``parse_moment``,
    ``parse_by``; None: the defaults). Raises BadRequest for a moment that cannot be one, and as
    ``usage_report`` does."""
    start = None if since is None else parse_moment("since", since)
    end = None if until is None else parse_moment("until", until)
    return usage_report(ports, principal, user=user, group=group, pool=pool, since=start, until=end, by=parse_by(by))


def _runs(ports: Ports, user: str | None, pool: str | None, since: float, until: float, max_runs: int) -> Iterator[Run]:
    """Every run submitted in ``[since, until)`` of ``user`` (or of every user) and of ``pool`` (or
    of every pool), each once, reading at most ``max_runs`` runs (InvalidRequest past that)."""
    read = 0

    def listing(owner: str | None = None, queue: str | None = None, state: RunState | None = None) -> Iterator[Run]:
        nonlocal read
        cursor: str | None = None
        while True:
            page = ports.store.list(owner=owner, queue=queue, state=state, limit=min(PAGE, max_runs + 1), cursor=cursor)
            for run in page.runs:
                read += 1
                if read > max_runs:
                    raise InvalidRequest(
                        f"this report would read more than {max_runs} runs: narrow the window "
                        "(a later since or an earlier until), or ask for one user or one pool"
                    )
                if run.created_at < since:  # newest first: the rest are older still
                    return
                if run.created_at < until:
                    yield run
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    if user is not None:
        for run in listing(owner=user):
            if pool is None or run.queue == pool:
                yield run
        return
    latest: dict[str, Run] = {}
    for name in [pool] if pool is not None else [p.name for p in ports.pools.pools]:
        for state in _STATE_ORDER:
            for run in listing(queue=name, state=state):
                latest[run.id] = run
    yield from latest.values()
