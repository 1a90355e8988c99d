"""Where a queued run stands in its pool's line: the rank that orders a pool's queued runs
(highest priority first, then start-time fair queueing: docs/scheduling.md)."""

from __future__ import annotations

MAX_FAIR_TAG = 9_999_999_999_999.0
"""The largest fair tag a rank holds (13 digits before the point)."""


def rank_key(priority: int, fair_tag: float, created_at: float, run_id: str) -> str:
    """The order in which a pool's queued runs start, as a string that sorts the same way: the
    higher priority first, then the smaller fair tag, then the older run, then the id. The tag is
    held within its fixed width (0 to ``MAX_FAIR_TAG``) so that the strings always sort as the
    numbers do."""
    tag = min(max(fair_tag, 0.0), MAX_FAIR_TAG)
    return f"{100 - priority:03d}#{tag:020.6f}#{created_at:017.6f}#{run_id}"


def rank_prefix(priority: int) -> str:
    """How the rank of every run of ``priority`` begins (``rank_key``)."""
    return f"{100 - priority:03d}#"
