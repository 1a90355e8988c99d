"""Pages of runs and of sweeps as a listing answers them: the items, the cursor after them, and
where a page cut short (to fit a response) goes on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from runplane.domain.runs import Run
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.ports import Ports
from runplane.services import runs, sweeps
from runplane.services.overview import sweep_members
from runplane.services.shown_sweeps import Shown, recorded

Item = TypeVar("Item")


@dataclass(frozen=True)
class Listing(Generic[Item]):
    """A page of a listing."""

    items: list[Item]
    next_cursor: str | None
    resume: Callable[[int], str]
    """The cursor after the first ``n`` items: where a page that keeps only those goes on."""


def runs_page(
    ports: Ports,
    principal: Principal,
    *,
    owner: str | None,
    state: RunState | None,
    queue: str | None,
    sweep: str | None,
    label: str | None,
    limit: int,
    cursor: str | None,
) -> Listing[Run]:
    """A page of runs: the members of the caller's ``sweep`` released so far, in index order, or
    else the caller's runs (an admin: ``owner``'s), newest first; of ``state``, ``queue`` and
    ``label`` when given. Raises as ``overview.sweep_members`` and ``runs.list_runs`` do."""
    if sweep is not None:
        found, after = sweep_members(ports, principal, sweep, state, label, limit, cursor, owner=owner, queue=queue)
        return Listing(found, after, lambda n: str(found[n].sweep_index))
    owner = owner or principal.user
    page = runs.list_runs(
        ports, principal, owner=owner, state=state, queue=queue, limit=limit, cursor=cursor, label=label
    )
    return Listing(page.runs, page.next_cursor, lambda n: ports.store.cursor_after(page.runs[n - 1], owner))


def sweeps_page(
    ports: Ports, principal: Principal, *, owner: str | None, limit: int, cursor: str | None
) -> Listing[Shown]:
    """A page of the caller's sweeps (an admin: ``owner``'s), newest first, counted as their
    records last saw them (``shown_sweeps.recorded``). Raises as ``sweeps.list_sweeps`` does."""
    found, after = sweeps.list_sweeps(ports, principal, owner, limit, cursor)
    return Listing([recorded(s) for s in found], after, lambda n: ports.sweeps.cursor_after(found[n - 1]))
