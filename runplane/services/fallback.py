"""Fallback between pools: a run names the pools it may run on in order (``[spec.queue,
*spec.fallback]``, its chain) and moves on to the next one when it has not started on its pool
within ``spec.fallback_after`` or was preempted there ``spec.fallback_after_preemptions`` times.

``Run.queue`` is always the pool the run is filed and runs in now; a move never goes back. The time
it moves at is ``Run.fallback_at``, set whenever it is (re)queued on a pool that has a next one (a
run that waits for others: when it is released); a timer on the dispatcher's event queue
(``DispatchEvent.fallback``) carries it there, and the reaper's pass moves a due run whose timer
was lost. Every move is a conditional write on the queued run at its attempt, on the pool it was
read on, after its ``fallback_at`` was found the timer's: a stale or duplicate timer moves nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from runplane.domain.errors import ConditionFailed, NotAllowed, NotFound, RunplaneError
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.pools import Pool, PoolConfig
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.units import format_duration
from runplane.ports import MAX_NOTIFY_DELAY, Ports, RunPorts
from runplane.services.scheduling import fair_tag, virtual_time

log = logging.getLogger(__name__)

TIMER_REASON = "fallback"


def chain(spec: RunSpec) -> list[str]:
    """The pools a run (its spec as stored: ``queue`` filled in) may run on, in order."""
    return [spec.queue, *spec.fallback] if spec.queue is not None else list(spec.fallback)


def next_pool(run: Run, queue: str | None = None) -> str | None:
    """The pool after ``queue`` (default: the one ``run`` is on) in its chain; None: it is the last
    (or not in the chain at all)."""
    pools = chain(run.spec)
    here = run.queue if queue is None else queue
    if here not in pools:
        return None
    place = pools.index(here) + 1
    return pools[place] if place < len(pools) else None


def next_configured(run: Run, pools: PoolConfig | None, queue: str | None = None) -> str | None:
    """The pool ``run`` moves to from ``queue`` (default: its pool): the next one of its chain that
    ``pools`` configures, passing over those no longer configured; None: there is none. Without
    ``pools`` (an agent, which does not read the pools file) simply the next one: a run an agent
    moves onto a pool no longer configured is moved on from there by the reaper (``reap``)."""
    target = next_pool(run, queue)
    while pools is not None and target is not None and pools.get(target) is None:
        target = next_pool(run, target)
    return target


def tag_on(ports: RunPorts, run: Run, target: str, now: float) -> float:
    """The fair tag of ``run`` moved now to pool ``target``: it goes in that pool's line as a run its
    owner submits there now (``scheduling.fair_tag``), never with the tag of the line it left. An
    agent (``ports`` not the control plane's), which does not write the owners' lanes of other
    pools, tags it at that line's virtual time: as a run of an owner with no lead there."""
    if isinstance(ports, Ports):
        pool = ports.pools.get(target)
        if pool is not None:
            return fair_tag(ports, pool, run.owner, run.spec.priority, now)
    return virtual_time(ports, target, run.spec.priority)


def due_at(run: Run, now: float, queue: str | None = None) -> float | None:
    """When ``run``, queued on ``queue`` (default: its pool) at ``now``, moves on if it has not
    started by then; None when it does not move on by time (no ``fallback_after``, or no next pool)."""
    if run.spec.fallback_after is None or next_pool(run, queue) is None:
        return None
    return now + run.spec.fallback_after


def queued_changes(run: Run, now: float, *, preempted: bool = False) -> dict[str, Any]:
    """What a write that puts ``run`` (back) in its pool's line sets of its fallback: its timer
    started afresh, and its preemptions there counted (``preempted``). Nothing for a run without
    a chain: its record stays as an older release wrote it."""
    if not run.spec.fallback:
        return {}
    changes: dict[str, Any] = {"fallback_at": due_at(run, now)}
    if preempted:
        changes["preemptions"] = run.preemptions + 1
    return changes


def moves_on_preemption(run: Run, pools: PoolConfig | None = None) -> str | None:
    """The pool a run preempted now (its count not yet raised) is queued on instead of its own:
    the next one (``next_configured``) once it reached ``spec.fallback_after_preemptions`` there;
    None: it stays."""
    most = run.spec.fallback_after_preemptions
    if most is None or run.preemptions + 1 < most:
        return None
    return next_configured(run, pools)


def send_timer(ports: RunPorts, run: Run, now: float) -> None:
    """Send ``run``'s timer for its ``fallback_at`` (none when it has none), delayed until it is due,
    at most MAX_NOTIFY_DELAY: one that comes early is sent again with what is left (``on_timer``).
    Quiet on failure: the reaper's pass moves a run whose time is up."""
    if run.fallback_at is None or run.state != RunState.QUEUED:
        return
    delay = min(MAX_NOTIFY_DELAY, max(0, math.ceil(run.fallback_at - now)))
    event = DispatchEvent(pool=run.queue, reason=TIMER_REASON, fallback=run.id, due=run.fallback_at)
    try:
        ports.queue.notify(event, delay_seconds=delay)
    except RunplaneError as e:
        log.warning("run %s: fallback timer not sent (the reaper moves it when due): %s", run.id, e)
    except Exception:  # any other failure of the queue's client: the write its caller made stands
        log.exception("run %s: fallback timer not sent (the reaper moves it when due)", run.id)


def check_chain(ports: Ports, first: Pool, asked: RunSpec, spec: RunSpec, allowed: Callable[[Pool], None]) -> None:
    """NotAllowed unless ``asked``'s fallback (``spec``: as it will be stored, its first pool
    ``first``'s defaults filled in) can be taken as asked: its first pool named (``queue``), pools
    to fall back to exactly when it says when (``fallback_after``, ``fallback_after_preemptions``),
    no pool twice, and every pool of it exists, fits the run's resources and is allowed to the
    caller as the first one is (``allowed``, which raises what a submit to that pool would). The
    run keeps the first pool's defaults on every pool (``_check_defaults``)."""
    if asked.fallback and asked.queue is None:
        raise NotAllowed("a run with pools to fall back to must name the first pool in queue (or give queue as a list)")
    when = spec.fallback_after is not None or spec.fallback_after_preemptions is not None
    if spec.fallback and not when:
        raise NotAllowed("a run with pools to fall back to needs fallback_after or fallback_after_preemptions")
    if when and not spec.fallback:
        raise NotAllowed(
            "fallback_after and fallback_after_preemptions need pools to fall back to (queue as a list, or fallback)"
        )
    seen = {first.name}
    for name in spec.fallback:
        if name in seen:
            raise NotAllowed(f"pool {name} is named twice among the run's pools: a run never goes back to a pool")
        seen.add(name)
        pool = ports.pools.get(name)
        if pool is None:
            names = ", ".join(p.name for p in ports.pools.pools)
            raise NotAllowed(f"fallback pool {name!r} does not exist; pools are: {names}")
        _check_defaults(first, pool, asked, spec)
        why = pool.misfit(spec.resources)
        if why:
            raise NotAllowed(f"fallback pool {name} ({pool.shape()}) cannot run this: {why}")
        try:
            allowed(pool)
        except RunplaneError as e:
            raise NotAllowed(f"fallback pool {name}: {e.message}") from e


def _check_defaults(first: Pool, pool: Pool, asked: RunSpec, spec: RunSpec) -> None:
    """NotAllowed when what ``first`` filled in of what the run left out (``asked``; ``spec`` as
    stored) would run it otherwise, or not at all, on fallback pool ``pool``: the image it runs is
    the first pool's default where the pools' defaults differ, or the memory, disk or time the
    first pool gave it does not fit ``pool``. The message names the field to give."""
    if asked.image is None and pool.default_image != first.default_image:
        raise NotAllowed(
            f"pools {first.name} and {pool.name} have different default images ({first.default_image}, "
            f"{pool.default_image}): give the run's image, which it runs on every pool it may fall back to"
        )
    if pool.misfit(asked.resources) is not None:
        return  # what the run asks itself does not fit: said as such (``check_chain``)
    for field in ("memory", "disk", "time"):
        if getattr(asked.resources, field) is not None:
            continue
        alone = spec.resources.model_copy(
            update={other: None for other in ("memory", "disk", "time") if other != field}
        )
        why = pool.misfit(alone)
        if why:
            raise NotAllowed(
                f"fallback pool {pool.name} cannot take the {field} pool {first.name} gives a run that asks none "
                f"({why}): give resources.{field}, which the run keeps on every pool it may fall back to"
            )


def on_timer(ports: Ports, event: DispatchEvent) -> Run | None:
    """The dispatcher's handling of a run's fallback timer: moved to its next pool when its time is
    up and it is still queued on the event's pool with that ``fallback_at`` (the run as moved is
    returned); sent again with the time left when early; else (it started, moved, ended, was
    re-queued with a new timer, or is gone) dropped. Idempotent. Raises what the stores raise (the
    event is tried again)."""
    if event.fallback is None or event.due is None:
        return None
    try:
        run = ports.store.get(event.fallback)
    except NotFound:
        return None
    if not _armed(run, event.pool, event.due):
        return None
    now = ports.clock()
    if run.fallback_at is not None and now < run.fallback_at:
        send_timer(ports, run, now)
        return None
    return fall_back(ports, run, now)


def _armed(run: Run, pool: str, due: float) -> bool:
    """Whether ``run`` is still queued on ``pool``, in its line, with its timer at ``due``."""
    return (
        run.state == RunState.QUEUED
        and run.queue == pool
        and not run.waiting_on
        and run.fallback_at is not None
        and abs(run.fallback_at - due) < 1e-3
    )


def fall_back(ports: Ports, run: Run, now: float, by: str = "") -> Run | None:
    """Move a queued ``run`` whose ``fallback_at`` is up to its next pool: filed there with a fair
    tag of that pool's line, its timer set for the pool after (if any), hinted, and that pool's
    dispatcher nudged; a pool of its chain no longer configured is passed over, and a run on such a
    pool (an agent moved it there) moves on whenever it is found. ``by``: what its timeline adds of
    who moved it when not its timer. None when it is no longer as read (it started, moved or ended
    meanwhile) or has no next pool. Raises what the store raises."""
    target = next_configured(run, ports.pools)
    stranded = ports.pools.get(run.queue) is None
    if target is None or (not stranded and (run.fallback_at is None or now < run.fallback_at)):
        return None
    changes: dict[str, Any] = {
        "fallback_at": due_at(run, now, target),
        "preemptions": 0,
        "fair_tag": tag_on(ports, run, target, now),
        "hinted_at": now,
        "waiting_reason": f"moved from pool {run.queue}: waiting for a worker of pool {target}",
    }
    if stranded:
        message = f"pool {run.queue} is no longer configured: moved to pool {target}"
    else:
        message = f"not started on pool {run.queue} within {format_duration(run.spec.fallback_after or 0)}: "
        message += f"moved to pool {target}"
    if by:
        message += f" ({by})"
    try:
        moved = ports.store.move(run, _still(run), target, changes, Event(at=now, message=message))
    except ConditionFailed:
        return None
    tell_moved(ports, moved, now)
    return moved


def _still(run: Run) -> Expect:
    """A move's condition: queued at its attempt, in its line (not waiting on runs). That it is still
    on the pool read is the store's move's own check (ConditionFailed otherwise): a timer handled
    twice at once moves the run once."""
    return Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt, waiting=False)


