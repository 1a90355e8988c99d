"""Ports: what the core needs from the outside world. Adapters implement them per cloud.

Every implementation of a port passes the same contract suite (tests/integration/contracts).
``Ports`` bundles them, with the pools, the settings and the clock, into the one thing every
service takes first; the composition root (``runplane.bootstrap``) builds it.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runplane.backend import ComputeBackend
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.pools import Pool, PoolConfig
from runplane.domain.quotas import Lane, Quota, QuotaKind, UsageRecord
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.secrets import MAX_SECRETS_PER_SCOPE, Sealed, SecretRecord
from runplane.domain.sessions import RelayEndpoint, Session, SessionState
from runplane.domain.states import RunState
from runplane.domain.sweeps import Sweep
from runplane.domain.tenancy import ApiToken, Principal, UserRecord
from runplane.domain.uploads import PUT_URL_SECONDS
from runplane.domain.workers import PoolRecord, Worker
from runplane.settings import StackSettings

Clock = Callable[[], float]
"""Seconds since the epoch, as ``time.time`` gives them. Services read the time from
``Ports.clock`` only, so that a test moves it instead of waiting."""


LIST_BUDGET = 1000
"""The most runs one filtered listing call reads: no request's work grows with a user's history."""


@dataclass(frozen=True)
class Page:
    runs: list[Run]
    next_cursor: str | None


class RunStore(Protocol):
    """The source of truth for runs. Every state change is a conditional write."""

    def create(self, run: Run) -> Run:
        """Store a new run. Raises AlreadyExists (with ``details['run']``) if the id is taken."""
        ...

    def get(self, run_id: str) -> Run:
        """Strongly consistent read. Raises NotFound."""
        ...

    def update(self, run: Run, expect: Expect, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        """Set top-level Run fields if ``expect`` holds; append ``event``; return the new run.

        ``run`` only addresses the record (id, queue): the write is checked against the stored
        record and ``expect``, never against this copy. Raises NotFound if the run is gone and
        ConditionFailed (with ``details['run']``, the stored run) if a check fails. Atomic.
        """
        ...

    def move(self, run: Run, expect: Expect, queue: str, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        """``update`` that also files the run under pool ``queue``: its listings by queue and state,
        its line (``head``, ``count``) while queued, the purge index. Readers find it in one pool or
        the other, never both and never neither; an ``update`` with a copy of the run from before
        the move lands on the moved run. The move is from the pool ``run`` names: ConditionFailed
        (with ``details['run']``) when the stored run is in another, or ``expect`` fails; NotFound."""
        ...

    def list(
        self,
        *,
        owner: str | None = None,
        queue: str | None = None,
        state: RunState | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        """Newest first. Needs ``owner`` or ``queue`` and ``state``. Cursor is opaque; one that
        this very listing did not make raises BadRequest. A filtered listing (an owner's runs of
        one state or queue) reads at most LIST_BUDGET runs per call: its page may come back short,
        even empty, with a cursor to go on."""
        ...

    def cursor_after(self, run: Run, owner: str | None = None) -> str:
        """The cursor that continues a listing after ``run`` (one the listing returned): the
        owner's listing when ``owner`` is given, else that of the run's queue and state."""
        ...

    def count(self, queue: str, state: RunState, cap: int = 10000) -> int:
        """Number of runs of a queue in a state, counting at most ``cap``."""
        ...

    def head(self, queue: str, limit: int, priority: int | None = None) -> builtins.list[Run]:
        """The first ``limit`` queued runs of ``queue`` (a pool) in the order they should start
        (``run_rank``: higher priority, then smaller fair tag, then older, then id); with
        ``priority``, only the runs of that priority. One query, whatever the length of the queue.
        On DynamoDB it reads an index, which may lag a write by a moment: a run just claimed may
        still show, so a caller claims conditionally as always. Runs that wait for other runs
        (``listed_state`` ``waiting``) are not in the line, nor counted or listed as queued by
        queue: ``waiting`` lists them."""
        ...

    def waiting(self, queue: str, limit: int = 100, cursor: str | None = None) -> Page:
        """Queued runs of ``queue`` that still wait for other runs, newest first, a page of up to
        ``limit`` (the cursor goes on)."""
        ...

    def due(self, queue: str, now: float, limit: int = 100) -> builtins.list[Run]:
        """At most ``limit`` finished runs of ``queue`` whose ``retention.purge_due`` is at or before
        ``now``, the soonest first (a range of the store's purge index, never a scan)."""

    def delete(self, run_id: str, now: float) -> None:
        """Delete a finished run's record (and its index entries) if ``purge_due`` is at or before
        ``now``: ConditionFailed if it is not (kept, retried, not due), NotFound if it is gone."""

    def follow(self, run_id: str, dependent: str) -> Run:
        """Add ``dependent`` (a run id, or ``sweep:<id>``) to the run's ``dependents`` while the
        run has not ended, atomically beside any other write; return the run as stored. Adding one
        that is there already writes nothing. Raises NotFound, ConditionFailed (with
        ``details['run']``) once the run has ended, and Conflict when MAX_DEPENDENTS wait already."""
        ...


class SweepStore(Protocol):
    """Sweep records (runplane.domain.sweeps): every write but the first is conditional on the
    record's ``version``."""

    def create(self, sweep: Sweep) -> Sweep:
        """Store a new sweep (``version`` 1 is returned). Raises AlreadyExists (with
        ``details['sweep']``) if the id is taken, PayloadTooLarge if the record is too big."""
        ...

    def get(self, sweep_id: str) -> Sweep:
        """Strongly consistent read. Raises NotFound."""
        ...

    def save(self, sweep: Sweep) -> Sweep:
        """Replace the sweep if the stored version is still ``sweep.version``; returns it with
        ``version`` + 1. Raises ConditionFailed (with ``details['sweep']``, the stored one) when
        another writer got there first."""
        ...

    def list(self, owner: str, limit: int = 50, cursor: str | None = None) -> tuple[builtins.list[Sweep], str | None]:
        """The owner's sweeps, newest first, and the cursor of the next page (None: no more). A
        cursor this listing did not make raises BadRequest."""
        ...

    def cursor_after(self, sweep: Sweep) -> str:
        """The cursor that continues its owner's listing after ``sweep`` (one the listing returned)."""
        ...

    def unfinished(self, limit: int = 100, after: tuple[float, str] | None = None) -> builtins.list[Sweep]:
        """Up to ``limit`` sweeps of any owner that have not finished, oldest first (by creation
        time, then id); with ``after`` (a sweep's ``(created_at, id)``), those after it only."""
        ...


@dataclass(frozen=True)
class Delivery:
    """A received queue message; ``receipt`` deletes it."""

    message: RunMessage
    receipt: str
    receive_count: int = 1


class RunQueue(Protocol):
    """One queue per pool of run hints, plus the dispatcher's event queue. At-least-once."""

    def send(self, pool: str, message: RunMessage) -> None: ...

    def receive(self, pool: str, max_messages: int, wait_seconds: float, visibility_seconds: int) -> list[Delivery]:
        """Long-poll for up to ``max_messages``; blocks at most ``wait_seconds``."""
        ...

    def delete(self, pool: str, delivery: Delivery) -> None:
        """Idempotent: deleting an already deleted message is quiet."""
        ...

    def release(self, pool: str, delivery: Delivery, delay_seconds: int) -> None:
        """Give a message back: visible again to every worker after ``delay_seconds``. Quiet if
        the message is already gone."""
        ...

    def notify(self, event: DispatchEvent, delay_seconds: int = 0) -> None:
        """Nudge the dispatcher: the event is delivered no sooner than ``delay_seconds`` from now
        (a store may cap the delay: SQS at ``MAX_NOTIFY_DELAY``; the receiver of an event that
        comes early sends it again)."""
        ...


MAX_NOTIFY_DELAY = 900
"""The longest delay every ``RunQueue.notify`` honours (SQS's); a longer one may be cut to it."""


MAX_DELETE = 1000
"""The most keys one ``ObjectStore.delete`` takes (S3's DeleteObjects)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str = ""
    modified: float | None = None
    """When it was last written (or touched), in seconds since the epoch; None: not known."""


class ObjectStore(Protocol):
    """Blobs: logs, outputs. Keys are '/'-separated paths."""

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, path: Path) -> None:
        """Upload a file, in parts if it is large."""

    def get_bytes(self, key: str) -> bytes:
        """Raises NotFound."""

    def download_file(self, key: str, path: Path, max_bytes: int | None = None) -> None:
        """Raises NotFound; PayloadTooLarge past ``max_bytes`` (the download stops there, leaving no file)."""

    def list_page(self, prefix: str, cursor: str | None, limit: int) -> tuple[list[ObjectInfo], str | None]:
        """At most ``limit`` objects under ``prefix`` in key order from where ``cursor`` (of an earlier call) left
        off, and the next page's cursor, None at the end. A cursor the store cannot read raises BadRequest."""

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``, sorted by key."""

    def url(self, key: str, expires_seconds: int = 3600) -> str:
        """A time-limited URL anyone can GET."""

    def head(self, key: str) -> ObjectInfo | None:
        """The object's key, size and tag; None when there is none."""

    def put_url(
        self, key: str, size: int, md5: str, expires_seconds: int = PUT_URL_SECONDS
    ) -> tuple[str, dict[str, str]]:
        """A time-limited URL that PUTs at ``key`` only ``size`` bytes whose MD5 is ``md5`` (base64); its headers."""

    def delete(self, keys: Sequence[str]) -> None:
        """Delete these objects (at most ``MAX_DELETE`` keys a call); a key with no object is no error."""

    def touch(self, key: str) -> None:
        """Renew the object's time (what an expiry counts from) without changing it; raises NotFound."""

    def within(self, bucket: str) -> ObjectStore:
        """The same store on another bucket (container), sharing the client."""


class WorkerRegistry(Protocol):
    def put(self, worker: Worker) -> None:
        """Insert or replace the worker's record (heartbeat)."""
        ...

    def get(self, worker_id: str) -> Worker:
        """Raises NotFound."""
        ...

    def list(self, pool: str | None = None) -> list[Worker]: ...

    def page(self, pool: str | None, limit: int, after: str | None = None) -> tuple[builtins.list[Worker], str | None]:
        """Up to ``limit`` workers (of ``pool``) following the one with id ``after``, and the id to
        pass as ``after`` for the next page (None: this was the last). The order is the store's
        own, stable from page to page; a page costs what it holds, whatever the number of workers."""
        ...

    def delete(self, worker_id: str) -> None:
        """Idempotent."""
        ...


class PoolStateStore(Protocol):
    """The dispatcher's per-pool records (launch claims, failures, disabled state)."""

    def get(self, pool: str) -> PoolRecord:
        """The stored record, or a fresh one with ``version`` 0 when there is none."""
        ...

    def save(self, record: PoolRecord) -> PoolRecord:
        """Store ``record`` if the stored version is still ``record.version``; returns the stored
        record (``version`` + 1). Raises ConditionFailed when another writer got there first."""
        ...


class TokenStore(Protocol):
    """API tokens, keyed by the SHA-256 of their secret; and the stack's own secret."""

    def lookup(self, token_hash: str) -> ApiToken | None:
        """The token stored under ``token_hash``; None when there is none or its record does not
        validate (fail closed)."""
        ...

    def put(self, token_hash: str, token: ApiToken) -> None:
        """Store a token (replacing one under the same hash)."""
        ...

    def list(self) -> list[ApiToken]:
        """Every valid token, sorted by creation time."""
        ...

    def delete(self, token_id: str) -> bool:
        """Remove the token with this id; False when there is none. Idempotent."""
        ...

    def user(self, name: str) -> UserRecord | None:
        """What an administrator set for user ``name``; None when nothing was (or its record does
        not validate)."""
        ...

    def put_user(self, record: UserRecord) -> None:
        """Store ``record``, replacing the user's earlier one. Never listed among the tokens."""
        ...

    def secret(self) -> bytes:
        """The stack's secret (32 random bytes), made on first use by a conditional write so
        that every instance of every function reads the same one. Never changes afterwards."""
        ...


class SecretStore(Protocol):
    """Sealed secrets by (scope, name); ``put`` replaces, ``get`` reads as last written, ``list`` by name."""

    def put(self, record: SecretRecord) -> SecretRecord: ...
    def get(self, scope: str, name: str) -> SecretRecord | None: ...
    def list(self, scope: str, limit: int = MAX_SECRETS_PER_SCOPE) -> builtins.list[SecretRecord]: ...
    def delete(self, scope: str, name: str) -> bool: ...


class SecretSealer(Protocol):
    """What the API seals values with: it can seal, never open (Misconfigured: no usable key)."""

    def seal(self, value: bytes, context: Mapping[str, str]) -> Sealed: ...


class SecretOpener(Protocol):
    """What the agent opens secrets with (kms:Decrypt, unwrapKey, the key file); SecretUnavailable: refused."""

    def open(self, sealed: Sealed, context: Mapping[str, str]) -> bytes: ...


class SessionStore(Protocol):
    """Sessions into live runs (runplane.domain.sessions), one per slot of a run."""

    def create(self, session: Session) -> Session:
        """Store ``session`` in its slot if the slot is free (no session there, or one that is over);
        Conflict (with ``details['session']``) if a live one holds it."""

    def get(self, session_id: str) -> Session:
        """Strongly consistent read of the session in that id's slot, if it is that session. Raises NotFound."""

    def update(self, session: Session, states: frozenset[SessionState], changes: Mapping[str, Any]) -> Session:
        """Write ``changes`` if the stored session is still ``session.id`` in one of ``states``;
        ConditionFailed (with ``details['session']``) if not, NotFound if there is none."""

    def for_run(self, run_id: str) -> builtins.list[Session]:
        """The sessions in the run's slots, live and over, by slot."""

    def forget(self, run_id: str) -> int:
        """Delete the sessions of the run's slots, whatever their state (the retention sweep, before
        it deletes an ended run's record); how many there were. Idempotent."""


class SessionRelay(Protocol):
    """Where the two sides of a session meet; neither listens on a port of its own."""

    def endpoint(self, session: Session, ticket: str) -> RelayEndpoint:
        """How the holder of ``ticket`` (either side's) reaches ``session``'s relay."""

    def close(self, session_id: str, reason: str) -> None:
        """Hang up both sides of a session (each gets GONE with ``reason``); quiet if none is there.
        Called once the session is over in its store."""


class QuotaStore(Protocol):
    """Quotas (written by admins) and usage records (written by whoever claims or ends a run),
    one of each per user or group."""

    def get(self, kind: QuotaKind, name: str) -> Quota | None:
        """The quota of ``kind`` ``name``; None when there is none (or its record does not validate)."""
        ...

    def put(self, quota: Quota) -> None:
        """Store a quota, replacing the one of the same kind and name."""
        ...

    def delete(self, kind: QuotaKind, name: str) -> bool:
        """Remove a quota (its usage record stays); False when there was none. Idempotent."""
        ...

    def usage(self, kind: QuotaKind, name: str) -> UsageRecord:
        """The stored usage record (strongly consistent), or a fresh one with ``version`` 0."""
        ...

    def save_usage(self, record: UsageRecord) -> UsageRecord:
        """Store ``record`` if the stored version is still ``record.version`` (0: none stored);
        returns the stored record (``version`` + 1). Raises ConditionFailed when another writer
        got there first. Atomic."""
        ...

    def list_usage(self) -> list[UsageRecord]:
        """Every usage record."""
        ...

    def lane(self, pool: str, user: str, priority: int) -> Lane:
        """The user's lane in ``pool`` at ``priority`` (strongly consistent), or a fresh one with
        ``version`` 0."""
        ...

    def save_lane(self, lane: Lane) -> Lane:
        """Store ``lane`` if the stored version is still ``lane.version`` (0: none stored); returns
        the stored lane (``version`` + 1). Raises ConditionFailed when another writer got there
        first. Atomic."""
        ...

    def list(self) -> list[Quota]:
        """Every valid quota, users first, each kind sorted by name."""
        ...


class InputRules(Protocol):
    """What the operator allows runs to read (``services.inputs.InputPolicy``)."""

    def check(self, name: str, source: str, groups: Iterable[str]) -> None:
        """Raise InvalidRequest unless a member of ``groups`` may read input ``name`` from ``source``."""
        ...


class OwnerDirectory(Protocol):
    """The owners of runs as the token store says now (``services.authority.Owners``), for releases
    with no caller in the request."""

    def principal(self, user: str, *, within: float | None = None) -> Principal:
        """``user`` with the groups their tokens carry, as read at most ``within`` seconds ago."""
        ...

    def allows(
        self, user: str, spec: RunSpec, group: str | None, inputs: InputRules | None
    ) -> tuple[Principal, str | None]:
        """``user`` as their tokens say now, and why they may no longer release a run of ``spec``
        charged to ``group`` (None: they may)."""
        ...


class RunPorts(Protocol):
    """The ports a run's state change writes through: its store and the queue of hints. Both the
    control plane's ``Ports`` and the agent's narrower bundle are one."""

    @property
    def store(self) -> RunStore: ...

    @property
    def queue(self) -> RunQueue: ...


class QuotaPorts(RunPorts, Protocol):
    """``RunPorts`` and the quotas whose holds a run's attempts take (``admission.heal``)."""

    @property
    def quotas(self) -> QuotaStore: ...


@dataclass(frozen=True)
class Ports:
    """Everything a service may need, built once per process by ``runplane.bootstrap``. Every
    service takes it first; none reaches for a global or reads the time otherwise."""

    store: RunStore
    sweeps: SweepStore
    queue: RunQueue
    workers: WorkerRegistry
    tokens: TokenStore
    pool_states: PoolStateStore
    quotas: QuotaStore
    objects: ObjectStore
    """The bucket (Azure: container) of logs and outputs: never a run's input."""
    pools: PoolConfig
    settings: StackSettings
    clock: Clock
    owners: OwnerDirectory
    """Who the owners are now: what is released with no caller in the request is checked against them."""
    inputs: InputRules
    """What runs may read: checked at submit, again at every later release, and by the agent."""
    backend: Callable[[Pool], ComputeBackend]
    """The compute backend of a pool (built on first use)."""
    agent_args: Callable[[Pool], list[str]]
    """The arguments a pool's workers start ``runplane-agent`` with."""
    sleep: Callable[[float], None] = time.sleep
    """How a service that waits (a long-poll) lets time pass: a test moves its clock instead."""
    secrets: SecretStore | None = None  # the secrets store; None on a stack built without one
    sessions: SessionStore | None = None  # sessions into live runs; None on a stack built without them
    relay: SessionRelay | None = None  # where sessions' sides meet; None: no sessions on this stack
    sealer: SecretSealer | None = None  # what the API seals secrets' values with
