"""A worker's side of a run: claim, renew the lease, move through states, hand back.

Every write checks attempt and worker, so a worker that lost its lease can never overwrite the
state of a newer attempt; it gets LeaseLost instead.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from runplane.domain.errors import BadRequest, ConditionFailed, LeaseLost, PayloadTooLarge, RunplaneError
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent, RunEnd, RunMessage
from runplane.domain.runs import Event, Failure, Run, Usage
from runplane.domain.states import ACTIVE_STATES, FailureReason, RunState, states_leading_to
from runplane.ports import Ports, RunPorts, RunQueue, RunStore
from runplane.services import fallback

log = logging.getLogger(__name__)


def claim(
    store: RunStore,
    run: Run,
    attempt: int,
    worker_id: str,
    lease_seconds: float,
    now: float,
    preemptible: bool = False,
    pool: str | None = None,
) -> Run:
    """Take a queued run at ``attempt`` while it is in ``pool`` (the worker's; by default the pool
    ``run`` was read on): never one that moved on to another pool (``services.fallback``). Raises
    ConditionFailed if the hint is stale.

    On a ``preemptible`` worker, losing the worker later does not use up one of the run's attempts.
    """
    return store.update(
        run,
        Expect(states=frozenset({RunState.QUEUED}), attempt=attempt, waiting=False, queue=pool or run.queue),
        {
            "state": RunState.PREPARING,
            "attempt": attempt + 1,
            "worker_id": worker_id,
            "lease_expires_at": now + lease_seconds,
            "waiting_reason": None,
            "on_preemptible": preemptible,
        },
        Event(at=now, state=RunState.PREPARING, message=f"attempt {attempt + 1} claimed by worker {worker_id}"),
    )


def unclaimable(ports: RunPorts, run: Run, message: str, now: float) -> Run:
    """End a queued ``run`` whose claim its store refuses (a refusal no retry changes, unlike a
    lost race) as ``failed`` (``agent_error``, ``message``), so that it is not offered to worker
    after worker. Should the store refuse that write too, the run is written with its timeline cut
    to its first event and this one: a write smaller than the claim. Tells what waits for it
    (``ended``). Raises ConditionFailed when the run is no longer queued at its attempt on the pool
    ``run`` names, and what the store raises for the smaller write."""
    event = Event(at=now, state=RunState.FAILED, message=message)
    expect = Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt, queue=run.queue)
    changes: dict[str, Any] = {
        "state": RunState.FAILED,
        "finished_at": now,
        "waiting_reason": None,
        "failure": Failure(reason=FailureReason.AGENT_ERROR, message=message),
    }
    try:
        done = ports.store.update(run, expect, changes, event)
    except (BadRequest, PayloadTooLarge) as e:
        log.warning("run %s: its end was refused too (%s); writing it with its timeline cut", run.id, e.message)
        done = ports.store.update(run, expect, {**changes, "events": [*run.events[:1], event]})
    ended(ports.queue, done)
    return done


FREE_REQUEUES = 20


def _mine(run: Run, states: frozenset[RunState]) -> Expect:
    return Expect(states=states, attempt=run.attempt, worker_id=run.worker_id)


def renew(store: RunStore, run: Run, lease_seconds: float, now: float, **changes: Any) -> Run:
    """Extend the lease (and record ``changes`` such as usage). Raises LeaseLost."""
    try:
        return store.update(run, _mine(run, ACTIVE_STATES), {"lease_expires_at": now + lease_seconds, **changes})
    except ConditionFailed as e:
        raise LeaseLost(f"lease on run {run.id} attempt {run.attempt} lost: {e.message}") from e


def advance(store: RunStore, run: Run, new: RunState, now: float, message: str, **changes: Any) -> Run:
    """Move a held run to ``new``. Raises LeaseLost if it is no longer held by this attempt."""
    if new.terminal:
        changes.setdefault("finished_at", now)
        changes.setdefault("lease_expires_at", None)
    if new == RunState.RUNNING:
        changes.setdefault("started_at", now)
    try:
        return store.update(
            run,
            _mine(run, states_leading_to(new) & ACTIVE_STATES),
            {"state": new, **changes},
            Event(at=now, state=new, message=message),
        )
    except ConditionFailed as e:
        raise LeaseLost(f"run {run.id} attempt {run.attempt} cannot become {new}: {e.message}") from e


def note(store: RunStore, run: Run, now: float, message: str) -> Run:
    """Add ``message`` to the timeline of a held run, its state unchanged. Raises LeaseLost if it
    is no longer held by this attempt."""
    try:
        return store.update(run, _mine(run, ACTIVE_STATES), {}, Event(at=now, message=message))
    except ConditionFailed as e:
        raise LeaseLost(f"run {run.id} attempt {run.attempt} is no longer held: {e.message}") from e


def fail(
    store: RunStore,
    run: Run,
    reason: FailureReason,
    message: str,
    now: float,
    *,
    state: RunState | None = None,
    **changes: Any,
) -> Run:
    """End a held run with ``failure = {reason, message}``, as ``state`` when its ender decided it
    (the agent's ``Outcome``), else as ``reason`` says: ``killed``, ``timed_out`` or ``failed``.
    Raises ValueError for a ``state`` that is not a final one of failure, and LeaseLost if the run
    is no longer held by this attempt."""
    if state is None:
        state = {
            FailureReason.KILLED: RunState.KILLED,
            FailureReason.TIME_LIMIT: RunState.TIMED_OUT,
        }.get(reason, RunState.FAILED)
    elif not state.terminal or state == RunState.SUCCEEDED:
        raise ValueError(f"a run cannot fail as {state}")
    return advance(store, run, state, now, message, failure=Failure(reason=reason, message=message), **changes)


def retry(
    ports: RunPorts,
    run: Run,
    reason: FailureReason,
    message: str,
    note: str,
    now: float,
    *,
    memory: int | None = None,
    usage: Usage | None = None,
    exit_code: int | None = None,
    state: RunState | None = None,
) -> Run:
    """Queue a held run again after its attempt ended with ``reason`` (``message``), as its retry
    rule asked (``retries.decide``: ``note``): same id, the next claim makes the next attempt,
    whose logs and outputs are kept apart from this one's. ``memory`` is the next attempt's memory
    limit when it grows. The write holds only while no kill was requested: a kill that came after
    this worker last read the run ends it here, as ``reason`` (in ``state``, as ``fail`` does),
    not retried. A failed hint is logged (the reaper sends it again). Raises LeaseLost if it is no
    longer held by this attempt."""
    changes: dict[str, Any] = {
        "state": RunState.QUEUED,
        "worker_id": None,
        "lease_expires_at": None,
        "hinted_at": now,
        "exit_code": None,
        "waiting_reason": f"attempt {run.attempt} ended {reason}; {note}; waiting for a worker of pool {run.queue}",
        "retention": None,  # its next end is dated afresh (its owner's pin stays)
        **fallback.queued_changes(run, now),
    }
    if usage is not None:
        changes["usage"] = usage
    if memory is not None:
        resources = run.spec.resources.model_copy(update={"memory": memory})
        changes["spec"] = run.spec.model_copy(update={"resources": resources})
    try:
        updated = ports.store.update(
            run,
            replace(_mine(run, ACTIVE_STATES), unkilled=True),
            changes,
            Event(at=now, state=RunState.QUEUED, message=f"attempt {run.attempt} ended {reason}: {message}; {note}"),
        )
    except ConditionFailed as e:
        current = e.details.get("run")
        if (
            isinstance(current, Run)
            and (current.attempt, current.worker_id) == (run.attempt, run.worker_id)
            and current.state in ACTIVE_STATES
            and current.kill_requested
        ):
            ended: dict[str, Any] = {"exit_code": exit_code} | ({"usage": usage} if usage is not None else {})
            why = f"{message}; not retried: it was killed"
            return fail(ports.store, current, reason, why, now, state=state, **ended)
        raise LeaseLost(f"run {run.id} attempt {run.attempt} cannot be retried: {e.message}") from e
    try:
        ports.queue.send(updated.queue, RunMessage(run_id=updated.id, attempt=updated.attempt))
        ports.queue.notify(DispatchEvent(pool=updated.queue, reason="requeued"))
    except RunplaneError as e:
        log.warning("run %s queued again but its hint failed (the reaper sends it again): %s", run.id, e)
    fallback.send_timer(ports, updated, now)
    return updated


def requeue(
    ports: RunPorts,
    run: Run,
    now: float,
    why: str,
    expect: Expect | None = None,
    charge: bool = True,
    usage: Usage | None = None,
    preempted: bool = False,
) -> Run:
    """Put an active run back in its queue for another attempt, or fail it when none is left.

    ``charge=False`` is for hand-backs that are not the run's doing (its worker was told to
    stop, was preempted, or restarted): the attempt number still grows, but one more attempt is
    allowed, up to FREE_REQUEUES. A kill requested before the worker went away ends the run
    ``killed``. ``usage``, when given, is recorded with it (what the attempt used, as its worker
    measured it). A run it ends tells what waits for it (``ended``). ``preempted``: its worker's
    machine was taken away (its preemptions on its pool are counted: at its
    ``fallback_after_preemptions`` it is queued on its next pool instead, ``services.fallback``,
    with a fair tag of that pool's line, and hinted there quietly: a failed hint is the reaper's to
    send again); its fallback timer starts afresh. Raises ConditionFailed (or LeaseLost through callers) if the
    run moved on meanwhile.
    """
    expect = expect or _mine(run, ACTIVE_STATES)
    used = {"usage": usage} if usage is not None else {}
    max_attempts = run.max_attempts
    if not charge and max_attempts - run.attempt < FREE_REQUEUES:
        max_attempts += 1
    if run.kill_requested:
        done = ports.store.update(
            run,
            expect,
            {
                "state": RunState.KILLED,
                "finished_at": now,
                "lease_expires_at": None,
                "failure": Failure(reason=FailureReason.KILLED, message=f"killed; {why}"),
                **used,
            },
            Event(at=now, state=RunState.KILLED, message=f"killed; {why}"),
        )
        ended(ports.queue, done)
        return done
    if run.attempt >= max_attempts:
        message = f"{why}; no attempts left ({run.attempt} of {max_attempts} used)"
        done = ports.store.update(
            run,
            expect,
            {
                "state": RunState.FAILED,
                "finished_at": now,
                "lease_expires_at": None,
                "failure": Failure(reason=FailureReason.WORKER_LOST, message=message),
                **used,
            },
            Event(at=now, state=RunState.FAILED, message=message),
        )
        ended(ports.queue, done)
        return done
    changes: dict[str, Any] = {
        "state": RunState.QUEUED,
        "worker_id": None,
        "lease_expires_at": None,
        "hinted_at": now,
        "max_attempts": max_attempts,
        "waiting_reason": f"re-queued after attempt {run.attempt}: {why}",
        "retention": None,
        **used,
        **fallback.queued_changes(run, now, preempted=preempted),
    }
    pools = ports.pools if isinstance(ports, Ports) else None  # an agent does not read the pools file
    target = fallback.moves_on_preemption(run, pools) if preempted else None
    if target is None:
        updated = ports.store.update(
            run, expect, changes, Event(at=now, state=RunState.QUEUED, message=f"re-queued: {why}")
        )
        ports.queue.send(updated.queue, RunMessage(run_id=updated.id, attempt=updated.attempt))
        ports.queue.notify(DispatchEvent(pool=updated.queue, reason="requeued"))
        fallback.send_timer(ports, updated, now)
        return updated
    times = f"{run.preemptions + 1} time" + ("s" if run.preemptions else "")
    moved = f"preempted {times} on pool {run.queue}: moved to pool {target}"
    changes.update(
        fallback_at=fallback.due_at(run, now, target),
        preemptions=0,
        fair_tag=fallback.tag_on(ports, run, target, now),  # in line there as a run submitted now
        waiting_reason=f"re-queued after attempt {run.attempt}: {why}; {moved}",
    )
    updated = ports.store.move(
        run, expect, target, changes, Event(at=now, state=RunState.QUEUED, message=f"re-queued: {why}; {moved}")
    )
    fallback.tell_moved(ports, updated, now, "requeued")  # quiet: the run is moved, the reaper re-hints it
    return updated


def ended(queue: RunQueue, run: Run) -> None:
    """Tell the dispatcher that ``run`` ended: for its metrics (``RunEnd``), and for what waits for
    it: its sweep (which may release the next member) or runs and sweeps that wait for it
    (``services.dependencies``). ``run`` is the run as its final write returned it, so a dependent
    added before that write is seen. Quiet on failure: the dispatcher's schedule moves sweeps and
    waiting runs on anyway (the metric is lost)."""
    if not run.state.terminal:
        return
    started = run.started_at  # its timeline may no longer hold its start (records.bound_events)
    end = RunEnd(
        state=run.state,
        reason=run.failure.reason if run.failure else None,
        to_running=None if started is None else max(0.0, started - run.created_at),
    )
    try:
        queue.notify(
            DispatchEvent(
                pool=run.queue,
                reason="run ended",
                sweep=run.sweep_id,
                member=run.sweep_index if run.sweep_id is not None else None,
                upstream=run.id if run.dependents else None,
                ended=end,
            )
        )
    except RunplaneError as e:
        log.warning("run %s ended; could not tell the dispatcher: %s", run.id, e)
