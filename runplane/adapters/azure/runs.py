"""Table storage runs (ETag compare-and-set), and the layout of the runs table.

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
``q:{queue}``         ``p:{due}:{id}``                 a copy of a run the retention sweep looks at by
                                                       ``due``: its ``purge_due``, as ``%017.6f``
``id:{id}``           ``""``                           the run's queue: where ``get(id)`` finds it
``o:{owner}``         ``{newest}:{id}``                the owner's index: points at the run's queue
====================  ===============================  ==================================================

``newest`` is an inverted creation time, so a range scan returns newest first. ``rank`` is
``run_rank(run)`` (escaped), the order a pool's queued runs start in; the ``r:`` copy exists exactly
while the run is queued, so ``head`` is a range scan of the ``r:`` rows. Likewise the ``p:`` copy
exists exactly while ``purge_due(run)`` is not None (a finished run that is not kept), so ``due`` is
a range scan of the ``p:`` rows up to its time.

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
``delete`` removes the run and its copies in one transaction conditional on the ETag read, then the
``id:`` and owner entries: a failure between leaves entries that point at no run, as above.

``update`` reads the run, checks ``Expect`` against it and writes back with the ETag it read. A
stale ETag means another write came between: it reads again and checks again, so a write fails
with ConditionFailed exactly when ``Expect`` does not hold for the stored run, as with DynamoDB's
condition expressions, and no concurrent change is ever lost.

A run is stored as JSON split over properties of 32,000 ASCII characters (a property holds 64 KiB
as UTF-16); an entity holds 1 MiB, so a run is limited to ``MAX_RUN_CHARS`` of JSON and a bigger
one is refused with PayloadTooLarge.
"""

from __future__ import annotations

import builtins
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError
from azure.data.tables import TableClient, TableErrorCode, TableTransactionError, UpdateMode

from runplane.adapters.azure.errors import error_code
from runplane.adapters.azure.tables import (
    document,
    failure,
    get_entity,
    key,
    newest_first,
    packed,
    row_after,
    row_cursor,
)
from runplane.adapters.records import check_changes, jsonable, record
from runplane.domain.errors import AlreadyExists, BackendError, ConditionFailed, Conflict, NotFound
from runplane.domain.expect import Expect
from runplane.domain.ranks import rank_prefix
from runplane.domain.records import add_event, bound_changes
from runplane.domain.retention import purge_due
from runplane.domain.runs import MAX_DEPENDENTS, WAITING, Event, Run, listed_state, run_rank
from runplane.domain.states import RunState
from runplane.ports import LIST_BUDGET, Page

MAX_WRITE_TRIES = 50


_FETCH_THREADS = 8


_ID_CACHE = 10_000


