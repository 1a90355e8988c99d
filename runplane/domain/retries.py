"""Whether a run that ended badly goes again: the one decision behind ``RunSpec.retry``.

Pure: the agent that ended the attempt asks it, then writes what it says (``lifecycle.retry``
or ``lifecycle.fail``). A lost worker is not decided here: the reaper re-queues it within the
run's ``max_attempts`` (``lifecycle.requeue``).
"""

from __future__ import annotations

from dataclasses import dataclass

from runplane.domain.runs import Run
from runplane.domain.states import NEVER_RETRIED, FailureReason
from runplane.domain.units import format_bytes


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    note: str
    """What the run's timeline says of it ("retried as attempt 2 of 3: ...", "not retried: ...")."""
    memory: int | None = None
    """The next attempt's memory limit, when it grows (``memory_factor``)."""


def decide(run: Run, reason: FailureReason, memory_cap: int | None = None) -> RetryDecision | None:
    """Whether attempt ``run.attempt``, which ended with ``reason``, is followed by another.
    None when the run has no retry rule and nothing is to be said; ``memory_cap`` is the most
    memory its pool's workers have (an out_of_memory retry grows the limit at most to it)."""
    rule = run.spec.retry
    if rule is None:
        return None
    if reason in NEVER_RETRIED or run.kill_requested:
        return RetryDecision(False, "not retried: it was killed")
    memory = run.spec.resources.memory
    grows = reason == FailureReason.OUT_OF_MEMORY and rule.memory_factor is not None and memory is not None
    named = reason.value in rule.on
    if not named and not grows:
        listed = ", ".join(rule.on) or "nothing"
        return RetryDecision(False, f"not retried: {reason} is not a reason its retry rule names ({listed})")
    if run.attempt >= run.max_attempts:
        return RetryDecision(False, f"not retried: attempt {run.attempt} was the last of {run.max_attempts}")
    grown: int | None = None
    how = ""
    if grows and memory is not None and rule.memory_factor is not None:
        target = int(memory * rule.memory_factor)
        if memory_cap:
            target = min(target, memory_cap)
        if target > memory:
            grown = target
            how = f" with {format_bytes(target)} memory (was {format_bytes(memory)})"
        elif not named:
            return RetryDecision(
                False, f"not retried: its memory limit {format_bytes(memory)} is already all a worker of its pool has"
            )
    why = f"its retry rule names {reason}" if named else f"out_of_memory grows its memory by {rule.memory_factor:g}"
    return RetryDecision(True, f"retried as attempt {run.attempt + 1} of {run.max_attempts}{how} ({why})", grown)
