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
``o:{owner}``         ``{newest}:{id}``                the owner's index: points at the run's queue (and,
                                                       during a move, at the next one: ``next``)
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
``id:`` entry (one extra read per id and process: it changes only when the run moves, so it is cached).

The ``id:`` and owner entries are written before the run and change only when a move (``move``:
the protocol of ``run_moves``, which every read and write finishes when it meets it half-way)
takes the run to another pool's partition. A failure between these
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
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError
from azure.data.tables import TableClient, TableErrorCode, TableTransactionError, UpdateMode

from runplane.adapters.azure import run_moves as moves
from runplane.adapters.azure.errors import error_code
from runplane.adapters.azure.run_rows import (
    LAST_DUE,
    copy_key,
    copy_keys,
    entities,
    main_key,
    partition,
    purge_key,
    rank_key,
    state_prefix,
)
from runplane.adapters.azure.tables import (
    document,
    failure,
    get_entity,
    key,
    newest_first,
    row_after,
    row_cursor,
    unkey,
)
from runplane.adapters.records import check_changes, jsonable, record
from runplane.domain.errors import AlreadyExists, BackendError, ConditionFailed, Conflict, NotFound
from runplane.domain.expect import Expect
from runplane.domain.ranks import rank_prefix
from runplane.domain.records import add_event, bound_changes
from runplane.domain.retention import purge_due
from runplane.domain.runs import MAX_DEPENDENTS, WAITING, Event, Run
from runplane.domain.states import RunState
from runplane.ports import LIST_BUDGET, Page

MAX_WRITE_TRIES = 50


_FETCH_THREADS = 8


_ID_CACHE = 10_000


