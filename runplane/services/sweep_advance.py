"""Moving a sweep on: releasing members as room frees, recording those that ended, ending a killed
sweep's members, and the schedule's pass over unfinished sweeps.

``advance`` is the one writer of a sweep's member status. It is called wherever something may
have changed for a sweep: when it is made, killed, retried or its ``max_parallel`` changes (by the
API), when one of its members ends (the dispatcher, on the event the member's worker or the API
sends), and on the dispatcher's schedule for every unfinished sweep (what an event lost would
have done). It reads the sweep and its open members, records the ones that ended, releases
pending members while there is room, and writes the sweep conditionally on its version; only
then does it create the released members' runs, whose ids are fixed by (sweep, index, try), so a
second ``advance`` racing or following a crash creates the same runs, never others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runplane.domain.asks import MAX_FALLBACK
from runplane.domain.errors import (
    AlreadyExists,
    ConditionFailed,
    Conflict,
    NotFound,
    RunplaneError,
)
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.runs import SWEEP_PREFIX, Event, Failure, Run
from runplane.domain.states import DEFAULT_MAX_ATTEMPTS, FailureReason, RunState
from runplane.domain.sweeps import (
    OPEN,
    PENDING,
    SUCCEEDED,
    Sweep,
    ended_code,
)
from runplane.ports import Ports
from runplane.services import dependencies, fallback, lifecycle
from runplane.services.authority import charge
from runplane.services.budget import Budget
from runplane.services.dependencies import MAX_WAITS
from runplane.services.runs import _kill
from runplane.services.scheduling import MAX_TRIES, fair_tag

log = logging.getLogger(__name__)

MAX_OPEN = 500
"""The most members of one sweep out at once, whatever its pool could run."""
UNFINISHED_PER_PASS = 100
LOOK_PER_ADVANCE = 100
"""The most open members one try of ``advance`` reads."""
RELEASE_PER_ADVANCE = 25
"""The most members one try of ``advance`` releases (the next go on at the next event)."""
ROTATE_SECONDS = 60.0
"""How long ``advance`` keeps reading the same window of a sweep's open members (the schedule's period)."""
LOOK_CALLS = 1 + MAX_WAITS + 1 + MAX_FALLBACK + LOOK_PER_ADVANCE + 3
"""The most store and queue calls one try of ``advance`` makes before it releases or kills: the
sweep, what it waits for, the workers of its pool and of those it falls back to, the open members
it reads, its write and nudges."""
RELEASE_CALLS = 2 + 2 * MAX_TRIES + 4
"""The most one member's release makes: the line's head, the owner's lane read and written up to
``MAX_TRIES`` times, the owner's groups, the run, its hint and its fallback timer."""
KILL_CALLS = 3
"""The most one member's kill makes: its write, a read after a race, and the end's nudge."""
BURY_CALLS = 1 + KILL_CALLS
"""The most one member of a killed sweep that is out with no run costs: its run stored killed, or,
when a racing release made it, that run's kill."""
ADVANCE_CALLS = LOOK_CALLS + max(RELEASE_PER_ADVANCE * RELEASE_CALLS, LOOK_PER_ADVANCE * BURY_CALLS)
"""The most one try of ``advance`` makes without a budget: its look, then releases or kills."""
KILLED = ended_code(RunState.KILLED, FailureReason.KILLED)
DEPENDENCY_FAILED = ended_code(RunState.FAILED, FailureReason.DEPENDENCY_FAILED)


def window(ports: Ports, sweep: Sweep, now: float, stale_after: float = 120.0) -> int:
    """How many members may be out at once: ``max_parallel``, else twice what the pools its members
    may run on (the sweep's pool and those they fall back to, ``services.fallback``) can run at
    once (each one's most workers, or the workers it has when more, times their slots), so that a
    worker that frees a slot finds the next member already queued; at most ``MAX_OPEN``."""
    if sweep.max_parallel is not None:
        return min(sweep.max_parallel, MAX_OPEN)
    pools = [pool for name in [sweep.queue, *sweep.spec.run.fallback] if (pool := ports.pools.get(name)) is not None]
    if not pools:
        return 1
    slots = 0
    for pool in pools:
        try:
            alive = [w for w in ports.workers.list(pool.name) if now - w.heartbeat_at <= stale_after]
        except RunplaneError:
            alive = []
        slots += max(pool.max_workers * pool.slots, sum(w.slots for w in alive))
    return min(2 * max(slots, 1), MAX_OPEN)


