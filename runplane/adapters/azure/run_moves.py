"""Moving a run to another pool in the runs table: the run leaves its pool's partition for another's.

A run lives in its pool's partition (``runplane.adapters.azure.runs``), and no transaction spans two
partitions, so a move from pool A to pool B is a protocol of steps, each one write, any of which may
be the last its mover makes (it may die). Marks beside the run's document in its rows say where a
move stands:

0. ``reserve``: A's main row, if still at the ETag of the run as read (the write ``Expect`` was
   checked against), gets the move's token ``move``. Only a move whose token A's main row holds can
   depart (step 2 is conditional on the ETag this write leaves), so of two movers at once one
   departs at most, and rows whose token A does not hold are a leftover nobody will count.
1. ``arrive``: B's partition gets the moved run's rows (main row and copies, one transaction),
   marked *arriving* (``moved_from`` A, the token); a leftover there (``_clear``: rows whose token
   A's main row does not hold) is deleted first, and a departed row of an earlier move away from B
   is finished. The owner row learns B as ``next`` beside A. An
   arriving row counts only once A's main row has departed with the same token: until then the run
   is in A for every reader.
2. ``depart``: the move itself, one transaction in A conditional on the ETag the reservation left:
   A's main row becomes the moved run marked *departed* (``moving_to`` B, the token) and the run's
   copies in A go. From here on the run is in B: A holds no copy (no listing, line, count or purge
   index of A has it) and B's arriving rows count. A write that came between makes it fail; the
   mover removes its arriving rows (if A does not hold their token) and reads again.
3. ``complete`` (anyone may do it, any number of times), in this order: ``repoint`` the ``id:``
   row at B (with its ETag, only while it names A) and the owner row at the pool the ``id:`` row
   names now; ``settle`` B's rows (their marks removed, with B's main row's ETag); then ``leave``:
   delete A's departed row. So an unmarked row of the run in B means the ``id:`` row names B (or a
   pool the run moved on to from there), and a later move's repointing is never undone.

Every reader and writer that meets a departed row, or an arriving row whose source departed,
finishes the move before it goes on; one that meets an arriving row whose source has not departed
treats the run as A's; one whose pool (remembered, or from a copy of the run) holds no row of the
run looks the ``id:`` row up again. So no reader finds the run in both pools or in neither, a claim
is one ETag write of the one row that counts, and a mover that dies leaves the move for the next
reader or writer to finish (before step 2: a leftover nobody counts). Rows of the run missing from B
while A's departed row lingers are written again from it only while the ``id:`` row still names A
(the run has neither moved on from B nor been deleted since).
"""

from __future__ import annotations

import builtins
import logging
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, TableErrorCode, TableTransactionError, UpdateMode

from runplane.adapters.azure.errors import error_code
from runplane.adapters.azure.run_rows import copy_keys, entities, main_key, partition
from runplane.adapters.azure.tables import document, failure, get_entity, key, newest_first, packed
from runplane.domain.errors import BackendError, RunplaneError
from runplane.domain.runs import Run

log = logging.getLogger(__name__)

MOVE, FROM, TO, RUN = "move", "moved_from", "moving_to", "move_run"
"""The marks of a move: its token; on arriving rows the pool left and the run's id; on the departed
row the pool gone to."""

NEXT = "next"
"""The owner row's property naming the pool a run is moving to (its ``queue`` names the one it is in)."""

MARKS = (MOVE, FROM, RUN)
"""What a listing that reads a few properties of a row selects to tell whether it counts (``source``)."""

_IF_SAME = {"match_condition": MatchConditions.IfNotModified}


def departed(entity: Any) -> bool:
    return bool(entity.get(TO))


def arriving(entity: Any) -> bool:
    return bool(entity.get(FROM))


def source(table: TableClient, entity: Any) -> Any | None:
    """For an arriving row, its source's main row when it departed with the row's move (the row
    counts); None when it did not (the row is a leftover)."""
    found = get_entity(table, partition(str(entity[FROM])), main_key(str(entity[RUN])), "read run")
    return found if found is not None and departed(found) and found.get(MOVE) == entity.get(MOVE) else None


def counts(table: TableClient, entity: Any) -> bool:
    """Whether a row a scan of a partition found is the run's: any but an arriving row whose move
    has not departed."""
    return not arriving(entity) or source(table, entity) is not None


def _owner_row(run: Run) -> tuple[str, str]:
    return f"o:{key(run.owner)}", f"{newest_first(run.created_at)}:{key(run.id)}"


def _submit(table: TableClient, operations: builtins.list[Any], what: str) -> None:
    try:
        table.submit_transaction(operations)
    except AzureError as e:
        if isinstance(e, TableTransactionError):
            raise
        raise failure(e, what) from e


