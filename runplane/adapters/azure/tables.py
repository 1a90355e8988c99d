"""Table storage adapters: runs (ETag compare-and-set), workers, tokens, pool records, quotas.

Table storage has no secondary indexes and is only cheap to query within one partition, and an
entity group transaction only spans one partition. The runs table is laid out so that what must
change together shares a partition:

====================  ===============================  ==================================================
PartitionKey          RowKey                           entity
====================  ===============================  ==================================================
``q:{queue}``         ``run:{id}``                     the run: the truth, replaced only with its ETag
``q:{queue}``         ``s:{state}:{newest}:{id}``      a copy of the run, for listing by queue and state
``q:{queue}``         ``r:{rank}``                     a copy of a queued run: the queue's line, in order
                                                       (not of one that waits for other runs: it is
                                                       filed under ``s:waiting:``)
``id:{id}``           ``""``                           the run's queue: where ``get(id)`` finds it
``o:{owner}``         ``{newest}:{id}``                the owner's index: points at the run's queue
====================  ===============================  ==================================================

``newest`` is an inverted creation time, so a range scan returns newest first. ``rank`` is
``run_rank(run)`` (escaped), the order a pool's queued runs start in; the ``r:`` copy exists exactly
while the run is queued, so ``head`` is a range scan of the ``r:`` rows.

A run and its copies live in the queue's partition, and every write replaces them in one
transaction conditional on the run's ETag: listing and counting by queue and state are range scans
of one partition that are exact at all times, with nothing to repair. The alternative, a partition
per run, makes the queue+state index a separate partition that no transaction can update with the
run, so counts and the reaper's scans would see stale entries after a failure between the writes.
The price: all runs of one queue share a partition (Azure serves about 2,000 entities a second per
partition, plenty for runs that last minutes), and ``get`` needs the run's queue, read from the
``id:`` entry (one extra read per id and process: the entry never changes, so it is cached).

The ``id:`` and owner entries are written before the run and never change. A failure between these
writes leaves entries that point at no run: ``get`` says NotFound, ``list(owner=...)`` skips them
(it reads each run and checks it), and a create retried with the same id completes the run.

``update`` reads the run, checks ``Expect`` against it and writes back with the ETag it read. A
stale ETag means another write came between: it reads again and checks again, so a write fails
with ConditionFailed exactly when ``Expect`` does not hold for the stored run, as with DynamoDB's
condition expressions, and no concurrent change is ever lost.

A run is stored as JSON split over properties of 32,000 ASCII characters (a property holds 64 KiB
as UTF-16); an entity holds 1 MiB, so a run is limited to ``MAX_RUN_CHARS`` of JSON and a bigger
one is refused with PayloadTooLarge.
"""

from __future__ import annotations

import base64
import builtins
import itertools
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, TableErrorCode, TableTransactionError, UpdateMode

from runplane.adapters.azure.errors import error_code
from runplane.domain.cursors import decode_cursor
from runplane.domain.errors import (
    AlreadyExists,
    BackendError,
    BadRequest,
    ConditionFailed,
    Conflict,
    NotFound,
    PayloadTooLarge,
    RunplaneError,
)
from runplane.domain.quotas import Lane, Quota, QuotaKind, UsageRecord, quota_key
from runplane.domain.records import add_event, bound_changes
from runplane.domain.runs import MAX_DEPENDENTS, WAITING, Event, Run, listed_state, rank_prefix, run_rank
from runplane.domain.states import RunState
from runplane.domain.tenancy import ApiToken, UserRecord
from runplane.domain.workers import PoolRecord, Worker
from runplane.ports import LIST_BUDGET, Expect, Page

log = logging.getLogger(__name__)

CHUNK_CHARS = 32_000
MAX_CHUNKS = 15
MAX_RUN_CHARS = CHUNK_CHARS * MAX_CHUNKS
"""The largest run, as compact ASCII JSON, that one entity holds (about 960 KB as UTF-16)."""
MAX_WRITE_TRIES = 50
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-@+=")
_NEWEST = 10**18
_FETCH_THREADS = 8
_ID_CACHE = 10_000
_TOO_LARGE = (
    TableErrorCode.PROPERTY_VALUE_TOO_LARGE,
    TableErrorCode.ENTITY_TOO_LARGE,
    TableErrorCode.REQUEST_BODY_TOO_LARGE,
)


