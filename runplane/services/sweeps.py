"""Sweeps as their owners ask for them: creating one, reading and listing it, its members and
progress, kill, retry and a change of ``max_parallel``. Each request that changes a sweep ends in
``sweep_advance.advance``, the one writer of its members' status.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass

from runplane.domain.errors import (
    AlreadyExists,
    BadRequest,
    ConditionFailed,
    Conflict,
    InvalidRequest,
    NotAllowed,
    NotFound,
    PayloadTooLarge,
    RunplaneError,
)
from runplane.domain.pools import Pool
from runplane.domain.records import check_spec, largest_member
from runplane.domain.runs import SWEEP_PREFIX, Event, Run
from runplane.domain.states import RunState
from runplane.domain.sweeps import (
    MAX_RECORD_BYTES,
    MAX_SWEEP,
    OPEN,
    PENDING,
    Sweep,
    SweepSpec,
    state_of,
)
from runplane.domain.tenancy import Principal
from runplane.ports import Ports
from runplane.services import checkpoints, dependencies
from runplane.services.authority import check_caller
from runplane.services.runs import (
    HASHED_FIRST,
    _check_priority,
    added_since,
    admit_spec,
    check_listing_owner,
    run_id_for,
)
from runplane.services.sweep_advance import DEPENDENCY_FAILED, advance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Created:
    sweep: Sweep
    created: bool


def _request_hash(spec: SweepSpec) -> str:
    """What an Idempotency-Key's request was; the template's fields added since sweeps came are
    left out while unset, so that a create retried across an upgrade still finds its sweep."""
    added = added_since(spec.run, HASHED_FIRST | {"retry"})
    data = spec.model_dump(mode="json", exclude={"run": added} if added else None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def create_sweep(
    ports: Ports,
    principal: Principal,
    spec: SweepSpec,
    idempotency_key: str | None,
) -> Created:
    """Store a sweep of ``spec.size`` members and release the first ones. The template is checked
    once, as a run submit checks a run (pool, priority, group, inputs, secrets, quotas): every member
    shares it. Same key, same request -> same sweep; a key used for another request is a Conflict. A
    sweep of more than MAX_SWEEP members (its grid times its count) is NotAllowed."""
    if spec.size > MAX_SWEEP:
        raise NotAllowed(f"the sweep has {spec.size} members; at most {MAX_SWEEP}")
    if spec.run.interactive:
        raise NotAllowed("a sweep's runs cannot be interactive (no one could attach to each): submit it as a run")
    secret = ports.tokens.secret() if idempotency_key is not None else b""
    sweep_id = run_id_for(principal.user, idempotency_key, secret, kind="sweep")
    request_hash = _request_hash(spec)
    if idempotency_key is not None:
        try:
            return _replay(ports.sweeps.get(sweep_id), principal.user, request_hash)
        except NotFound:
            pass
    admitted = admit_spec(ports, principal, spec.run)
    pool, group, resolved = admitted.pool, admitted.group, admitted.spec
    check_spec(largest_member(spec.model_copy(update={"run": resolved})), "a member's run spec")
    check_open_cap(ports, pool, principal.user)
    now = ports.clock()
    sweep = Sweep(
        id=sweep_id,
        owner=principal.user,
        owner_groups=sorted(principal.groups),
        group=group,
        spec=spec.model_copy(update={"run": resolved}),
        queue=pool.name,
        created_at=now,
        max_parallel=spec.max_parallel,
        status=PENDING * spec.size,
        request_hash=request_hash,
        waiting_on=admitted.waiting_on,
        events=[Event(at=now, message=f"created with {spec.size} members in pool {pool.name}")],
        restore_from=checkpoints.pinned_source(ports, principal, spec.run),
    )
    if sweep.largest_bytes() > MAX_RECORD_BYTES:
        raise PayloadTooLarge(
            f"the sweep would take {sweep.largest_bytes()} bytes to keep; at most {MAX_RECORD_BYTES}: "
            "fewer or shorter parameter values, or a shorter template"
        )
    try:
        stored = ports.sweeps.create(sweep)
    except AlreadyExists as e:
        return _replay(e.details["sweep"], principal.user, request_hash)
    dependencies.follow(ports, SWEEP_PREFIX + stored.id, stored.waiting_on)
    return Created(_advance_quietly(ports, stored), created=True)


OPEN_CAP_PAGES = 5
"""Pages of a user's sweeps (newest first) read to count their unfinished ones against a cap."""


