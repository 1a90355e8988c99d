"""The rows of a run in the runs table (the layout is the docstring of ``runplane.adapters.azure.runs``):
their keys, and the entities a run is stored as in its pool's partition."""

from __future__ import annotations

from typing import Any

from runplane.adapters.azure.tables import key, newest_first, packed
from runplane.domain.retention import purge_due
from runplane.domain.runs import Run, listed_state, run_rank
from runplane.domain.states import RunState

LAST_DUE = 9_999_999_999.999999
"""The latest time a ``p:`` key orders right (``%017.6f`` keeps its width up to it): year 2286."""

Entities = tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]
"""A run's main row, its state copy, its copy in the line (or None) and in the purge index (or None)."""


def partition(queue: str) -> str:
    return f"q:{key(queue)}"


def main_key(run_id: str) -> str:
    """The RowKey of the run itself in its pool's partition."""
    return f"run:{key(run_id)}"


def state_prefix(state: RunState | str) -> str:
    return f"s:{key(str(state))}:"


def copy_key(run: Run) -> str:
    return f"{state_prefix(listed_state(run))}{newest_first(run.created_at)}:{key(run.id)}"


def rank_key(run: Run) -> str | None:
    """The RowKey of the run's copy in its queue's line; None when it is not queued, or waits for
    other runs."""
    return f"r:{key(run_rank(run))}" if listed_state(run) == RunState.QUEUED else None


def purge_key(run: Run) -> str | None:
    """The RowKey of the run's copy in the retention sweep's index; None when the sweep never looks
    at it (not finished, or kept)."""
    due = purge_due(run)
    return None if due is None else f"p:{min(max(due, 0.0), LAST_DUE):017.6f}:{key(run.id)}"


def copy_keys(run: Run) -> list[str]:
    """The RowKeys of the run's copies (state, line, purge index) as ``run`` files them."""
    return [row for row in (copy_key(run), rank_key(run), purge_key(run)) if row is not None]


def entities(run: Run, marks: dict[str, Any] | None = None) -> Entities:
    """The run, its state copy, while it is queued its copy in the line, and while the retention
    sweep is to look at it its copy in that index; each with ``marks`` (a move's) beside the run."""
    body = {"state": str(run.state), **packed(run, f"run {run.id}"), **(marks or {})}
    where = partition(run.queue)
    rank, purge = rank_key(run), purge_key(run)
    return (
        {"PartitionKey": where, "RowKey": main_key(run.id), **body},
        {"PartitionKey": where, "RowKey": copy_key(run), **body},
        {"PartitionKey": where, "RowKey": rank, **body} if rank is not None else None,
        {"PartitionKey": where, "RowKey": purge, **body} if purge is not None else None,
    )
