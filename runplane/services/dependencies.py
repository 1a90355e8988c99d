"""Runs that wait for runs: a run (or a sweep) whose ``run:`` inputs, ``after`` or ``after_sweep``
name runs or a sweep that have not succeeded yet waits for them.

A waiting run is ``queued`` but filed apart from its pool's line (``listed_state``: ``waiting``):
no hint is sent for it, no worker can take it and it is nobody's backlog, so it holds neither a
worker nor a quota. Its ``waiting_on`` lists what it still waits for, and each of those lists it
among its ``dependents`` (``RunStore.follow``, atomic beside the worker's own writes; a sweep's
record, conditional on its version), so that the end of an upstream tells the dispatcher
(``lifecycle.ended``), which ``resolve``s each dependent: released into the line once all it
waits for succeeded, ended ``failed`` (``dependency_failed``, naming the upstream) as soon as one
ended otherwise, else left waiting with its reason brought up to date.

Order makes it race-free: the waiting run is stored first, then it follows each upstream, then it
is resolved once. An upstream that ends before it is followed is seen by that resolve; one that
ends after it is followed lists the run among the dependents its end tells. The dispatcher's
schedule resolves waiting runs too (``resolve_waiting``, within a budget of calls, each pass going
on where the last stopped), so a lost event costs a few periods at most.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runplane.domain.errors import (
    BadRequest,
    ConditionFailed,
    Conflict,
    NotAllowed,
    NotFound,
    RunplaneError,
    Unschedulable,
)
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.pools import Pool
from runplane.domain.runs import (
    MAX_DEPENDENTS,
    MAX_INPUTS,
    MAX_UPSTREAMS,
    SWEEP_PREFIX,
    Event,
    Failure,
    Run,
    RunSpec,
    listed_state,
)
from runplane.domain.states import FailureReason, RunState
from runplane.domain.sweeps import OPEN, PENDING, SUCCEEDED, Sweep
from runplane.domain.tenancy import Principal
from runplane.ports import LIST_BUDGET, Ports
from runplane.services import fallback
from runplane.services.authority import charge, still_allowed
from runplane.services.budget import Budget
from runplane.services.lifecycle import ended
from runplane.services.scheduling import MAX_TRIES, fair_tag

log = logging.getLogger(__name__)

WAITING_PER_PASS = 100
"""Waiting runs per listing page of the dispatcher's schedule."""


@dataclass(frozen=True)
class Verdict:
    """What the runs (and sweep) a run waits for say now."""

    failed: str | None
    """Why it can never go: which one ended without success, and how (None: none did)."""
    waiting: list[str]
    """Those that have not ended yet."""
    reason: str | None
    """Why it waits, for its ``waiting_reason`` (None: it waits for nothing)."""


def _name(upstream: str) -> str:
    if upstream.startswith(SWEEP_PREFIX):
        return f"sweep {upstream.removeprefix(SWEEP_PREFIX)}"
    return f"run {upstream}"


def _look(ports: Ports, upstream: str) -> tuple[str | None, str | None]:
    """``(None, None)`` when ``upstream`` succeeded; ``(what it is doing, None)`` while it goes;
    ``(None, how it ended)`` when it ended otherwise (or is gone)."""
    if upstream.startswith(SWEEP_PREFIX):
        sweep_id = upstream.removeprefix(SWEEP_PREFIX)
        try:
            return _sweep_says(ports.sweeps.get(sweep_id))
        except NotFound:
            return None, f"sweep {sweep_id} no longer exists"
    try:
        return _run_says(ports.store.get(upstream))
    except NotFound:
        return None, f"run {upstream} no longer exists"


def _run_says(run: Run) -> tuple[str | None, str | None]:
    if run.state == RunState.SUCCEEDED:
        return None, None
    if not run.state.terminal:
        return listed_state(run), None
    how = f" ({run.failure.reason}: {run.failure.message[:200]})" if run.failure else ""
    return None, f"run {run.id} ended {run.state}{how}"


def _sweep_says(sweep: Sweep) -> tuple[str | None, str | None]:
    good = sweep.status.count(SUCCEEDED)
    if sweep.finished_at is None:
        done = sum(1 for code in sweep.status if code not in (PENDING, OPEN))
        return f"{done} of {sweep.size} members done", None
    if good == sweep.size:
        return None, None
    how = "was killed" if sweep.killed else "finished"
    return None, f"sweep {sweep.id} {how} with {sweep.size - good} of {sweep.size} members not succeeded"