def check_open_cap(ports: Ports, pool: Pool, user: str) -> None:
    """Refuse (InvalidRequest, naming the cap) one more sweep of ``user`` in ``pool`` when they
    have ``pool.max_open_sweeps`` unfinished there already: each costs the dispatcher's schedule a
    look per pass. Counted among the user's newest ``OPEN_CAP_PAGES`` pages of sweeps."""
    found, cursor = 0, None
    for _ in range(OPEN_CAP_PAGES):
        page, cursor = ports.sweeps.list(user, 100, cursor)
        found += sum(1 for sweep in page if sweep.finished_at is None and sweep.queue == pool.name)
        if found >= pool.max_open_sweeps or cursor is None:
            break
    if found >= pool.max_open_sweeps:
        raise NotAllowed(
            f"you have {found} unfinished sweeps in pool {pool.name}; at most {pool.max_open_sweeps} may be "
            "open at once: wait for some to finish, or kill some"
        )


def _replay(existing: Sweep, user: str, request_hash: str) -> Created:
    if existing.owner != user or existing.request_hash != request_hash:
        raise Conflict("Idempotency-Key was already used for a different request")
    return Created(existing, created=False)


def _advance_quietly(ports: Ports, sweep: Sweep) -> Sweep:
    """``advance`` after a write the caller has made: its failure is logged, not raised (the
    dispatcher's schedule moves every unfinished sweep on)."""
    try:
        return advance(ports, sweep.id)
    except RunplaneError as e:
        log.warning("sweep %s: could not release members now (the schedule will): %s", sweep.id, e)
        return sweep


def get_sweep(ports: Ports, principal: Principal, sweep_id: str) -> Sweep:
    """The caller's sweep (an admin: anyone's). Another user's answers as one that does not exist."""
    sweep = ports.sweeps.get(sweep_id)
    if sweep.owner != principal.user and not principal.admin:
        raise NotFound(f"sweep {sweep_id} not found")
    return sweep


def list_sweeps(
    ports: Ports, principal: Principal, owner: str | None, limit: int, cursor: str | None
) -> tuple[list[Sweep], str | None]:
    owner = check_listing_owner(principal, owner)
    return ports.sweeps.list(owner, limit, cursor)


def kill_sweep(ports: Ports, principal: Principal, sweep_id: str) -> Sweep:
    """End every unfinished member: those not released are killed at once, queued ones too, and
    running ones are told to stop. Raises Conflict when the sweep has finished."""
    sweep = get_sweep(ports, principal, sweep_id)
    for _ in range(8):
        if sweep.finished_at is not None:
            raise Conflict(f"sweep {sweep.id} has already finished")
        if sweep.killed:
            break
        now = ports.clock()
        try:
            sweep = ports.sweeps.save(
                sweep.model_copy(
                    update={
                        "killed": True,
                        "events": sweep.with_event(Event(at=now, message=f"killed by {principal.user}")),
                    }
                )
            )
            break
        except ConditionFailed as e:
            sweep = e.details["sweep"]
    else:
        raise Conflict(f"sweep {sweep_id} changed too often; try again")
    return advance(ports, sweep.id)


def check_release(ports: Ports, principal: Principal, sweep: Sweep) -> tuple[list[str], str | None]:
    """Admission again, for a request that releases more of ``sweep``: its owner must still be in
    the group it is charged to and allowed its inputs -- the caller's token now when the caller is
    the owner; for an administrator acting on another's sweep, the owner's tokens as the store
    holds them now -- and the caller may still give its priority. Returns the owner's groups now
    and the group the sweep is charged to now (one stored charged to none: as ``authority.charge``
    says). Raises Forbidden, and InvalidRequest (charged to none, and the owner is in several
    groups with no default group)."""
    _check_priority(principal, ports.pools.get(sweep.queue), sweep.spec.run.priority)
    if principal.user == sweep.owner:
        group = check_caller(principal, sweep.spec.run, sweep.group, ports.inputs)
        return sorted(set(principal.groups)), group
    owner, _ = ports.owners.allows(sweep.owner, sweep.spec.run, sweep.group, ports.inputs)
    group = check_caller(owner, sweep.spec.run, sweep.group, ports.inputs)
    return sorted(set(owner.groups)), group


