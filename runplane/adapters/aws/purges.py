"""The runs table's retention index and TTL, kept right by every write of a run.

A finished run's item carries ``pq`` (its queue) and ``pd`` (``purge_due``: when the retention sweep
must look at it), the keys of the sparse index ``by_purge``, and ``ttl`` (``ttl_at``), DynamoDB's own
backstop, each only while the run derives one. The table holds sweeps' records beside runs: those
carry none of them, so the index never holds one.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from runplane.adapters.aws.dynamodb import PURGE_DUE, PURGE_QUEUE, to_dynamo
from runplane.adapters.aws.resources import RUNS_TTL_ATTRIBUTE
from runplane.adapters.records import jsonable, record
from runplane.domain.retention import purge_due, ttl_at
from runplane.domain.runs import Run

PURGE_SOURCES = ("state", "kept", "finished_at", "retention")
"""The fields ``purge_due`` and ``ttl_at`` derive from (beside ``created_at``, which never changes)."""


def purge_index(
    run: Run,
    changes: Mapping[str, Any],
    names: dict[str, str],
    values: dict[str, Any],
    sets: builtins.list[str],
    removes: builtins.list[str],
    queue: str | None = None,
) -> builtins.list[str]:
    """Keep the retention index (``pq``, ``pd``) and the TTL of ``run`` right under ``changes``: SET
    what the changed run derives, REMOVE what it does not. What it derives from but ``changes`` leave
    is the caller's copy: the conditions returned hold the write to it, so a pin (``kept``) or a
    sweep's dates written meanwhile are never overwritten by what an older copy derives. ``queue``:
    the pool the run is filed under after the write (a move), else its own."""
    changed = record(Run, {**jsonable(run), **{k: jsonable(v) for k, v in changes.items()}})
    names |= {"#pq": PURGE_QUEUE, "#pd": PURGE_DUE, "#ttl": RUNS_TTL_ATTRIBUTE}
    if (due := purge_due(changed)) is None:
        removes += ["#pq", "#pd"]
    else:
        values |= {":pq": {"S": queue or run.queue}, ":pd": to_dynamo(due)}
        sets += ["#pq = :pq", "#pd = :pd"]
    if (expires := ttl_at(changed)) is None:
        removes.append("#ttl")
    else:
        values[":ttl"] = {"N": str(expires)}
        sets.append("#ttl = :ttl")
    conditions: builtins.list[str] = []

    def absent(name: str) -> str:
        values[":null"] = {"S": "NULL"}
        return f"(attribute_not_exists({name}) OR attribute_type({name}, :null))"

    if "state" not in changes:
        names["#state"] = "state"
        values[":was"] = {"S": str(run.state)}
        conditions.append("#state = :was")
    if "kept" not in changes:
        names["#kept"] = "kept"
        values[":kept"] = {"BOOL": True}
        conditions.append("#kept = :kept" if run.kept else "(attribute_not_exists(#kept) OR #kept <> :kept)")
    if "finished_at" not in changes:
        names["#fin"] = "finished_at"
        if run.finished_at is None:
            conditions.append(absent("#fin"))
        else:
            values[":fin"] = to_dynamo(run.finished_at)
            conditions.append("#fin = :fin")
    if "retention" not in changes:
        names["#ret"] = "retention"
        if run.retention is None:
            conditions.append(absent("#ret"))
        else:  # the sweep's dates, as read: when they were worked out, and how much is gone
            names |= {"#chk": "checked_at", "#del": "deleted"}
            values |= {":chk": to_dynamo(run.retention.checked_at), ":del": {"N": str(len(run.retention.deleted))}}
            conditions.append("#ret.#chk = :chk AND size(#ret.#del) = :del")
    return conditions