_LAST_DUE = 9_999_999_999.999999
"""The latest time a ``p:`` key orders right (``%017.6f`` keeps its width up to it): year 2286."""


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

    @staticmethod
    def _purge_key(run: Run) -> str | None:
        """The RowKey of the run's copy in the retention sweep's index; None when the sweep never
        looks at it (not finished, or kept)."""
        due = purge_due(run)
        return None if due is None else f"p:{min(max(due, 0.0), _LAST_DUE):017.6f}:{key(run.id)}"

    @classmethod
    def _entities(cls, run: Run) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
        """The run, its state copy, while it is queued its copy in the line, and while the
        retention sweep is to look at it its copy in that index."""
        body = {"state": str(run.state), **packed(run, f"run {run.id}")}
        partition = cls._partition(run.queue)
        rank, purge = cls._rank_key(run), cls._purge_key(run)
        return (
            {"PartitionKey": partition, "RowKey": f"run:{key(run.id)}", **body},
            {"PartitionKey": partition, "RowKey": cls._copy_key(run), **body},
            {"PartitionKey": partition, "RowKey": rank, **body} if rank is not None else None,
            {"PartitionKey": partition, "RowKey": purge, **body} if purge is not None else None,
        )

    def _read(self, queue: str, run_id: str) -> tuple[Run, str]:
        """The run and its ETag. Raises NotFound."""
        entity = get_entity(self.table, self._partition(queue), f"run:{key(run_id)}", "read run")
        if entity is None:
            raise NotFound(f"run {run_id} not found")
        return document(Run, entity), str(entity.metadata["etag"])

    def _queue_of(self, run_id: str) -> str:
        queue = self._queues.get(run_id)
        if queue is not None:
            return queue
        entity = get_entity(self.table, f"id:{key(run_id)}", "", "read run")
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
        main, copy, ranked, purged = self._entities(run)  # PayloadTooLarge before anything is written
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
            raise failure(e, "store run") from e
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
                [("create", main), ("create", copy)] + [("create", e) for e in (ranked, purged) if e is not None]
            )
        except TableTransactionError as e:
            if error_code(e) == TableErrorCode.ENTITY_ALREADY_EXISTS:
                existing, _ = self._read(run.queue, run.id)
                raise AlreadyExists(f"run {run.id} exists", run=existing) from e
            raise failure(e, "store run") from e
        except AzureError as e:
            raise failure(e, "store run") from e
        return run

    def get(self, run_id: str) -> Run:
        return self._read(self._queue_of(run_id), run_id)[0]

    def update(self, run: Run, expect: Expect, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        check_changes(changes)
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
        # the ETag of a read and the copies its run did not have to remove (a run queued before lines
        # existed, one finished before the retention index did): known of that version only, as
        # another writer may have written the copies since
        absent_at: tuple[str, frozenset[str]] = ("", frozenset())
        for _ in range(MAX_WRITE_TRIES):
            current, etag = self._read(run.queue, run.id)
            absent = absent_at[1] if absent_at[0] == etag else frozenset()
            changes = change(current)
            if changes is None:
                return current
            data = jsonable(current)
            data.update({field: jsonable(value) for field, value in changes.items()})
            new = record(Run, data)
            if event is not None:  # the timeline keeps its first event and the latest ones
                new.events = add_event(new.events, event)
            main, copy, ranked, purged = self._entities(new)
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
            removes: list[str] = []
            for old, entity in ((self._rank_key(current), ranked), (self._purge_key(current), purged)):
                if old is not None and old != (entity or {}).get("RowKey") and old not in absent:
                    removes.append(old)
                    operations.append(("delete", {"PartitionKey": main["PartitionKey"], "RowKey": old}))
                if entity is not None:
                    operations.append(("upsert", entity, {"mode": UpdateMode.REPLACE}))
            try:
                self.table.submit_transaction(operations)
            except TableTransactionError as e:
                if error_code(e) == TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED:
                    continue  # another write came between our read and ours: check again
                if error_code(e) == TableErrorCode.RESOURCE_NOT_FOUND and removes:
                    # nothing was written: write it again without the removals of copies not there
                    absent_at = (etag, absent | self._absent(main["PartitionKey"], removes))
                    continue
                raise failure(e, "update run") from e
            except AzureError as e:
                raise failure(e, "update run") from e
            return new
        raise BackendError(f"update run {run.id}: {MAX_WRITE_TRIES} concurrent writes won over this one; retry")

    def _absent(self, partition: str, rows: builtins.list[str]) -> frozenset[str]:
        """Which of these rows of ``partition`` do not exist."""
        return frozenset(row for row in rows if get_entity(self.table, partition, row, "update run") is None)

    def due(self, queue: str, now: float, limit: int = 100) -> builtins.list[Run]:
        if limit <= 0:
            return []
        before = f"p:{min(max(now, 0.0), _LAST_DUE):017.6f};"  # past every key of a run due at ``now``
        rows = self._scan(self._partition(queue), "p:", before, min(limit, 1000), "read the runs due for retention")
        # a key holds the time to the microsecond: one rounded down to ``now`` may be a hair later
        runs = (document(Run, entity) for entity in rows)
        due = (run for run in runs if (at := purge_due(run)) is not None and at <= now)
        return builtins.list(itertools.islice(due, limit))

    def delete(self, run_id: str, now: float) -> None:
        queue = self._queue_of(run_id)
        partition = self._partition(queue)
        absent_at: tuple[str, frozenset[str]] = ("", frozenset())
        for _ in range(MAX_WRITE_TRIES):
            current, etag = self._read(queue, run_id)
            due = purge_due(current)
            if due is None or due > now:
                raise ConditionFailed(f"run {run_id} is not due for deletion", run=current)
            absent = absent_at[1] if absent_at[0] == etag else frozenset()
            copies = [
                row
                for row in (self._copy_key(current), self._rank_key(current), self._purge_key(current))
                if row is not None and row not in absent
            ]
            operations: list[Any] = [
                (
                    "delete",
                    {"PartitionKey": partition, "RowKey": f"run:{key(run_id)}"},
                    {"etag": etag, "match_condition": MatchConditions.IfNotModified},
                ),
                *(("delete", {"PartitionKey": partition, "RowKey": row}) for row in copies),
            ]
            try:
                self.table.submit_transaction(operations)
            except TableTransactionError as e:
                if error_code(e) == TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED:
                    continue  # written (or deleted) since our read: check again
                if error_code(e) == TableErrorCode.RESOURCE_NOT_FOUND:
                    absent_at = (etag, absent | self._absent(partition, copies))
                    continue  # the run itself gone: the read says NotFound
                raise failure(e, "delete run") from e
            except AzureError as e:
                raise failure(e, "delete run") from e
            break
        else:
            raise BackendError(f"delete run {run_id}: {MAX_WRITE_TRIES} concurrent writes won over this one; retry")
        # the entries that point at it: should this stop half-way, they point at no run, which reads skip
        for partition_key, row_key in (
            (f"id:{key(run_id)}", ""),
            (f"o:{key(current.owner)}", f"{newest_first(current.created_at)}:{key(run_id)}"),
        ):
            try:
                self.table.delete_entity(partition_key, row_key)
            except AzureError as e:
                raise failure(e, "delete run") from e
        with self._lock:
            self._queues.pop(run_id, None)

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
        after = row_after(cursor, prefix) if cursor else prefix
        runs: list[Run] = []
        for entity in self._scan(self._partition(queue), after, prefix[:-1] + ";", min(limit, 1000), "list runs"):
            runs.append(document(Run, entity))
            if len(runs) == limit:
                return Page(runs, row_cursor(str(entity["RowKey"])))
        return Page(runs, None)

    def _list_owner(
        self, owner: str, queue: str | None, state: RunState | str | None, limit: int, cursor: str | None
    ) -> Page:
        after = row_after(cursor, "", owner) if cursor else ""
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
                        return Page(runs, row_cursor(row, owner))
                if exhausted:
                    return Page(runs, None)
                if examined >= self.list_budget:  # a short page; the cursor goes on where the reading stopped
                    return Page(runs, row_cursor(last, owner))

    def cursor_after(self, run: Run, owner: str | None = None) -> str:
        if owner is not None:
            return row_cursor(f"{newest_first(run.created_at)}:{key(run.id)}", owner)
        return row_cursor(self._copy_key(run))

    def _maybe(self, queue: str, escaped_id: str) -> Run | None:
        entity = get_entity(self.table, self._partition(queue), f"run:{escaped_id}", "list runs")
        return document(Run, entity) if entity is not None else None

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
            raise failure(e, what) from e

    def head(self, queue: str, limit: int, priority: int | None = None) -> builtins.list[Run]:
        if limit <= 0:
            return []
        prefix = "r:" + (key(rank_prefix(priority)) if priority is not None else "")
        before = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first key past every one with the prefix
        rows = self._scan(self._partition(queue), prefix, before, min(limit, 1000), "read the head of the queue")
        return [document(Run, entity) for entity in itertools.islice(rows, limit)]

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
