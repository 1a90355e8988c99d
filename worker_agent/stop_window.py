"""How long a run handed back may take to stop: the grace after its checkpoint rule's signal and its
final sync, within the agent's stop budget and, when a preemption notice says when the machine goes,
before that moment less a margin."""

from __future__ import annotations

import time

GRACE_SHARE = 0.75
"""The most of the agent's stop budget (``stop_budget_seconds``) a run's grace takes: its final sync has
the rest. The same share of what is left before a notice's moment goes to the grace."""

MARGIN_SECONDS = 10.0
"""How long before the moment a preemption notice gives a stop (grace and final sync) must be over."""


def stop_by(leaves_at: float | None, now: float, wall: float | None = None) -> float | None:
    """When, on the clock that reads ``now``, a stop must be over: ``MARGIN_SECONDS`` before the machine
    goes at ``leaves_at`` (seconds since the epoch; ``wall``: the epoch's seconds now, default the
    system's). None when the notice gave no time."""
    if leaves_at is None:
        return None
    return now + (leaves_at - (time.time() if wall is None else wall)) - MARGIN_SECONDS


def earlier(first: float | None, second: float | None) -> float | None:
    """The earlier of two moments, either unknown (None)."""
    known = [t for t in (first, second) if t is not None]
    return min(known) if known else None


def cut_grace(grace: float, by: float | None, now: float) -> float:
    """The grace after the stop signal, given at ``now``: ``grace`` (the rule's, already capped by the
    stop budget), and with a moment ``by`` which the stop must end before, at most ``GRACE_SHARE`` of
    what is left until then (the final sync has the rest); none once it is past."""
    if by is None:
        return grace
    return max(0.0, min(grace, (by - now) * GRACE_SHARE))


def final_sync_seconds(deadline: float, budget: float, asked: float | None, by: float | None, now: float) -> float:
    """How long the final sync may take at ``now``: ``deadline`` (the upload deadline); on a stop asked
    at ``asked``, what is left of the stop ``budget`` since; and no later than ``by``."""
    seconds = deadline
    if asked is not None:
        seconds = min(seconds, max(budget - (now - asked), 0.0))
    if by is not None:
        seconds = min(seconds, max(by - now, 0.0))
    return seconds