def judge(ports: Ports, upstreams: list[str]) -> Verdict:
    """Look at each of ``upstreams`` (in order) and say whether the waiter may go."""
    waiting: list[tuple[str, str]] = []
    for upstream in upstreams:
        doing, failed = _look(ports, upstream)
        if failed is not None:
            return Verdict(failed=failed, waiting=[], reason=None)
        if doing is not None:
            waiting.append((upstream, doing))
    return _pending(waiting)


def _pending(waiting: list[tuple[str, str]]) -> Verdict:
    """The verdict on a waiter none of whose upstreams failed: ``waiting`` holds those still
    going, each with what it is doing."""
    if not waiting:
        return Verdict(failed=None, waiting=[], reason=None)
    first, doing = waiting[0]
    more = f" and {len(waiting) - 1} more" if len(waiting) > 1 else ""
    return Verdict(failed=None, waiting=[u for u, _ in waiting], reason=f"waiting for {_name(first)} ({doing}){more}")


def admit(ports: Ports, principal: Principal, spec: RunSpec) -> Verdict:
    """At submit: each run and sweep that ``spec`` waits for must be the caller's own (admins
    included: the worker reads a ``run:`` input as the run's owner) and must not have ended
    without success. Returns what the run waits for (those not succeeded yet) and why, from the
    records read here. Raises
    NotFound (none such, or another user's), InvalidRequest (it ended otherwise: the run would
    fail at once) and Conflict (MAX_DEPENDENTS wait for it already)."""
    inputs_of = {
        source[4:].partition("/")[0]: name for name, source in spec.inputs.items() if source.startswith("run:")
    }
    pending: list[tuple[str, str]] = []
    for upstream in spec.upstreams():
        where = f"input {inputs_of[upstream]}" if upstream in inputs_of else "after"
        if upstream.startswith(SWEEP_PREFIX):
            sweep_id = upstream.removeprefix(SWEEP_PREFIX)
            where = "after_sweep"
            try:
                sweep: Sweep | None = ports.sweeps.get(sweep_id)
            except NotFound:
                sweep = None
            if sweep is None or sweep.owner != principal.user:
                raise NotFound(f"{where}: sweep {sweep_id} not found")
            (doing, failed), dependents = _sweep_says(sweep), sweep.dependents
        else:
            try:
                run: Run | None = ports.store.get(upstream)
            except NotFound:
                run = None
            if run is None or run.owner != principal.user:
                raise NotFound(f"{where}: run {upstream} not found")
            if upstream in inputs_of and run.state.terminal and run.state != RunState.SUCCEEDED:
                raise Unschedulable(f"{where}: run {upstream} ended {run.state}; it has no outputs to use")
            (doing, failed), dependents = _run_says(run), run.dependents
        if failed is not None:
            raise Unschedulable(f"{where}: {failed}; a run waiting for it could never start")
        if doing is not None:
            if len(dependents) >= MAX_DEPENDENTS:
                raise Conflict(f"{where}: {MAX_DEPENDENTS} runs and sweeps already wait for {_name(upstream)}")
            pending.append((upstream, doing))
    return _pending(pending)


def check_waiting_cap(ports: Ports, pool: Pool, user: str) -> None:
    """Refuse (InvalidRequest, naming the cap) one more waiting run of ``user`` in ``pool`` when
    they have ``pool.max_waiting_runs`` already. Counted among all the user's queued runs of the
    pool that one owner listing reads (at most ``LIST_BUDGET`` of their newest runs examined, the
    cap's ceiling): exact for anyone whose waiting runs are among their newest ``LIST_BUDGET`` runs,
    however many plain queued runs are newer than them."""
    page = ports.store.list(owner=user, queue=pool.name, state=RunState.QUEUED, limit=LIST_BUDGET)
    waiting = sum(1 for run in page.runs if run.waiting_on)
    if waiting >= pool.max_waiting_runs:
        raise NotAllowed(
            f"you have {waiting} runs waiting for other runs in pool {pool.name}; at most "
            f"{pool.max_waiting_runs} may wait at once: wait for some to start, or kill some"
        )


def follow(ports: Ports, dependent: str, upstreams: list[str]) -> None:
    """Have each of ``upstreams`` list ``dependent`` (a run id or ``sweep:<id>``) among those its
    end tells. One that has ended (or is gone) is left: the resolve that follows sees it. A write
    that fails is logged: the schedule resolves the dependent anyway."""
    for upstream in upstreams:
        try:
            if upstream.startswith(SWEEP_PREFIX):
                _follow_sweep(ports, upstream.removeprefix(SWEEP_PREFIX), dependent)
            else:
                ports.store.follow(upstream, dependent)
        except (ConditionFailed, NotFound):
            continue
        except RunplaneError as e:
            log.warning("%s could not follow %s (the schedule resolves it): %s", dependent, _name(upstream), e)


