"""Waiting for a change (the long-poll of ``GET /v1/runs/{id}`` and ``GET /v1/sweeps/{id}``):
each answer carries a *revision* of the record it shows; a request that names the revision it last
saw (``since``) is answered as soon as the record's differs, or when ``wait`` seconds have passed
with it unchanged (the same answer: the client asks again).

The wait reads the store after each pause (``Ports.sleep``), one strongly consistent get each
time (a local indexed SELECT on one machine, a point read on the clouds), and holds no lock; on one
machine the pause ends at the first commit to the database. Ownership is judged on the first read,
exactly as a plain read judges it: another user's record is NotFound at once."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from runplane.domain.runs import Run
from runplane.domain.sweeps import Sweep
from runplane.domain.tenancy import Principal
from runplane.ports import Ports
from runplane.services import runs, sweeps
from runplane.services.overview import why_waiting
from runplane.services.shown_sweeps import Shown

MAX_WAIT_SECONDS = 20
"""The longest a request waits: under API Gateway's 29 s (and the 30 s the API function may run),
with room for the reads and the answer."""
LOCAL_INTERVAL = 0.5
"""Seconds between two reads of a waiting request on one machine at most: its pause (``Ports.sleep``)
ends at the first commit to the database, seen within 30 ms, so a change is read at once."""
CLOUD_INTERVAL = 0.5
"""Seconds between two reads on the clouds (one billed point read each), once a wait is older than
its first few reads."""
BRISK_INTERVAL = 0.05
"""Seconds between two reads while a wait is younger than BRISK_SECONDS: a change soon after a
request (a warm run's next state) is seen within tens of milliseconds."""
BRISK_SECONDS = 1.0
"""How long a wait reads at BRISK_INTERVAL before it slows to its interval; a 20 s wait on a cloud
costs about 60 reads."""
MAX_WAITING_PER_USER = 8
"""Waiting reads one user may hold at once in one process (a front's threads, an Azure worker's);
one more is answered at once, unwaited, and its client reads again after its own pause, so no user
holds every thread of a front."""
MAX_WAITING = 64
"""Waiting reads all users together may hold at once in one process (half the threads of the
serving front, runplane/devstack/wsgi.py); one more is answered at once, unwaited, so that many
users' waits leave threads to every other request."""
REVISION_PATTERN = r"^[0-9a-f]{16}$"
"""What a revision looks like (the first 64 bits of a SHA-256, in hex); clients treat it as opaque."""

R = TypeVar("R")


def _digest(parts: list[Any]) -> str:
    text = json.dumps(parts, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_revision(run: Run) -> str:
    """What a client compares to know the run changed: its state, attempt, worker, times, exit,
    failure, kill, priority, what it waits for, its timeline, its pin, what retention has deleted
    of it, its newest checkpoint and its pieces. Not its usage figures, which each heartbeat
    refreshes, nor its lease."""
    failure = None if run.failure is None else [str(run.failure.reason), run.failure.message]
    last = [run.events[-1].at, run.events[-1].message] if run.events else None
    return _digest([
        str(run.state), run.attempt, run.worker_id, run.started_at, run.finished_at, run.exit_code, failure,
        run.kill_requested, run.spec.priority, run.waiting_reason, run.waiting_on, len(run.events), last,
        run.kept, run.retention and run.retention.deleted, run.checkpoint and run.checkpoint.seq, run.pieces,
    ])  # fmt: skip


def sweep_revision(sweep: Sweep) -> str:
    """What a client compares to know the sweep changed: its record (members released and ended,
    max_parallel, kill, retries, finish, timeline). A member that starts running writes no sweep
    record: that shows in the next answer's counts, but does not end a wait by itself."""
    last = [sweep.events[-1].at, sweep.events[-1].message] if sweep.events else None
    return _digest([
        sweep.version, sweep.status, sweep.tries, sweep.killed, sweep.finished_at, sweep.max_parallel,
        sweep.waiting_on, len(sweep.events), last,
    ])  # fmt: skip


def interval(ports: Ports) -> float:
    """Seconds between two reads of a waiting request on this stack."""
    return LOCAL_INTERVAL if ports.settings.cloud == "local" else CLOUD_INTERVAL


class _Waiting:
    """The waiting reads each user holds in this process: bookkeeping of requests in flight, as a
    connection pool keeps, not configuration (a process serves its requests from one count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()
        self._total = 0

    @contextmanager
    def slot(self, user: str) -> Iterator[bool]:
        """Whether ``user`` may wait now (fewer than MAX_WAITING_PER_USER held by the user, fewer than
        MAX_WAITING by all), held until the end."""
        with self._lock:
            granted = self._held[user] < MAX_WAITING_PER_USER and self._total < MAX_WAITING
            if granted:
                self._total += 1
                self._held[user] += 1
        try:
            yield granted
        finally:
            if granted:
                with self._lock:
                    self._total -= 1
                    self._held[user] -= 1
                    if not self._held[user]:
                        del self._held[user]


_WAITING = _Waiting()


def _until_changed(
    ports: Ports,
    user: str,
    first: R,
    read: Callable[[], R],
    revision: Callable[[R], str],
    since: str | None,
    wait: float,
) -> R:
    """``first``, or a later ``read()`` whose revision differs from ``since`` (None: from
    ``first``'s), reading until one does or ``wait`` seconds have passed; ``first`` at once when
    ``user`` holds MAX_WAITING_PER_USER waits already, or all users MAX_WAITING."""
    seen = revision(first) if since is None else since
    current = first
    with _WAITING.slot(user) as granted:
        deadline = ports.clock() + (min(max(wait, 0.0), MAX_WAIT_SECONDS) if granted else 0.0)
        every = interval(ports)
        brisk_until = ports.clock() + BRISK_SECONDS
        while revision(current) == seen:
            now = ports.clock()
            left = deadline - now
            if left <= 0:
                break
            ports.sleep(min(BRISK_INTERVAL if now < brisk_until else every, every, left))
            current = read()
    return current


def watched_run(
    ports: Ports, principal: Principal, run_id: str, since: str | None = None, wait: float = 0
) -> tuple[Run, str | None]:
    """The caller's run (``runs.get_run``: NotFound at once for another user's) as soon as its
    revision differs from ``since`` (None: from what it is now), or after ``wait`` seconds (at most
    MAX_WAIT_SECONDS) as it is then; and, while it is queued, why it waits."""
    first = runs.get_run(ports, principal, run_id)
    run = first
    if wait:
        read = functools.partial(ports.store.get, run_id)
        run = _until_changed(ports, principal.user, first, read, run_revision, since, wait)
    return run, why_waiting(ports, run)


def watched_sweep(
    ports: Ports, principal: Principal, sweep_id: str, since: str | None = None, wait: float = 0
) -> Shown:
    """The caller's sweep (NotFound at once for another user's), counted, as soon as its revision
    differs from ``since`` (None: from what it is now), or after ``wait`` seconds as it is then."""
    first = sweeps.get_sweep(ports, principal, sweep_id)
    if wait:
        read = functools.partial(ports.sweeps.get, sweep_id)
        first = _until_changed(ports, principal.user, first, read, sweep_revision, since, wait)
    return Shown(first, sweeps.progress(ports, first))