def reserve(table: TableClient, current: Run, etag: str, token: str) -> str | None:
    """Step 0: the move's ``token`` on the run's main row in its pool, if still at ``etag``. The
    row's new ETag; None when a write came between (read again)."""
    row = {"PartitionKey": partition(current.queue), "RowKey": main_key(current.id), MOVE: token}
    try:
        answer = table.update_entity(row, mode=UpdateMode.MERGE, etag=etag, **_IF_SAME)
    except (ResourceModifiedError, ResourceNotFoundError):
        return None
    except AzureError as e:
        raise failure(e, "move run") from e
    return str(answer["etag"])


def holds_token(table: TableClient, entity: Any) -> bool:
    """Whether the source's main row of an arriving row holds the row's token: its move reserved
    there (it may yet depart) or departed. Rows whose token it does not hold never count."""
    found = get_entity(table, partition(str(entity[FROM])), main_key(str(entity[RUN])), "read run")
    return found is not None and found.get(MOVE) == entity.get(MOVE)


def arrive(table: TableClient, new: Run, left: str, token: str) -> None:
    """Step 1: the moved run ``new``'s rows in its new pool's partition, marked arriving from pool
    ``left``; a leftover of a move that never departed is replaced."""
    marks = {MOVE: token, FROM: left, RUN: new.id}
    rows = [entity for entity in entities(new, marks) if entity is not None]
    for _ in range(3):
        try:
            _submit(table, [("create", entity) for entity in rows], "move run")
            break
        except TableTransactionError as e:
            if error_code(e) != TableErrorCode.ENTITY_ALREADY_EXISTS:
                raise failure(e, "move run") from e
            _clear(table, new)
    else:
        raise BackendError(f"move run {new.id}: pool {new.queue} holds rows of it that are not a move's")
    partition_key, row_key = _owner_row(new)
    try:
        table.update_entity({"PartitionKey": partition_key, "RowKey": row_key, NEXT: new.queue}, mode=UpdateMode.MERGE)
    except ResourceNotFoundError:
        pass  # no owner row: a create that stopped half-way, which listings skip anyway
    except AzureError as e:
        raise failure(e, "move run") from e


def _clear(table: TableClient, new: Run) -> None:
    """Delete the rows of ``new``'s run in its new pool's partition if they are a leftover: arriving
    rows whose token their source's main row does not hold (their move can never depart); or the
    departed row of an earlier move away from there that its mover left (it is finished)."""
    found = get_entity(table, partition(new.queue), main_key(new.id), "move run")
    if found is not None and departed(found):
        finish(table, new.queue, found)
    elif found is not None and arriving(found) and not holds_token(table, found):
        _delete(table, found)


def _delete(table: TableClient, found: Any) -> None:
    """Delete a main row as read (its ETag) and the copies its run has, in one transaction."""
    stored = document(Run, found)
    where = partition(stored.queue)
    etag = {"etag": str(found.metadata["etag"]), **_IF_SAME}
    operations: builtins.list[Any] = [("delete", {"PartitionKey": where, "RowKey": main_key(stored.id)}, etag)]
    operations += [("delete", {"PartitionKey": where, "RowKey": row}) for row in copy_keys(stored)]
    try:
        _submit(table, operations, "move run")
    except TableTransactionError as e:
        if error_code(e) not in (TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED, TableErrorCode.RESOURCE_NOT_FOUND):
            raise failure(e, "move run") from e


def abandon(table: TableClient, new: Run, token: str) -> None:
    """Remove the arriving rows of a move that did not depart (its conditional write lost to
    another, which took its token off the source's main row)."""
    found = get_entity(table, partition(new.queue), main_key(new.id), "move run")
    if found is not None and arriving(found) and found.get(MOVE) == token and not holds_token(table, found):
        _delete(table, found)


def depart(
    table: TableClient, current: Run, etag: str, new: Run, token: str, absent: frozenset[str] = frozenset()
) -> None:
    """Step 2, the move: the run's main row in its partition, if still at ``etag``, becomes ``new``
    marked departed; its copies there (but those known ``absent``) go. Raises TableTransactionError
    as the transaction failed (UPDATE_CONDITION_NOT_SATISFIED: written since the read); a failure
    with no answer is BackendError unless the row read afterwards shows the departure made."""
    where = partition(current.queue)
    main = {
        "PartitionKey": where,
        "RowKey": main_key(current.id),
        "state": str(new.state),
        **packed(new, f"run {new.id}"),
        MOVE: token,
        TO: new.queue,
    }
    operations: builtins.list[Any] = [("update", main, {"mode": UpdateMode.REPLACE, "etag": etag, **_IF_SAME})]
    operations += [
        ("delete", {"PartitionKey": where, "RowKey": row}) for row in copy_keys(current) if row not in absent
    ]
    try:
        table.submit_transaction(operations)
    except TableTransactionError:
        raise
    except AzureError as e:  # no answer: the departure may have been made all the same
        found = get_entity(table, where, main_key(current.id), "move run")
        if found is None or not departed(found) or found.get(MOVE) != token:
            raise failure(e, "move run") from e
        log.warning("run %s: its move to pool %s was made, its answer lost: %s", new.id, new.queue, e)