def _follow_sweep(ports: Ports, sweep_id: str, dependent: str) -> None:
    for _ in range(8):
        sweep = ports.sweeps.get(sweep_id)
        if sweep.finished_at is not None or dependent in sweep.dependents:
            return
        if len(sweep.dependents) >= MAX_DEPENDENTS:
            raise Conflict(f"{MAX_DEPENDENTS} runs and sweeps already wait for sweep {sweep_id}")
        try:
            ports.sweeps.save(sweep.model_copy(update={"dependents": [*sweep.dependents, dependent]}))
            return
        except ConditionFailed:
            continue
    raise Conflict(f"sweep {sweep_id} changed too often to add {dependent} to what waits for it")


def resolve(ports: Ports, run: Run | str, caller: Principal | None = None) -> Run:
    """Release ``run`` (or the run of that id) into its pool's line if all it waits for
    succeeded, end it ``dependency_failed`` if one ended otherwise, else bring its
    ``waiting_reason`` up to date. A run that waits for nothing, or is no longer queued, is
    returned as it is. With ``caller`` (its owner, whose request resolves it), it is released with
    the caller's token as it is now, and left waiting when that no longer allows it (the
    dispatcher's resolve judges it by all the owner's tokens). Raises NotFound and what the stores
    raise."""
    current = ports.store.get(run) if isinstance(run, str) else run
    for _ in range(5):
        if current.state != RunState.QUEUED or not current.waiting_on:
            return current
        verdict = judge(ports, current.waiting_on)
        now = ports.clock()
        # only while it still waits: a run released (or ended) by a racing resolve is left as it is
        expect = Expect(states=frozenset({RunState.QUEUED}), attempt=current.attempt, waiting=True)
        try:
            if verdict.failed is not None:
                message = f"{verdict.failed}; this run waited for it"
                return _end_waiting(ports, current, expect, now, FailureReason.DEPENDENCY_FAILED, message)
            if not verdict.waiting:
                return _release(ports, current, expect, now, caller)
            if verdict.waiting != current.waiting_on or verdict.reason != current.waiting_reason:
                return ports.store.update(
                    current, expect, {"waiting_on": verdict.waiting, "waiting_reason": verdict.reason}
                )
            return current
        except ConditionFailed as e:
            current = e.details["run"]
    return current


def _end_waiting(ports: Ports, run: Run, expect: Expect, now: float, reason: FailureReason, message: str) -> Run:
    """End a run that still waits ``failed`` for ``reason``, and tell what waits for it in turn."""
    done = ports.store.update(
        run,
        expect,
        {
            "state": RunState.FAILED,
            "finished_at": now,
            "waiting_reason": None,
            "failure": Failure(reason=reason, message=message),
        },
        Event(at=now, state=RunState.FAILED, message=message),
    )
    ended(ports.queue, done)  # what waits for this run fails in turn
    return done


def _release(ports: Ports, run: Run, expect: Expect, now: float, caller: Principal | None = None) -> Run:
    """Put a run whose upstreams all succeeded in its pool's line, taking its place in the
    owner's lane now (its waiting time earned no place), and hint it: with the groups its owner
    has now (``caller``'s token, else ``ports.owners``) and charged as they allow
    (``authority.charge``), or ended ``not_permitted`` when the owner's tokens no longer allow its
    group or its inputs (left waiting when only the caller's token does not)."""
    groups, group = run.owner_groups, run.group
    if caller is not None:
        if still_allowed(caller, run.spec, run.group, ports.inputs) is not None:
            return run
        groups, group = sorted(set(caller.groups)), charge(caller, run.group)
    else:
        owner, why = ports.owners.allows(run.owner, run.spec, run.group, ports.inputs)
        if why is not None:
            return _end_waiting(ports, run, expect, now, FailureReason.NOT_PERMITTED, f"not released: {why}")
        groups, group = owner.groups, charge(owner, run.group)
    tag = run.fair_tag
    pool = ports.pools.get(run.queue)
    if pool is not None:
        tag = fair_tag(ports, pool, run.owner, run.spec.priority, now)
    released = ports.store.update(
        run,
        expect,
        {
            "waiting_on": [],
            "waiting_reason": f"waiting for a worker of pool {run.queue}",
            "hinted_at": now,
            "fair_tag": tag,
            "owner_groups": groups,
            "group": group,
            **fallback.queued_changes(run, now),  # its time on its pool starts now
        },
        Event(at=now, message=f"everything it waited for succeeded: released to pool {run.queue}"),
    )
    try:
        ports.queue.send(released.queue, RunMessage(run_id=released.id, attempt=released.attempt))
        ports.queue.notify(DispatchEvent(pool=released.queue, reason="released"))
    except RunplaneError as e:
        log.warning("run %s released but its hint failed (the reaper re-sends it): %s", run.id, e)
    fallback.send_timer(ports, released, now)
    return released