def key(value: str) -> str:
    """``value`` made safe for a PartitionKey or RowKey (which refuse / \\ # ? and control
    characters): anything but letters, digits and ``._-@+=`` becomes ``~XX`` per UTF-8 byte, so
    ':' stays free to separate the parts of a key."""
    return "".join(c if c in _SAFE else "".join(f"~{b:02X}" for b in c.encode()) for c in value)


def newest_first(created_at: float) -> str:
    """A sort key that orders later creation times first."""
    return f"{max(0, _NEWEST - round(created_at * 1_000_000)):019d}"


def pack(data: Any, what: str) -> dict[str, Any]:
    """``data`` as compact ASCII JSON over properties ``d0``.. ``dN``; raises PayloadTooLarge."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    if len(text) > MAX_RUN_CHARS:
        raise PayloadTooLarge(f"{what} is {len(text)} bytes as JSON; Table storage holds at most {MAX_RUN_CHARS}")
    chunks = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
    return {"n": len(chunks), **{f"d{i}": chunk for i, chunk in enumerate(chunks)}}


def unpack(entity: Mapping[str, Any]) -> Any:
    return json.loads("".join(entity[f"d{i}"] for i in range(int(entity["n"]))))


def _failure(e: AzureError, what: str) -> RunplaneError:
    """Our error for what Table storage answered: its code decides, and its own words (which may
    name accounts, tables and keys) are logged here, never carried to an answer."""
    code = error_code(e)
    log.warning("%s: Table storage answered %s: %s", what, code or e.__class__.__name__, e.message)
    if code in _TOO_LARGE:
        return PayloadTooLarge(f"{what}: the record is too large for Table storage")
    if code == TableErrorCode.TABLE_NOT_FOUND:
        return BackendError(f"{what} failed: the table does not exist; was the stack provisioned?")
    return BackendError(f"{what} failed: {code or e.__class__.__name__}")


def _get(table: TableClient, partition: str, row: str, what: str) -> Any | None:
    """One entity, or None when it does not exist; a missing table or any other failure raises
    (the table's absence is a broken deployment, not a missing entity)."""
    try:
        return table.get_entity(partition, row)
    except ResourceNotFoundError as e:
        if error_code(e) == TableErrorCode.TABLE_NOT_FOUND:
            raise _failure(e, what) from e
        return None
    except AzureError as e:
        raise _failure(e, what) from e


def _encode_cursor(row_key: str, owner: str | None = None) -> str:
    data = {"after": row_key} if owner is None else {"after": row_key, "owner": owner}
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


_ROW_KEY = re.compile(r"^[A-Za-z0-9._@+=~:-]{1,512}$")


def _decode_cursor(cursor: str, prefix: str, owner: str | None = None) -> str:
    """The row key a cursor holds, checked to be a key of this very listing (an owner's listing
    names its owner): anything else is a BadRequest, never a query Table storage would refuse."""
    try:
        data = decode_cursor(cursor)
        after = data["after"]
        if (
            not isinstance(after, str)
            or not after.startswith(prefix)
            or not _ROW_KEY.fullmatch(after)
            or data.get("owner") != owner
            or set(data) - {"after", "owner"}
        ):
            raise TypeError
    except (ValueError, TypeError, KeyError) as e:
        raise BadRequest("cursor is not valid; pass the next_cursor of a previous page") from e
    return after


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, RunState):
        return str(value)
    return value


