"""Bounded work: the calls to the stores and queues one dispatcher pass or one event may make,
counted as they are made, so that no tenant's records can make a pass or an event run long.

A ``Budget`` is a count of calls; ``metered`` wraps the ports of a use case so that every call
they make is charged to it. Callers ask ``affords`` before each item with what that item costs
at most, and stop (leaving a cursor or a continuation event) when it does not fit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar, cast

T = TypeVar("T")


class Budget:
    """Calls that may still be made. ``used`` may pass ``limit`` only by what one item costs
    beyond its reservation (a write retried after a race)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)

    def affords(self, calls: int) -> bool:
        """Whether ``calls`` more stay within the limit."""
        return self.used + calls <= self.limit

    def charge(self, calls: int = 1) -> None:
        self.used += calls


class _Metered:
    """A port whose every method call is charged to a budget before it is made."""

    def __init__(self, port: object, budget: Budget) -> None:
        self._port = port
        self._budget = budget

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._port, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._budget.charge()
            return attr(*args, **kwargs)

        return call


def meter(port: T, budget: Budget) -> T:
    """``port`` with each of its calls charged to ``budget``."""
    return cast(T, _Metered(port, budget))


PORT_FIELDS = ("store", "sweeps", "queue", "quotas", "workers")
"""The fields of a ports bundle that reach a store or a queue."""


def metered(bundle: T, budget: Budget) -> T:
    """A copy of the dataclass ``bundle`` (``Ports``, or any with such fields) whose stores and
    queues charge ``budget``."""
    changes = {
        name: meter(getattr(bundle, name), budget)
        for name in PORT_FIELDS
        if hasattr(bundle, name) and getattr(bundle, name) is not None
    }
    return cast(T, dataclasses.replace(cast(Any, bundle), **changes))