def finish(table: TableClient, left: str, entity: Any) -> str:
    """Step 3 of the move whose departed row (in pool ``left``) is ``entity``. Idempotent; returns
    the pool the move took the run to."""
    new = document(Run, entity)
    complete(table, new, left, str(entity[MOVE]))
    return new.queue


def complete(table: TableClient, new: Run, left: str, token: str) -> None:
    """Step 3 of the move ``token`` of ``new``'s run from pool ``left``: repoint, settle, leave."""
    repoint(table, new, left)
    settle(table, new, left, token)
    leave(table, left, new.id, token)


def completed(table: TableClient, new: Run, left: str, token: str) -> Run:
    """The mover's step 3, after its departure: a failure is logged, not raised (the move is made,
    and the next reader or writer of the run finishes it). Returns ``new``."""
    try:
        complete(table, new, left, token)
    except RunplaneError as e:
        log.warning("run %s moved to pool %s; its move is finished by its next reader: %s", new.id, new.queue, e)
    return new


def settle(table: TableClient, new: Run, left: str, token: str) -> None:
    """Step 3b: the run's rows in its new pool without their marks. Rows missing there (or another
    move's) are written again from ``new`` (the departed row) only while the ``id:`` row names pool
    ``left`` and that departed row is still there: never once the run moved on or was deleted."""
    found = get_entity(table, partition(new.queue), main_key(new.id), "move run")
    if found is not None and not (arriving(found) and found.get(MOVE) != token):
        if not arriving(found):
            return  # settled already (and maybe written since), or moved on from there
        rows = entities(document(Run, found))
        etag = {"mode": UpdateMode.REPLACE, "etag": str(found.metadata["etag"]), **_IF_SAME}
        operations: builtins.list[Any] = [("update", rows[0], etag)]
        operations += [("upsert", row, {"mode": UpdateMode.REPLACE}) for row in rows[1:] if row is not None]
        try:
            _submit(table, operations, "move run")
        except TableTransactionError as e:
            if error_code(e) != TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED:
                raise failure(e, "move run") from e
        return
    pointer = get_entity(table, f"id:{key(new.id)}", "", "move run")
    if pointer is None or pointer.get("queue") != left:
        return  # deleted, or moved on (an unmarked row in the new pool means the id: row names it)
    gone = get_entity(table, partition(left), main_key(new.id), "move run")
    if gone is None or not departed(gone) or gone.get(MOVE) != token:
        return  # finished by another
    if found is not None:
        _delete(table, found)
    fresh = [row for row in entities(new) if row is not None]
    try:
        _submit(table, [("create", row) for row in fresh], "move run")
    except TableTransactionError as e:
        if error_code(e) != TableErrorCode.ENTITY_ALREADY_EXISTS:
            raise failure(e, "move run") from e


def repoint(table: TableClient, new: Run, left: str) -> None:
    """Step 3a: the ``id:`` row names the run's new pool, only while it names pool ``left``; then
    the owner row, while it names ``left``, names the pool the ``id:`` row names now (never one the
    run has left). Each is an ETag write: a later move's repointing is never undone."""
    pointer = f"id:{key(new.id)}", ""
    found = get_entity(table, *pointer, "move run")
    if found is not None and found.get("queue") == left:
        _point(table, found, new.queue, None)
        found = get_entity(table, *pointer, "move run")
    owner = get_entity(table, *_owner_row(new), "move run")
    if found is None or owner is None or owner.get("queue") != left or found.get("queue") == left:
        return
    now = str(found["queue"])
    _point(table, owner, now, owner.get(NEXT) if owner.get(NEXT) not in (left, new.queue, now) else None)


def _point(table: TableClient, found: Any, queue: str, next_pool: Any) -> None:
    """Replace a pointer row (as read: its ETag) with one naming ``queue`` (and ``next_pool``)."""
    row = {"PartitionKey": found["PartitionKey"], "RowKey": found["RowKey"], "queue": queue}
    if next_pool:
        row[NEXT] = next_pool
    try:
        table.update_entity(row, mode=UpdateMode.REPLACE, etag=str(found.metadata["etag"]), **_IF_SAME)
    except (ResourceModifiedError, ResourceNotFoundError):
        pass  # another finisher (or a delete) got there first
    except AzureError as e:
        raise failure(e, "move run") from e


def leave(table: TableClient, left: str, run_id: str, token: str) -> None:
    """Step 3c: delete the departed row of the move ``token`` in pool ``left``."""
    found = get_entity(table, partition(left), main_key(run_id), "move run")
    if found is None or not departed(found) or found.get(MOVE) != token:
        return
    try:
        table.delete_entity(partition(left), main_key(run_id), etag=str(found.metadata["etag"]), **_IF_SAME)
    except (ResourceModifiedError, ResourceNotFoundError):
        pass
    except AzureError as e:
        raise failure(e, "move run") from e