def retry_sweep(ports: Ports, principal: Principal, sweep_id: str) -> tuple[Sweep, int]:
    """Run again the members whose latest try failed, was killed or timed out (each as a new run,
    its next try, with the owner's groups now); returns the sweep and how many go again. Raises
    Forbidden when the owner may no longer run the sweep (``check_release``)."""
    sweep = get_sweep(ports, principal, sweep_id)
    groups, group = check_release(ports, principal, sweep)
    pool = ports.pools.get(sweep.queue)
    if sweep.finished_at is not None and pool is not None:  # it opens again: it counts against the cap
        check_open_cap(ports, pool, sweep.owner)
    for _ in range(8):
        # members that never ran because what the sweep waits for failed would only fail again
        never = DEPENDENCY_FAILED if sweep.waiting_on else None
        again = [
            i
            for i, code in enumerate(sweep.status)
            if state_of(code) not in (None, RunState.SUCCEEDED) and code != never
        ]
        if not again:
            return sweep, 0
        now = ports.clock()
        status = list(sweep.status)
        tries = dict(sweep.tries)
        for index in again:
            status[index] = PENDING
            tries[str(index)] = tries.get(str(index), 1) + 1
        event = Event(at=now, message=f"{len(again)} members run again, by {principal.user}")
        try:
            sweep = ports.sweeps.save(
                sweep.model_copy(
                    update={
                        "status": "".join(status),
                        "tries": tries,
                        "killed": False,
                        "finished_at": None,
                        "owner_groups": groups,
                        "group": group,
                        "events": sweep.with_event(event),
                    }
                )
            )
        except ConditionFailed as e:
            sweep = e.details["sweep"]
            continue
        return _advance_quietly(ports, sweep), len(again)
    raise Conflict(f"sweep {sweep_id} changed too often; try again")


def set_max_parallel(ports: Ports, principal: Principal, sweep_id: str, most: int | None) -> Sweep:
    """Change how many members may be out at once (None: as many as the pool can run). Members out
    beyond a lowered cap go on; no more are released until the sweep is under it. Raises Forbidden
    when the owner may no longer run the sweep (``check_release``)."""
    if most is not None and not 1 <= most <= MAX_SWEEP:
        raise InvalidRequest(f"max_parallel must be between 1 and {MAX_SWEEP}")
    sweep = get_sweep(ports, principal, sweep_id)
    _, group = check_release(ports, principal, sweep)
    for _ in range(8):
        if sweep.max_parallel == most:
            return sweep
        now = ports.clock()
        event = Event(
            at=now, message=f"max_parallel {sweep.max_parallel or 'none'} -> {most or 'none'} by {principal.user}"
        )
        try:
            sweep = ports.sweeps.save(
                sweep.model_copy(update={"max_parallel": most, "group": group, "events": sweep.with_event(event)})
            )
        except ConditionFailed as e:
            sweep = e.details["sweep"]
            continue
        return _advance_quietly(ports, sweep)
    raise Conflict(f"sweep {sweep_id} changed too often; try again")


@dataclass(frozen=True)
class Progress:
    counts: dict[str, int]
    failures: dict[str, int]
    waiting: int
    """Members not released yet."""
    waiting_for: str | None = None
    """Why none is: what the sweep waits for."""


def progress(ports: Ports, sweep: Sweep) -> Progress:
    """Members by the state of their latest try (the open ones read live: at most the sweep's
    window), finished ones by failure reason, and how many wait to be released."""
    counts, failures = sweep.tally()
    waiting = sweep.status.count(PENDING)
    for index in sweep.indices(OPEN):
        try:
            run = ports.store.get(sweep.member_id(index))
        except NotFound:
            continue  # released a moment ago: queued
        if run.state == RunState.QUEUED:
            continue
        counts[str(RunState.QUEUED)] -= 1
        counts[str(run.state)] = counts.get(str(run.state), 0) + 1
        if run.state.terminal and run.failure is not None:
            failures[str(run.failure.reason)] = failures.get(str(run.failure.reason), 0) + 1
    waiting_for = None
    if sweep.waiting_on and sweep.finished_at is None and not sweep.killed:
        verdict = dependencies.judge(ports, sweep.waiting_on)
        waiting_for = verdict.reason or verdict.failed
    return Progress({k: v for k, v in counts.items() if v}, failures, waiting, waiting_for)


def members(
    ports: Ports,
    sweep: Sweep,
    state: RunState | None,
    limit: int,
    cursor: str | None,
    budget: int = 1000,
) -> tuple[list[Run], str | None]:
    """The sweep's member runs (latest tries) in index order, from ``cursor`` (an index), those in
    ``state`` only when given; members not released have no run and are left out. Reads at most
    ``budget`` members a call: the page may come back short with a cursor to go on."""
    start = 0
    if cursor:
        if not re.fullmatch(r"[0-9]{1,6}", cursor) or int(cursor) > sweep.size:
            raise BadRequest("cursor is not valid; pass the next_cursor of a previous page")
        start = int(cursor)
    found: list[Run] = []
    read = 0
    for index in range(start, sweep.size):
        code = sweep.status[index]
        known = state_of(code)  # None: not released, or out (its run says)
        if code == PENDING or (state is not None and known is not None and known != state):
            continue
        if read >= budget:
            return found, str(index)
        read += 1
        try:
            run = ports.store.get(sweep.member_id(index))
        except NotFound:
            continue
        if state is not None and run.state != state:
            continue
        found.append(run)
        if len(found) >= limit:
            return found, str(index + 1) if index + 1 < sweep.size else None
    return found, None