class TableRunStore:
    """Runs in one table (see the module docstring for its layout)."""

    def __init__(self, table: TableClient, list_budget: int = LIST_BUDGET) -> None:
        self.table = table
        self.list_budget = list_budget
        self._queues: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- keys and entities ----------------------------------------------------------------

    @staticmethod
    def _partition(queue: str) -> str:
        return f"q:{key(queue)}"

    @staticmethod
    def _state_prefix(state: RunState | str) -> str:
        return f"s:{key(str(state))}:"

    @classmethod
    def _copy_key(cls, run: Run) -> str:
        return f"{cls._state_prefix(listed_state(run))}{newest_first(run.created_at)}:{key(run.id)}"

    @staticmethod
    def _rank_key(run: Run) -> str | None:
        """The RowKey of the run's copy in its queue's line; None when it is not queued, or
        waits for other runs."""
        return f"r:{key(run_rank(run))}" if listed_state(run) == RunState.QUEUED else None

    @classmethod
    def _entities(cls, run: Run) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
        """The run, its state copy and, while it is queued, its copy in the line."""
        body = {"state": str(run.state), **pack(run.model_dump(mode="json"), f"run {run.id}")}
        partition = cls._partition(run.queue)
        rank = cls._rank_key(run)
        return (
            {"PartitionKey": partition, "RowKey": f"run:{key(run.id)}", **body},
            {"PartitionKey": partition, "RowKey": cls._copy_key(run), **body},
            {"PartitionKey": partition, "RowKey": rank, **body} if rank is not None else None,
        )

    def _read(self, queue: str, run_id: str) -> tuple[Run, str]:
        """The run and its ETag. Raises NotFound."""
        entity = _get(self.table, self._partition(queue), f"run:{key(run_id)}", "read run")
        if entity is None:
            raise NotFound(f"run {run_id} not found")
        return Run.model_validate(unpack(entity)), str(entity.metadata["etag"])

    def _queue_of(self, run_id: str) -> str:
        queue = self._queues.get(run_id)
        if queue is not None:
            return queue
        entity = _get(self.table, f"id:{key(run_id)}", "", "read run")
        if entity is None:
            raise NotFound(f"run {run_id} not found")
        self._remember(run_id, str(entity["queue"]))
        return str(entity["queue"])

    def _remember(self, run_id: str, queue: str) -> None:
        with self._lock:
            if len(self._queues) >= _ID_CACHE:
                self._queues.clear()
            self._queues[run_id] = queue

    # -- the port -------------------------------------------------------------------------

    def create(self, run: Run) -> Run:
        main, copy, ranked = self._entities(run)  # PayloadTooLarge before anything is written
        try:
            self.table.create_entity({"PartitionKey": f"id:{key(run.id)}", "RowKey": "", "queue": run.queue})
        except ResourceExistsError:
            queue = self._queue_of(run.id)
            try:
                existing, _ = self._read(queue, run.id)
            except NotFound:
                # The id was taken by a create that has not written its run (yet): finish it when
                # it is for the same queue, else the id belongs to another request.
                if queue != run.queue:
                    raise Conflict(f"run id {run.id} is taken by a run of queue {queue}") from None
            else:
                raise AlreadyExists(f"run {run.id} exists", run=existing) from None
        except AzureError as e:
            raise _failure(e, "store run") from e
        self._remember(run.id, run.queue)
        try:
            self.table.upsert_entity(
                {
                    "PartitionKey": f"o:{key(run.owner)}",
                    "RowKey": f"{newest_first(run.created_at)}:{key(run.id)}",
                    "queue": run.queue,
                }
            )
            self.table.submit_transaction(
                [("create", main), ("create", copy), *([("create", ranked)] if ranked is not None else [])]
            )
        except TableTransactionError as e:
            if error_code(e) == TableErrorCode.ENTITY_ALREADY_EXISTS:
                existing, _ = self._read(run.queue, run.id)
                raise AlreadyExists(f"run {run.id} exists", run=existing) from e
            raise _failure(e, "store run") from e
        except AzureError as e:
            raise _failure(e, "store run") from e
        return run

    def get(self, run_id: str) -> Run:
        return self._read(self._queue_of(run_id), run_id)[0]

    def update(self, run: Run, expect: Expect, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        for field in changes:
            if field not in Run.model_fields or field in ("id", "owner", "queue", "created_at"):
                raise ValueError(f"cannot update field {field!r}")
        bounded = bound_changes(changes)

        def change(current: Run) -> Mapping[str, Any]:
            if not expect.holds(current):
                raise ConditionFailed(f"run {run.id} is {current.state} at attempt {current.attempt}", run=current)
            return bounded

        return self._rewrite(run, change, event)

    def follow(self, run_id: str, dependent: str) -> Run:
        def change(current: Run) -> Mapping[str, Any] | None:
            if dependent in current.dependents:
                return None
            if current.state.terminal:
                raise ConditionFailed(f"run {run_id} has ended: {current.state}", run=current)
            if len(current.dependents) >= MAX_DEPENDENTS:
                raise Conflict(f"run {run_id} already has {MAX_DEPENDENTS} runs and sweeps waiting for it")
            return {"dependents": [*current.dependents, dependent]}

        return self._rewrite(self.get(run_id), change, None)

    def waiting(self, queue: str, limit: int = 100, cursor: str | None = None) -> Page:
        return self.list(queue=queue, state=WAITING, limit=limit, cursor=cursor)

    def _rewrite(self, run: Run, change: Callable[[Run], Mapping[str, Any] | None], event: Event | None) -> Run:
        """Read the run, ask ``change`` what to set in it as it is now (None: nothing; it raises
        to refuse), and write the run and its copies back with the ETag read, reading again when
        another write came between."""
        # the ETag of a read whose run had no copy in the line to remove (queued before lines
        # existed): known of that version only, as another writer may have written the copy since
        unranked_at: str | None = None
        for _ in range(MAX_WRITE_TRIES):
            current, etag = self._read(run.queue, run.id)
            unranked = unranked_at == etag
            changes = change(current)
            if changes is None:
                return current
            data = current.model_dump(mode="json")
            data.update({field: _jsonable(value) for field, value in changes.items()})
            new = Run.model_validate(data)
            if event is not None:  # the timeline keeps its first event and the latest ones
                new.events = add_event(new.events, event)
            main, copy, ranked = self._entities(new)
            operations: list[Any] = [
                (
                    "update",
                    main,
                    {"mode": UpdateMode.REPLACE, "etag": etag, "match_condition": MatchConditions.IfNotModified},
                )
            ]
            old_copy = self._copy_key(current)
            if old_copy != copy["RowKey"]:
                operations.append(("delete", {"PartitionKey": main["PartitionKey"], "RowKey": old_copy}))
            operations.append(("upsert", copy, {"mode": UpdateMode.REPLACE}))
            old_rank = self._rank_key(current)
            removes_rank = old_rank is not None and old_rank != (ranked or {}).get("RowKey") and not unranked
            if removes_rank:
                operations.append(("delete", {"PartitionKey": main["PartitionKey"], "RowKey": old_rank}))
            if ranked is not None:
                operations.append(("upsert", ranked, {"mode": UpdateMode.REPLACE}))
            try:
                self.table.submit_transaction(operations)
            except TableTransactionError as e:
                if error_code(e) == TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED:
                    continue  # another write came between our read and ours: check again
                if error_code(e) == TableErrorCode.RESOURCE_NOT_FOUND and removes_rank:
                    unranked_at = etag  # nothing was written: write it again without that removal
                    continue
                raise _failure(e, "update run") from e
            except AzureError as e:
                raise _failure(e, "update run") from e
            return new
        raise BackendError(f"update run {run.id}: {MAX_WRITE_TRIES} concurrent writes won over this one; retry")

    def list(
        self,
        *,
        owner: str | None = None,
        queue: str | None = None,
        state: RunState | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        limit = max(1, limit)
        if owner is not None:
            return self._list_owner(owner, queue, state, limit, cursor)
        if queue is None or state is None:
            raise ValueError("list needs an owner, or a queue and a state")
        prefix = self._state_prefix(state)
        after = _decode_cursor(cursor, prefix) if cursor else prefix
        runs: list[Run] = []
        for entity in self._scan(self._partition(queue), after, prefix[:-1] + ";", min(limit, 1000), "list runs"):
            runs.append(Run.model_validate(unpack(entity)))
            if len(runs) == limit:
                return Page(runs, _encode_cursor(str(entity["RowKey"])))
        return Page(runs, None)

    def _list_owner(
        self, owner: str, queue: str | None, state: RunState | str | None, limit: int, cursor: str | None
    ) -> Page:
        after = _decode_cursor(cursor, "", owner) if cursor else ""
        runs: list[Run] = []
        batch: list[tuple[str, str, str]] = []  # (row key, queue, run id)
        pointers = self._scan(
            f"o:{key(owner)}", after, "~", min(max(limit, 20), 1000), "list runs", ("RowKey", "queue")
        )
        examined, last, exhausted = 0, "", False
        with ThreadPoolExecutor(_FETCH_THREADS, thread_name_prefix="runs-list") as pool:
            while True:
                batch.clear()
                for entity in pointers:
                    examined += 1
                    last = str(entity["RowKey"])
                    if queue is None or entity["queue"] == queue:
                        batch.append((last, str(entity["queue"]), last.partition(":")[2]))
                    if len(batch) == limit - len(runs) or examined >= self.list_budget:
                        break
                else:
                    exhausted = True
                found = pool.map(lambda p: self._maybe(p[1], p[2]), batch)
                for (row, _, _), run in zip(batch, found, strict=True):
                    if run is None or run.owner != owner or newest_first(run.created_at) != row.partition(":")[0]:
                        continue  # an entry of a create that failed half-way, or of another user's id
                    if state is not None and run.state != state:
                        continue
                    runs.append(run)
                    if len(runs) == limit:
                        return Page(runs, _encode_cursor(row, owner))
                if exhausted:
                    return Page(runs, None)
                if examined >= self.list_budget:  # a short page; the cursor goes on where the reading stopped
                    return Page(runs, _encode_cursor(last, owner))

    def cursor_after(self, run: Run, owner: str | None = None) -> str:
        if owner is not None:
            return _encode_cursor(f"{newest_first(run.created_at)}:{key(run.id)}", owner)
        return _encode_cursor(self._copy_key(run))

    def _maybe(self, queue: str, escaped_id: str) -> Run | None:
        entity = _get(self.table, self._partition(queue), f"run:{escaped_id}", "list runs")
        return Run.model_validate(unpack(entity)) if entity is not None else None

    def _scan(
        self, partition: str, after: str, before: str, page: int, what: str, select: tuple[str, ...] = ()
    ) -> Iterator[Mapping[str, Any]]:
        """Entities of one partition with ``after < RowKey < before``, in RowKey order."""
        entities = self.table.query_entities(
            "PartitionKey eq @pk and RowKey gt @after and RowKey lt @before",
            parameters={"pk": partition, "after": after, "before": before},
            results_per_page=page,
            select=[*select] or None,
        )
        try:
            yield from entities
        except AzureError as e:
            raise _failure(e, what) from e

    def head(self, queue: str, limit: int, priority: int | None = None) -> builtins.list[Run]:
        if limit <= 0:
            return []
        prefix = "r:" + (key(rank_prefix(priority)) if priority is not None else "")
        before = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first key past every one with the prefix
        rows = self._scan(self._partition(queue), prefix, before, min(limit, 1000), "read the head of the queue")
        return [Run.model_validate(unpack(entity)) for entity in itertools.islice(rows, limit)]

    def count(self, queue: str, state: RunState, cap: int = 10000) -> int:
        if cap <= 0:
            return 0
        prefix = self._state_prefix(state)
        total = 0
        for _ in self._scan(
            self._partition(queue), prefix, prefix[:-1] + ";", min(max(cap, 1), 1000), "count runs", ("RowKey",)
        ):
            total += 1
            if total >= cap:
                break
        return total


class TableWorkerRegistry:
    """Worker heartbeats in one partition. A record not renewed for ``ttl_seconds`` is gone:
    reads skip it and ``list`` deletes it (Table storage has no TTL of its own)."""

    PARTITION = "w"

    def __init__(self, table: TableClient, ttl_seconds: int = 3600, clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.ttl_seconds = ttl_seconds
        self.clock = clock

    def put(self, worker: Worker) -> None:
        entity = {
            "PartitionKey": self.PARTITION,
            "RowKey": key(worker.id),
            "pool": worker.pool,
            "expires_at": self.clock() + self.ttl_seconds,
            **pack(worker.model_dump(mode="json"), f"worker {worker.id}"),
        }
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise _failure(e, "record worker") from e

    def get(self, worker_id: str) -> Worker:
        entity = _get(self.table, self.PARTITION, key(worker_id), "read worker")
        if entity is None:
            raise NotFound(f"worker {worker_id} not found")
        if float(entity["expires_at"]) < self.clock():
            raise NotFound(f"worker {worker_id} not found (its record expired)")
        return Worker.model_validate(unpack(entity))

    def list(self, pool: str | None = None) -> list[Worker]:
        query, parameters = "PartitionKey eq @pk", {"pk": self.PARTITION}
        if pool is not None:
            query += " and pool eq @pool"
            parameters["pool"] = pool
        now = self.clock()
        workers, expired = [], []
        try:
            for entity in self.table.query_entities(query, parameters=parameters):
                if float(entity["expires_at"]) < now:
                    expired.append(entity)
                else:
                    workers.append(Worker.model_validate(unpack(entity)))
        except AzureError as e:
            raise _failure(e, "list workers") from e
        for entity in expired:
            try:  # unless a heartbeat renewed it since
                self.table.delete_entity(
                    entity, etag=entity.metadata["etag"], match_condition=MatchConditions.IfNotModified
                )
            except (ResourceModifiedError, ResourceNotFoundError):
                pass
            except AzureError as e:
                raise _failure(e, "list workers") from e
        return sorted(workers, key=lambda w: w.id)

    def page(self, pool: str | None, limit: int, after: str | None = None) -> tuple[builtins.list[Worker], str | None]:
        """In id order from the one after ``after``; stops reading once ``limit`` + 1 are found.
        A pool's page skips other pools' records on the way: Table storage has no index on it."""
        query, parameters = "PartitionKey eq @pk", {"pk": self.PARTITION}
        if after is not None:
            query += " and RowKey gt @after"
            parameters["after"] = key(after)
        if pool is not None:
            query += " and pool eq @pool"
            parameters["pool"] = pool
        now = self.clock()
        workers: builtins.list[Worker] = []
        try:
            for entity in self.table.query_entities(query, parameters=parameters, results_per_page=limit + 1):
                if float(entity["expires_at"]) >= now:
                    workers.append(Worker.model_validate(unpack(entity)))
                    if len(workers) > limit:
                        return workers[:limit], workers[limit - 1].id
        except AzureError as e:
            raise _failure(e, "list workers") from e
        return workers, None

    def delete(self, worker_id: str) -> None:
        try:
            self.table.delete_entity(self.PARTITION, key(worker_id))
        except AzureError as e:
            raise _failure(e, "delete worker") from e


class TableTokenStore:
    """API tokens, one entity per token: PartitionKey the SHA-256 of its secret, the document as
    JSON. The stack's own secret is one more entity, under a key no hash can take."""

    SECRET_KEY = "stack-secret"  # noqa: S105 - a key name, not a secret
    USER_ROW = "user"
    """Users' records (``UserRecord``) are entities under (the user's name, ``user``): tokens' rows are ``""``."""

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def lookup(self, token_hash: str) -> ApiToken | None:
        if token_hash == self.SECRET_KEY:
            return None
        return _token(_get(self.table, key(token_hash), "", "read token"))

    def put(self, token_hash: str, token: ApiToken) -> None:
        entity = {"PartitionKey": key(token_hash), "RowKey": "", "id": token.id, "doc": token.model_dump_json()}
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise _failure(e, "store token") from e

    def _query(self, query: str, parameters: dict[str, str]) -> list[Any]:
        try:
            return list(self.table.query_entities(query, parameters=parameters))
        except AzureError as e:
            raise _failure(e, "list tokens") from e

    def list(self) -> list[ApiToken]:
        query = "PartitionKey ne @secret and RowKey eq ''"
        found = [_token(e) for e in self._query(query, {"secret": self.SECRET_KEY})]
        return sorted((t for t in found if t is not None), key=lambda t: (t.created_at, t.id))

    def delete(self, token_id: str) -> bool:
        found = self._query("id eq @id", {"id": token_id})
        for entity in found:
            try:
                self.table.delete_entity(entity["PartitionKey"], entity["RowKey"])
            except AzureError as e:
                raise _failure(e, "delete token") from e
        return bool(found)

    def user(self, name: str) -> UserRecord | None:
        entity = _get(self.table, key(name), self.USER_ROW, "read user")
        return UserRecord.read(str(entity["user_doc"]) if entity and "user_doc" in entity else None)

    def put_user(self, record: UserRecord) -> None:
        # "user_doc", not "doc": a release that lists tokens reads no token in it
        entity = {"PartitionKey": key(record.user), "RowKey": self.USER_ROW, "user_doc": record.model_dump_json()}
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise _failure(e, "store user") from e

    def secret(self) -> bytes:
        for _ in range(2):
            entity = _get(self.table, self.SECRET_KEY, "", "read the stack secret")
            if entity is not None:
                return base64.b64decode(entity["secret"])
            made = base64.b64encode(secrets.token_bytes(32)).decode()
            try:
                self.table.create_entity({"PartitionKey": self.SECRET_KEY, "RowKey": "", "secret": made})
            except ResourceExistsError:
                continue  # another instance made it first: read that one
            except AzureError as e:
                raise _failure(e, "store the stack secret") from e
        raise BackendError("the stack secret could not be read or made; retry")


def _token(entity: Mapping[str, Any] | None) -> ApiToken | None:
    """The token of an entity; None for none, or for one that does not hold a valid token."""
    if not entity or "doc" not in entity:
        return None
    try:
        return ApiToken.model_validate_json(str(entity["doc"]))
    except ValueError:
        return None


class TablePoolStateStore:
    """The dispatcher's per-pool records, one entity per pool: the document as JSON, written
    only while the stored ``version`` is the one the writer read."""

    PARTITION = "p"

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def _read(self, pool: str) -> tuple[PoolRecord | None, str]:
        entity = _get(self.table, self.PARTITION, key(pool), "read pool record")
        if entity is None:
            return None, ""
        return PoolRecord.model_validate(unpack(entity)), str(entity.metadata["etag"])

    def get(self, pool: str) -> PoolRecord:
        return self._read(pool)[0] or PoolRecord(pool=pool)

    def save(self, record: PoolRecord) -> PoolRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        entity = {
            "PartitionKey": self.PARTITION,
            "RowKey": key(record.pool),
            "version": stored.version,
            **pack(stored.model_dump(mode="json"), f"pool record {record.pool}"),
        }
        changed = ConditionFailed(
            f"pool {record.pool}: record changed since version {record.version}", pool=record.pool
        )
        current, etag = self._read(record.pool)
        if current is not None and current.version != record.version:
            raise changed
        try:
            if current is None:
                self.table.create_entity(entity)
            else:
                self.table.update_entity(
                    entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
                )
        except (ResourceExistsError, ResourceModifiedError) as e:
            # written since our read: every write bumps the version, so ours is stale
            raise changed from e
        except AzureError as e:
            raise _failure(e, "write pool record") from e
        return stored


class TableQuotaStore:
    """Quotas and usage records in one table: PartitionKey ``quota`` or ``usage``, RowKey the
    escaped ``user:alice`` / ``group:vision``, the document as JSON; and lanes, PartitionKey
    ``lane``, RowKey ``{pool}:{priority}:{user}`` (pool and user escaped). Usage records and lanes
    are written only while their stored ``version`` is the one the writer read: created only if
    absent, replaced only with the ETag read along with that version, so of two racing writers one
    fails."""

    QUOTA, USAGE, LANE = "quota", "usage", "lane"

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def _query(self, partition: str, what: str) -> list[Any]:
        try:
            return list(self.table.query_entities("PartitionKey eq @pk", parameters={"pk": partition}))
        except AzureError as e:
            raise _failure(e, what) from e

    def get(self, kind: QuotaKind, name: str) -> Quota | None:
        subject = quota_key(kind, name)
        return _quota(_get(self.table, self.QUOTA, key(subject), "read quota"), subject)

    def put(self, quota: Quota) -> None:
        entity = {"PartitionKey": self.QUOTA, "RowKey": key(quota.key), "doc": quota.model_dump_json()}
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except AzureError as e:
            raise _failure(e, "store quota") from e

    def delete(self, kind: QuotaKind, name: str) -> bool:
        row = key(quota_key(kind, name))
        if _get(self.table, self.QUOTA, row, "delete quota") is None:
            return False
        try:
            self.table.delete_entity(self.QUOTA, row)  # quiet when another delete came first
        except AzureError as e:
            raise _failure(e, "delete quota") from e
        return True

    def list(self) -> list[Quota]:
        found = (_quota(e, _unkey(str(e["RowKey"]))) for e in self._query(self.QUOTA, "list quotas"))
        return sorted((q for q in found if q is not None), key=_subject_order)

    def _read_usage(self, kind: QuotaKind, name: str) -> tuple[UsageRecord, str]:
        """The record and its ETag ("" when none is stored)."""
        entity = _get(self.table, self.USAGE, key(quota_key(kind, name)), "read usage")
        if entity is None:
            return UsageRecord(kind=kind, name=name), ""
        return _usage(entity, kind, name), str(entity.metadata["etag"])

    def usage(self, kind: QuotaKind, name: str) -> UsageRecord:
        return self._read_usage(kind, name)[0]

    def save_usage(self, record: UsageRecord) -> UsageRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        entity = {
            "PartitionKey": self.USAGE,
            "RowKey": key(record.key),
            "version": stored.version,
            **pack(stored.model_dump(mode="json"), f"usage of {record.key}"),
        }
        changed = ConditionFailed(f"usage of {record.key}: changed since version {record.version}", key=record.key)
        current, etag = self._read_usage(record.kind, record.name)
        if current.version != record.version:
            raise changed
        self._write_versioned(entity, etag, changed, "write usage")
        return stored

    def _write_versioned(self, entity: dict[str, Any], etag: str, changed: ConditionFailed, what: str) -> None:
        """Create ``entity`` (no ``etag``: none was read) or replace the one read with ``etag``;
        raises ``changed`` when it was written (or removed) since that read."""
        try:
            if not etag:
                self.table.create_entity(entity)
            else:
                self.table.update_entity(
                    entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
                )
        except (ResourceExistsError, ResourceModifiedError) as e:
            raise changed from e  # written since our read: every write bumps the version, so ours is stale
        except ResourceNotFoundError as e:
            if error_code(e) == TableErrorCode.TABLE_NOT_FOUND:
                raise _failure(e, what) from e
            raise changed from e  # removed since our read
        except AzureError as e:
            raise _failure(e, what) from e

    def _read_lane(self, pool: str, user: str, priority: int) -> tuple[Lane, str]:
        """The lane and its ETag ("" when none is stored)."""
        entity = _get(self.table, self.LANE, _lane_key(pool, user, priority), "read lane")
        if entity is None:
            return Lane(pool=pool, user=user, priority=priority), ""
        return _lane(entity, pool, user, priority), str(entity.metadata["etag"])

    def lane(self, pool: str, user: str, priority: int) -> Lane:
        return self._read_lane(pool, user, priority)[0]

    def save_lane(self, lane: Lane) -> Lane:
        stored = lane.model_copy(update={"version": lane.version + 1})
        what = f"lane {lane.pool}/{lane.priority}/{lane.user}"
        entity = {
            "PartitionKey": self.LANE,
            "RowKey": _lane_key(lane.pool, lane.user, lane.priority),
            "version": stored.version,
            **pack(stored.model_dump(mode="json"), what),
        }
        subject = f"{lane.pool}:{lane.priority}:{lane.user}"
        changed = ConditionFailed(f"{what}: changed since version {lane.version}", key=subject)
        current, etag = self._read_lane(lane.pool, lane.user, lane.priority)
        if current.version != lane.version:
            raise changed
        self._write_versioned(entity, etag, changed, "write lane")
        return stored

    def list_usage(self) -> builtins.list[UsageRecord]:  # ``list`` here is the method above
        records = []
        for entity in self._query(self.USAGE, "list usage"):
            kind, _, name = _unkey(str(entity["RowKey"])).partition(":")
            if kind in ("user", "group"):
                records.append(_usage(entity, kind, name))  # type: ignore[arg-type]
        return sorted(records, key=_subject_order)


def _lane_key(pool: str, user: str, priority: int) -> str:
    return f"{key(pool)}:{priority}:{key(user)}"


def _unkey(escaped: str) -> str:
    """What ``key`` escaped, read back."""
    return re.sub(r"(?:~[0-9A-F]{2})+", lambda m: bytes.fromhex(m.group().replace("~", "")).decode(), escaped)


def _subject_order(subject: Quota | UsageRecord) -> tuple[bool, str]:
    """Users first, each kind by name."""
    return subject.kind != "user", subject.name


def _quota(entity: Mapping[str, Any] | None, subject: str) -> Quota | None:
    """The quota of an entity; None for none, or for one that does not hold a valid quota of
    ``subject``."""
    if not entity or "doc" not in entity:
        return None
    try:
        quota = Quota.model_validate_json(str(entity["doc"]))
    except ValueError:
        return None
    return quota if quota.key == subject else None


def _lane(entity: Mapping[str, Any], pool: str, user: str, priority: int) -> Lane:
    """The lane of an entity. One that does not hold a valid lane of ``pool``, ``user`` and
    ``priority`` reads as a fresh lane at the stored version (0 when it has none), so the next
    write replaces it."""
    fresh = Lane(pool=pool, user=user, priority=priority)
    version = entity.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        return fresh
    try:
        lane = Lane.model_validate(unpack(entity))
    except (ValueError, KeyError, TypeError):
        return fresh.model_copy(update={"version": version})
    if (lane.pool, lane.user, lane.priority, lane.version) != (pool, user, priority, version):
        return fresh.model_copy(update={"version": version})
    return lane


def _usage(entity: Mapping[str, Any], kind: QuotaKind, name: str) -> UsageRecord:
    """The usage record of an entity. One that does not hold a valid record of ``kind`` ``name``
    reads as a fresh record at the stored version (0 when it has none), so the next write
    replaces it."""
    fresh = UsageRecord(kind=kind, name=name)
    version = entity.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        return fresh
    try:
        record = UsageRecord.model_validate(unpack(entity))
    except (ValueError, KeyError, TypeError):
        record = None
    if record is None or record.key != fresh.key or record.version != version:
        return fresh.model_copy(update={"version": version})
    return record