class TableRunStore:
    """Runs in one table (see the module docstring for its layout)."""

    def __init__(self, table: TableClient, list_budget: int = LIST_BUDGET) -> None:
        self.table = table
        self.list_budget = list_budget
        self._queues: dict[str, str] = {}
        self._lock = threading.Lock()

    def _read(self, queue: str, run_id: str) -> tuple[Run, str]:
        """The run and its ETag. Raises NotFound."""
        entity = get_entity(self.table, partition(queue), main_key(run_id), "read run")
        if entity is None:
            raise NotFound(f"run {run_id} not found")
        return document(Run, entity), str(entity.metadata["etag"])

    def _queue_of(self, run_id: str, fresh: bool = False) -> str:
        """The run's pool: remembered, or (``fresh``: always) as the ``id:`` row names it."""
        queue = None if fresh else self._queues.get(run_id)
        if queue is not None:
            return queue
        entity = get_entity(self.table, f"id:{key(run_id)}", "", "read run")
        if entity is None:
            raise NotFound(f"run {run_id} not found")
        self._remember(run_id, str(entity["queue"]))
        return str(entity["queue"])

    def _locate(self, run_id: str, hint: str | None = None) -> tuple[Run, str, str]:
        """The run, the ETag of its main row and its pool, wherever a move left it (see
        ``run_moves``): a move met half-way is finished first; a pool (``hint``, or remembered) that
        holds no row of the run that counts is looked up again in the ``id:`` row. Raises NotFound."""
        queue = hint if hint is not None else self._queue_of(run_id)
        for _ in range(MAX_WRITE_TRIES):
            entity = get_entity(self.table, partition(queue), main_key(run_id), "read run")
            if entity is not None and moves.departed(entity):
                queue = moves.finish(self.table, queue, entity)
                continue
            if entity is not None and moves.arriving(entity):
                left = moves.source(self.table, entity)
                if left is not None:
                    queue = moves.finish(self.table, str(entity[moves.FROM]), left)
                    continue
                entity = None  # a leftover of a move that never departed
            if entity is None:
                found = self._queue_of(run_id, fresh=True)
                if found == queue:
                    raise NotFound(f"run {run_id} not found")
                queue = found
                continue
            self._remember(run_id, queue)
            return document(Run, entity), str(entity.metadata["etag"]), queue
        raise BackendError(f"read run {run_id}: it moved {MAX_WRITE_TRIES} times while read; retry")

    def _remember(self, run_id: str, queue: str) -> None:
        with self._lock:
            if len(self._queues) >= _ID_CACHE:
                self._queues.clear()
            self._queues[run_id] = queue

    # -- the port -------------------------------------------------------------------------

    def create(self, run: Run) -> Run:
        main, copy, ranked, purged = entities(run)  # PayloadTooLarge before anything is written
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
        return self._locate(run_id)[0]

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

    def move(self, run: Run, expect: Expect, queue: str, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        check_changes(changes)
        bounded = bound_changes(changes)
        absent_at: tuple[str, frozenset[str]] = ("", frozenset())
        for _ in range(MAX_WRITE_TRIES):
            current, etag, where = self._locate(run.id, run.queue)
            if where != run.queue:
                raise ConditionFailed(f"run {run.id} is on pool {where}, not {run.queue}", run=current)
            if not expect.holds(current):
                raise ConditionFailed(f"run {run.id} is {current.state} at attempt {current.attempt}", run=current)
            if where == queue:
                return self.update(current, expect, changes, event)
            absent = absent_at[1] if absent_at[0] == etag else frozenset()
            data = jsonable(current)
            data.update({field: jsonable(value) for field, value in bounded.items()}, queue=queue)
            new = record(Run, data)
            if event is not None:
                new.events = add_event(new.events, event)
            token = uuid.uuid4().hex
            reserved = moves.reserve(self.table, current, etag, token)
            if reserved is None:
                continue  # another write came between our read and ours: check again
            moves.arrive(self.table, new, where, token)
            try:
                moves.depart(self.table, current, reserved, new, token, absent)
            except TableTransactionError as e:
                moves.abandon(self.table, new, token)
                if error_code(e) == TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED:
                    continue  # another write came between our read and ours: check again
                if error_code(e) == TableErrorCode.RESOURCE_NOT_FOUND:
                    absent_at = (reserved, absent | self._absent(partition(where), copy_keys(current)))
                    continue
                raise failure(e, "move run") from e
            self._remember(run.id, queue)
            return moves.completed(self.table, new, where, token)
        raise BackendError(f"move run {run.id}: {MAX_WRITE_TRIES} concurrent writes won over this one; retry")

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
        hint = run.queue
        for _ in range(MAX_WRITE_TRIES):
            current, etag, hint = self._locate(run.id, hint)
            absent = absent_at[1] if absent_at[0] == etag else frozenset()
            changes = change(current)
            if changes is None:
                return current
            data = jsonable(current)
            data.update({field: jsonable(value) for field, value in changes.items()})
            new = record(Run, data)
            if event is not None:  # the timeline keeps its first event and the latest ones
                new.events = add_event(new.events, event)
            main, copy, ranked, purged = entities(new)
            operations: list[Any] = [
                (
                    "update",
                    main,
                    {"mode": UpdateMode.REPLACE, "etag": etag, "match_condition": MatchConditions.IfNotModified},
                )
            ]
            old_copy = copy_key(current)
            if old_copy != copy["RowKey"]:
                operations.append(("delete", {"PartitionKey": main["PartitionKey"], "RowKey": old_copy}))
            operations.append(("upsert", copy, {"mode": UpdateMode.REPLACE}))
            removes: list[str] = []
            for old, entity in ((rank_key(current), ranked), (purge_key(current), purged)):
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

    def _absent(self, where: str, rows: builtins.list[str]) -> frozenset[str]:
        """Which of these rows of partition ``where`` do not exist."""
        return frozenset(row for row in rows if get_entity(self.table, where, row, "update run") is None)

    def due(self, queue: str, now: float, limit: int = 100) -> builtins.list[Run]:
        if limit <= 0:
            return []
        before = f"p:{min(max(now, 0.0), LAST_DUE):017.6f};"  # past every key of a run due at ``now``
        rows = self._scan(partition(queue), "p:", before, min(limit, 1000), "read the runs due for retention")
        # a key holds the time to the microsecond: one rounded down to ``now`` may be a hair later
        runs = (document(Run, entity) for entity in rows)
        due = (run for run in runs if (at := purge_due(run)) is not None and at <= now)
        return builtins.list(itertools.islice(due, limit))

    def delete(self, run_id: str, now: float) -> None:
        absent_at: tuple[str, frozenset[str]] = ("", frozenset())
        for _ in range(MAX_WRITE_TRIES):
            current, etag, queue = self._locate(run_id)
            where = partition(queue)
            due = purge_due(current)
            if due is None or due > now:
                raise ConditionFailed(f"run {run_id} is not due for deletion", run=current)
            absent = absent_at[1] if absent_at[0] == etag else frozenset()
            copies = [
                row
                for row in (copy_key(current), rank_key(current), purge_key(current))
                if row is not None and row not in absent
            ]
            operations: list[Any] = [
                (
                    "delete",
                    {"PartitionKey": where, "RowKey": main_key(run_id)},
                    {"etag": etag, "match_condition": MatchConditions.IfNotModified},
                ),
                *(("delete", {"PartitionKey": where, "RowKey": row}) for row in copies),
            ]
            try:
                self.table.submit_transaction(operations)
            except TableTransactionError as e:
                if error_code(e) == TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED:
                    continue  # written (or deleted) since our read: check again
                if error_code(e) == TableErrorCode.RESOURCE_NOT_FOUND:
                    absent_at = (etag, absent | self._absent(where, copies))
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
        prefix = state_prefix(state)
        after = row_after(cursor, prefix) if cursor else prefix
        runs: list[Run] = []
        for entity in self._scan(partition(queue), after, prefix[:-1] + ";", min(limit, 1000), "list runs"):
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
            f"o:{key(owner)}", after, "~", min(max(limit, 20), 1000), "list runs", ("RowKey", "queue", moves.NEXT)
        )
        examined, last, exhausted = 0, "", False
        with ThreadPoolExecutor(_FETCH_THREADS, thread_name_prefix="runs-list") as pool:
            while True:
                batch.clear()
                for entity in pointers:
                    examined += 1
                    last = str(entity["RowKey"])
                    if queue is None or queue in (entity["queue"], entity.get(moves.NEXT)):  # NEXT: a move's
                        batch.append((last, str(entity["queue"]), last.partition(":")[2]))
                    if len(batch) == limit - len(runs) or examined >= self.list_budget:
                        break
                else:
                    exhausted = True
                found = pool.map(lambda p: self._maybe(p[1], p[2]), batch)
                for (row, _, _), run in zip(batch, found, strict=True):
                    if run is None or run.owner != owner or newest_first(run.created_at) != row.partition(":")[0]:
                        continue  # an entry of a create that failed half-way, or of another user's id
                    if (state is not None and run.state != state) or (queue is not None and run.queue != queue):
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
        return row_cursor(copy_key(run))

    def _maybe(self, queue: str, escaped_id: str) -> Run | None:
        try:
            return self._locate(unkey(escaped_id), queue)[0]
        except NotFound:
            return None

    def _scan(
        self, where: str, after: str, before: str, page: int, what: str, select: tuple[str, ...] = ()
    ) -> Iterator[Mapping[str, Any]]:
        """Entities of one partition with ``after < RowKey < before``, in RowKey order; but the
        arriving rows of a move that has not departed (``run_moves``: selected, ``MARKS`` tell)."""
        found = self.table.query_entities(
            "PartitionKey eq @pk and RowKey gt @after and RowKey lt @before",
            parameters={"pk": where, "after": after, "before": before},
            results_per_page=page,
            select=[*select] or None,
        )
        try:
            yield from (entity for entity in found if moves.counts(self.table, entity))
        except AzureError as e:
            raise failure(e, what) from e

    def head(self, queue: str, limit: int, priority: int | None = None) -> builtins.list[Run]:
        if limit <= 0:
            return []
        prefix = "r:" + (key(rank_prefix(priority)) if priority is not None else "")
        before = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first key past every one with the prefix
        rows = self._scan(partition(queue), prefix, before, min(limit, 1000), "read the head of the queue")
        return [document(Run, entity) for entity in itertools.islice(rows, limit)]

    def count(self, queue: str, state: RunState, cap: int = 10000) -> int:
        if cap <= 0:
            return 0
        prefix = state_prefix(state)
        total = 0
        for _ in self._scan(
            partition(queue), prefix, prefix[:-1] + ";", min(max(cap, 1), 1000), "count runs", ("RowKey", *moves.MARKS)
        ):
            total += 1
            if total >= cap:
                break
        return total