def tell_moved(ports: RunPorts, run: Run, now: float, reason: str = "fell back") -> None:
    """Hint a run just moved (or re-queued) to its pool, nudge that pool's dispatcher (``reason``)
    and start its timer there. Quiet on failure: the reaper re-sends hints of queued runs."""
    try:
        ports.queue.send(run.queue, RunMessage(run_id=run.id, attempt=run.attempt))
        ports.queue.notify(DispatchEvent(pool=run.queue, reason=reason))
    except RunplaneError as e:
        log.warning("run %s moved to pool %s but its hint failed (the reaper re-sends it): %s", run.id, run.queue, e)
    send_timer(ports, run, now)


def when_words(run: Run, now: float) -> str:
    """What a queued run's waiting reason adds of its fallback: "; preempted 2 of 3 times on pool A"
    (fallback_after_preemptions, once it was preempted there) and "; falls back to pool B at 10:42:05
    UTC (in 12m)" (its timer); empty when it has neither."""
    target = next_pool(run)
    if run.state != RunState.QUEUED or target is None:
        return ""
    most = run.spec.fallback_after_preemptions
    words = f"; preempted {run.preemptions} of {most} times on pool {run.queue}" if most and run.preemptions else ""
    if run.fallback_at is None:
        return words
    at = time.strftime("%H:%M:%S", time.gmtime(run.fallback_at))
    left = run.fallback_at - now
    when = f"in {format_duration(left)}" if left >= 0.5 else "due now"
    return f"{words}; falls back to pool {target} at {at} UTC ({when})"