def advance(
    ports: Ports, sweep_id: str, member: int | None = None, budget: Budget | None = None, turn: int | None = None
) -> Sweep:
    """Move the sweep on (see the module docstring); returns it as written. Each try reads at most
    ``LOOK_PER_ADVANCE`` open members (``member`` first, the member whose end this is, then a window
    that moves on every ``ROTATE_SECONDS``) and releases at most ``RELEASE_PER_ADVANCE``, asking
    the dispatcher for another advance when more could go. With ``budget`` (that ``ports`` are
    metered with), it releases or kills only while the budget affords one more (one at least), and
    tries again after a race only while it affords a whole try: members marked out whose runs are
    not made yet are made by the next advance. With ``turn`` (the schedule's round), the window is
    that round's rather than the period's. Raises NotFound, and what the stores raise."""
    for attempt in range(8):
        if attempt and budget is not None and not budget.affords(LOOK_CALLS):
            return ports.sweeps.get(sweep_id)  # the next event or pass goes on
        sweep = ports.sweeps.get(sweep_id)
        if sweep.finished_at is not None:
            return sweep
        now = ports.clock()
        status, live, missing = _look(ports, sweep, _looked_at(sweep, member, now, turn))
        changes: dict[str, object] = {}
        held, noted = _gate(ports, sweep, status, changes, now)
        create = [] if held else _plan(ports, sweep, status, missing, now)
        text = "".join(status)
        done = PENDING not in text and OPEN not in text
        saved = sweep
        if text != sweep.status or done or changes:
            changes["status"] = text
            if done:
                changes["finished_at"] = now
                noted = _noted(noted, Event(at=now, message=_summary(text)))
            if noted is not sweep:
                changes["events"] = noted.events
            try:
                saved = ports.sweeps.save(sweep.model_copy(update=changes))
            except ConditionFailed:
                continue  # another writer moved it: read it again
            if done and saved.dependents:
                _tell_dependents(ports, saved)
        _release_all(ports, saved, create, now, budget)
        ended_now = _end_killed(ports, saved, missing, live, now, budget) if saved.killed else False
        if ended_now:
            continue  # queued members were killed at once: record them
        return saved
    raise Conflict(f"sweep {sweep_id} changed too often; try again")


def _release_all(ports: Ports, sweep: Sweep, create: list[int], now: float, budget: Budget | None) -> None:
    """Make the runs of members ``create`` (while ``budget`` affords one more; one at least) and
    nudge the dispatcher once, asking it to move the sweep on again when more could go."""
    released, more = 0, len(create) >= RELEASE_PER_ADVANCE and PENDING in sweep.status
    for place, index in enumerate(create):
        if place and budget is not None and not budget.affords(RELEASE_CALLS):
            more = True  # the rest are out with no run yet: the next advance makes them
            break
        released += _release(ports, sweep, index, now)
    if released:
        _wake(ports, sweep, more=more)


def _end_killed(
    ports: Ports, sweep: Sweep, missing: list[int], live: list[Run], now: float, budget: Budget | None
) -> bool:
    """A killed sweep's members: those out with no run are stored killed, the runs of those read
    killed (while ``budget`` affords one more; one at least; the rest are left to the next
    advance). True when one ended now."""
    ended_now = False
    for place, index in enumerate(missing):  # a pass that released it may still be making its run
        if place and budget is not None and not budget.affords(BURY_CALLS):
            return ended_now
        ended_now |= _bury(ports, sweep, index, now)
    for place, run in enumerate(live):
        if (place or missing) and budget is not None and not budget.affords(KILL_CALLS):
            break
        try:
            killed = _kill(ports, run, reason=f"sweep {sweep.id} was killed")
        except (Conflict, ConditionFailed):
            continue
        if killed.state.terminal and killed.dependents:
            lifecycle.ended(ports.queue, killed)  # what waits for the member fails
        ended_now |= killed.state.terminal
    return ended_now