def describe(ports: Ports, run: Run) -> str | None:
    """Why a waiting run waits, as things are now (read only: ``resolve`` acts on it)."""
    if not run.waiting_on:
        return None
    verdict = judge(ports, run.waiting_on)
    if verdict.failed is not None:
        return f"{verdict.failed}; this run ends {FailureReason.DEPENDENCY_FAILED} at the dispatcher's next look"
    if not verdict.waiting:
        return "everything it waited for succeeded; it is being released to its pool"
    return verdict.reason


def dependents_of(ports: Ports, upstream: str) -> list[str]:
    """What waits for ``upstream`` (a run id or ``sweep:<id>``), as it lists them; none when it
    is gone."""
    try:
        if upstream.startswith(SWEEP_PREFIX):
            return list(ports.sweeps.get(upstream.removeprefix(SWEEP_PREFIX)).dependents)
        return list(ports.store.get(upstream).dependents)
    except NotFound:
        return []


MAX_WAITS = MAX_UPSTREAMS + MAX_INPUTS + 1
"""The most runs and sweeps one run (or a sweep's template) can wait for: ``after``, ``run:`` inputs
and ``after_sweep``."""
RESOLVE_CALLS = 2 + 2 * MAX_TRIES + 4
"""Calls one resolve makes besides reading what the run waits for: the run, and its release (the
line's head, the owner's lane read and written up to ``MAX_TRIES`` times, the write, the hint, the
dispatcher's nudge and the run's fallback timer); failing it or noting its reason costs less."""


@dataclass(frozen=True)
class Mark:
    """Where a bounded pass over waiting runs stopped: a pool, and the listing's cursor in it
    (None: from its newest)."""

    pool: str
    cursor: str | None = None


@dataclass(frozen=True)
class WaitingPass:
    seen: dict[str, int]
    """Per pool, how many waiting runs were looked at."""
    resume: Mark | None
    """Where the next pass goes on (None: from the first pool; this pass went round)."""


def resolve_cost(run: Run) -> int:
    """The most store and queue calls ``resolve`` makes for ``run`` (one try, no race)."""
    return RESOLVE_CALLS + len(run.waiting_on)


def resolve_waiting(
    ports: Ports, budget: Budget | None = None, start: Mark | None = None, per_page: int = WAITING_PER_PASS
) -> WaitingPass:
    """The schedule's pass: resolve waiting runs pool by pool, each read afresh (a listing may lag),
    page by page, from ``start``, while ``budget`` (calls) affords the next listing or the next
    run's ``resolve_cost``. Give ``ports`` metered with ``budget`` (``services.budget``). Returns
    what was looked at and where to go on: every waiting run of every pool is reached in turn,
    however many one user made. A run that cannot be resolved is logged, a pool whose listing
    fails is left to the next pass."""
    budget = budget or Budget(1 << 62)
    names = [pool.name for pool in ports.pools.pools]
    first = names.index(start.pool) if start is not None and start.pool in names else 0
    cursor = start.cursor if start is not None and start.pool in names else None
    seen: dict[str, int] = {}
    for name in names[first:] + names[:first]:
        while True:
            if seen and not budget.affords(1 + RESOLVE_CALLS):
                return WaitingPass(seen, Mark(name, cursor))
            try:
                page = ports.store.waiting(name, per_page, cursor)
            except BadRequest as e:  # a cursor of a listing that changed since (an upgrade): from the newest
                if cursor is None:
                    log.warning("cannot list the waiting runs of pool %s: %s", name, e)
                    break
                cursor = None
                continue
            except RunplaneError as e:
                log.warning("cannot list the waiting runs of pool %s: %s", name, e)
                break
            for index, run in enumerate(page.runs):
                if seen and not budget.affords(resolve_cost(run)):  # the first always goes: passes move on
                    after = ports.store.cursor_after(page.runs[index - 1]) if index else cursor
                    return WaitingPass(seen, Mark(name, after))
                seen[name] = seen.get(name, 0) + 1
                try:
                    resolve(ports, run.id)
                except NotFound:
                    continue
                except RunplaneError as e:
                    log.warning("could not resolve waiting run %s: %s", run.id, e)
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        cursor = None
    return WaitingPass(seen, None)