def _gate(ports: Ports, sweep: Sweep, status: list[str], changes: dict[str, object], now: float) -> tuple[bool, Sweep]:
    """For a sweep that waits for runs or a sweep: whether its members are held back still,
    and the sweep with what changed noted on its timeline. Once one of them ended without
    success, every member (none was released) is marked ``dependency_failed`` in ``status``;
    ``changes`` gets what it still waits for."""
    if not sweep.waiting_on or sweep.killed:
        return False, sweep
    verdict = dependencies.judge(ports, sweep.waiting_on)
    if verdict.failed is not None:  # ``waiting_on`` stays: a retry of the sweep fails them again
        for index, code in enumerate(status):
            if code == PENDING:
                status[index] = DEPENDENCY_FAILED
        message = f"{verdict.failed}; its members end {FailureReason.DEPENDENCY_FAILED}"
        return False, _noted(sweep, Event(at=now, message=message))
    if verdict.waiting:
        if verdict.waiting != sweep.waiting_on:
            changes["waiting_on"] = verdict.waiting
        return True, sweep
    changes["waiting_on"] = []
    return False, _noted(sweep, Event(at=now, message="everything it waited for succeeded: releasing members"))


def _looked_at(sweep: Sweep, member: int | None, now: float, turn: int | None = None) -> list[int]:
    """The open members one try of ``advance`` reads: ``member`` (when open), then a window of
    the others that starts ``LOOK_PER_ADVANCE`` further each ``turn`` (the schedule's rounds over
    unfinished sweeps: one visit of the sweep each, so that successive visits always move on and
    reach every open member in turn, however many are out and however far apart the visits), or,
    without one, every ``ROTATE_SECONDS``."""
    out = sweep.indices(OPEN)
    first = [member] if member is not None and member in out else []
    rest = [index for index in out if index not in first]
    if len(rest) + len(first) > LOOK_PER_ADVANCE:
        step = int(now // ROTATE_SECONDS) if turn is None else turn
        start = (step * LOOK_PER_ADVANCE) % len(rest)
        rest = (rest[start:] + rest[:start])[: LOOK_PER_ADVANCE - len(first)]
    return first + rest


def _look(ports: Ports, sweep: Sweep, indices: list[int]) -> tuple[list[str], list[Run], list[int]]:
    """The sweep's status with those of its open members ``indices`` that ended recorded, the
    runs of those still going, and those whose run was never made."""
    status = list(sweep.status)
    live: list[Run] = []
    missing: list[int] = []
    for index in indices:
        try:
            run = ports.store.get(sweep.member_id(index))
        except NotFound:
            missing.append(index)  # released by a write whose runs were not all made
            continue
        if run.state.terminal:
            status[index] = ended_code(run.state, run.failure.reason if run.failure else None)
        else:
            live.append(run)
    return status, live, missing


def _plan(ports: Ports, sweep: Sweep, status: list[str], missing: list[int], now: float) -> list[int]:
    """Mark in ``status`` what this pass does: a killed sweep's members that have no run end
    killed; otherwise pending members are released while there is room. Returns the members
    whose runs are to be made."""
    if sweep.killed:  # members never released end here; released ones without a run, in ``_bury``
        for index, code in enumerate(status):
            if code == PENDING:
                status[index] = KILLED
        return []
    create = list(missing)
    room = min(window(ports, sweep, now) - status.count(OPEN), RELEASE_PER_ADVANCE - len(create))
    for index, code in enumerate(status):
        if room <= 0:
            break
        if code == PENDING:
            status[index] = OPEN
            create.append(index)
            room -= 1
    return create


def _noted(sweep: Sweep, event: Event) -> Sweep:
    return sweep.model_copy(update={"events": sweep.with_event(event)})


def _tell_dependents(ports: Ports, sweep: Sweep) -> None:
    """A sweep that finished tells the runs and sweeps that wait for it (through the
    dispatcher). Quiet on failure: the dispatcher's schedule resolves waiting runs anyway."""
    try:
        ports.queue.notify(DispatchEvent(pool=sweep.queue, reason="sweep finished", upstream=SWEEP_PREFIX + sweep.id))
    except RunplaneError as e:
        log.warning("sweep %s finished; could not tell what waits for it: %s", sweep.id, e)


def _summary(status: str) -> str:
    good = status.count(SUCCEEDED)
    return f"finished: {good} of {len(status)} members succeeded"


def member_run(
    sweep: Sweep, index: int, now: float, tag: float = 0.0, groups: list[str] | None = None, group: str | None = None
) -> Run:
    """The run of member ``index``'s latest try: the template with the member's parameters, its
    owner in ``groups`` (the groups they have now; None: those recorded with the sweep), charged
    to ``group`` (None: the sweep's)."""
    template = sweep.spec.run
    tries = sweep.tries.get(str(index), 1)
    base = sweep.spec.name or template.name or sweep.id
    spec = template.model_copy(
        update={"env": {**template.env, **sweep.spec.point(index)}, "name": f"{base}[{index}]"[:200]}
    )
    again = f", try {tries}" if tries > 1 else ""
    return Run(
        id=sweep.member_id(index),
        owner=sweep.owner,
        owner_groups=list(sweep.owner_groups if groups is None else groups),
        group=sweep.group if group is None else group,
        spec=spec,
        queue=sweep.queue,
        sweep_id=sweep.id,
        sweep_index=index,
        created_at=now,
        fair_tag=tag,
        max_attempts=template.retry.attempts if template.retry is not None else DEFAULT_MAX_ATTEMPTS,
        hinted_at=now,
        waiting_reason=f"waiting for a worker of pool {sweep.queue}",
        events=[Event(at=now, state=RunState.QUEUED, message=f"released by sweep {sweep.id} (member {index}{again})")],
        restore_from=sweep.restore_from,
    )


def _release(ports: Ports, sweep: Sweep, index: int, now: float) -> bool:
    """Make member ``index``'s run and hint its pool; False when a run was made already (by a
    racing or earlier pass: left as it is), or when the owner's groups now (``ports.owners``) no
    longer allow the sweep's group or inputs: then its run is made ended ``not_permitted``. A
    sweep stored charged to no group has its member charged as ``authority.charge`` says."""
    owner, why = ports.owners.allows(sweep.owner, sweep.spec.run, sweep.group, ports.inputs)
    if why is not None:
        _refuse(ports, sweep, index, now, why)
        return False
    groups, group = owner.groups, charge(owner, sweep.group)
    tag = 0.0
    pool = ports.pools.get(sweep.queue)
    if pool is not None:
        tag = fair_tag(ports, pool, sweep.owner, sweep.spec.run.priority, now)
    run = member_run(sweep, index, now, tag, groups, group)
    run.fallback_at = fallback.due_at(run, now)  # its time on the sweep's pool starts now
    try:
        ports.store.create(run)
    except AlreadyExists:
        return False
    try:
        ports.queue.send(run.queue, RunMessage(run_id=run.id, attempt=run.attempt))
    except RunplaneError as e:
        log.warning("run %s stored but its queue hint failed (the reaper re-sends it): %s", run.id, e)
    fallback.send_timer(ports, run, now)
    return True


def _ended_member(sweep: Sweep, index: int, now: float, state: RunState, reason: FailureReason, message: str) -> Run:
    """Member ``index``'s run as it is stored when it ends before it was ever queued."""
    run = member_run(sweep, index, now)
    return run.model_copy(
        update={
            "state": state,
            "finished_at": now,
            "waiting_reason": None,
            "failure": Failure(reason=reason, message=message),
            "events": [*run.events, Event(at=now, state=state, message=message)],
        }
    )


def _refuse(ports: Ports, sweep: Sweep, index: int, now: float, why: str) -> None:
    """Store member ``index``'s run ended ``not_permitted`` (never queued: no worker sees it), and
    tell the dispatcher, whose next ``advance`` records it."""
    refused = _ended_member(sweep, index, now, RunState.FAILED, FailureReason.NOT_PERMITTED, f"not released: {why}")
    try:
        ports.store.create(refused)
    except AlreadyExists:
        return  # a racing pass made its run first: left as it is
    lifecycle.ended(ports.queue, refused)


def _wake(ports: Ports, sweep: Sweep, more: bool = False) -> None:
    """One nudge for the dispatcher for all the members a pass released; with ``more``, it moves
    the sweep on again (the next ``RELEASE_PER_ADVANCE`` members: one event each, bounded)."""
    try:
        ports.queue.notify(
            DispatchEvent(pool=sweep.queue, reason="sweep released members", sweep=sweep.id if more else None)
        )
    except RunplaneError as e:
        log.warning("sweep %s: could not wake the dispatcher: %s", sweep.id, e)


def _bury(ports: Ports, sweep: Sweep, index: int, now: float) -> bool:
    """A killed sweep's released member that has no run: store its run as killed (so that a pass
    still making it finds it taken), or kill the run that pass made. True when the member's run
    has ended (the next read records it)."""
    message = f"killed with sweep {sweep.id} before it started"
    buried = _ended_member(sweep, index, now, RunState.KILLED, FailureReason.KILLED, message)
    try:
        ports.store.create(buried)
        return True
    except AlreadyExists as e:
        made: Run = e.details["run"]
    try:
        return _kill(ports, made, reason=f"sweep {sweep.id} was killed").state.terminal
    except (Conflict, ConditionFailed):
        return True


def look_cost(sweep: Sweep) -> int:
    """The most calls one try of ``advance`` makes on ``sweep`` (as listed) before it releases or
    kills; what those cost is bounded by the budget it is given."""
    return 1 + len(sweep.waiting_on) + 1 + min(len(sweep.indices(OPEN)) + 1, LOOK_PER_ADVANCE) + 3


@dataclass(frozen=True)
class SweepsPass:
    moved: dict[str, str]
    """Per sweep looked at: how it stands, or the error."""
    resume: tuple[float, str] | None
    """The ``(created_at, id)`` of the last sweep looked at, where the next pass goes on (None:
    from the oldest; this pass went round)."""
    turn: int = 0
    """The round its advances read the windows of (where the next pass goes on counting)."""


TURNS = 1_000_000
"""Rounds are counted modulo this (a window moves on by one each round but once in a million)."""


def advance_unfinished(
    ports: Ports, budget: Budget | None = None, after: tuple[float, str] | None = None, turn: int = 0
) -> SweepsPass:
    """The schedule's pass: move unfinished sweeps on, oldest first, from the one after ``after``
    (``UNFINISHED_PER_PASS`` listed at most), while ``budget`` (calls; give ``ports`` metered with
    it) affords one more ``advance`` try's look (``look_cost``) and one release, the releases and
    kills of each bounded by what is left; the first always goes. Returns what
    moved and where the next pass goes on, so that passes reach every unfinished sweep in turn,
    however many one user has. ``turn`` is the round of the previous pass: one that starts from
    the oldest is the next round, whose advances read each sweep's next window of open members."""
    budget = budget or Budget(1 << 62)
    out: dict[str, str] = {}
    listed = ports.sweeps.unfinished(UNFINISHED_PER_PASS, after)
    if not listed and after is not None:  # past the newest: round again from the oldest
        after = None
        listed = ports.sweeps.unfinished(UNFINISHED_PER_PASS)
    if after is None:
        turn = (turn + 1) % TURNS
    last: tuple[float, str] | None = None
    for sweep in listed:
        if out and not budget.affords(look_cost(sweep) + RELEASE_CALLS):
            return SweepsPass(out, last, turn)
        last = (sweep.created_at, sweep.id)
        try:
            moved = advance(ports, sweep.id, budget=budget, turn=turn)
            out[sweep.id] = "finished" if moved.finished_at is not None else f"{moved.status.count(OPEN)} out"
        except RunplaneError as e:
            out[sweep.id] = f"error: {e.message}"
    return SweepsPass(out, last if len(listed) >= UNFINISHED_PER_PASS else None, turn)
