"""Submitting, reading, listing and killing runs."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from runplane.domain.common import NAME_PATTERN
from runplane.domain.errors import (
    AlreadyExists,
    ConditionFailed,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotAllowed,
    NotFound,
    RunplaneError,
)
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.pools import Pool, choose_pool
from runplane.domain.records import check_spec
from runplane.domain.runs import LABEL_KEY_PATTERN, MAX_LABEL_VALUE, Event, Failure, Run, RunSpec
from runplane.domain.states import ACTIVE_STATES, DEFAULT_MAX_ATTEMPTS, FailureReason, RunState
from runplane.domain.tenancy import USER_PATTERN, Principal
from runplane.ports import Page, Ports
from runplane.services import checkpoints, dependencies, fallback, lifecycle, secrets, sessions, skew, uploads
from runplane.services.admission import refuse_alone
from runplane.services.auth import check_owner
from runplane.services.authority import charged_group, check_caller
from runplane.services.scheduling import fair_tag

log = logging.getLogger(__name__)


def run_id_for(owner: str, idempotency_key: str | None, secret: bytes, kind: str = "run") -> str:
    """A random id, or one derived from (owner, key) so a retried submit finds its run (``kind``
    ``sweep``: its sweep, ids ``s-``). The derivation is keyed with the stack's secret: nobody can
    compute another user's id from a key they know or guess."""
    prefix = "s-" if kind == "sweep" else "r-"
    if idempotency_key is None:
        return prefix + uuid.uuid4().hex[:24]
    if not secret:
        raise ValueError(f"a {kind} id derived from an Idempotency-Key needs the stack's secret")
    salt = "" if kind == "run" else f"{kind}\0"  # run ids stay what they were
    digest = hmac.new(secret, f"{salt}{owner}\0{idempotency_key}".encode(), hashlib.sha256).hexdigest()
    return prefix + digest[:24]


LABEL_KEY = re.compile(LABEL_KEY_PATTERN)

HASHED_FIRST = frozenset(
    {"command", "image", "name", "queue", "resources", "env", "inputs", "network", "tag", "group", "priority"}
)
"""The fields of a run's spec that its request hash held from its first version."""


@functools.cache
def _added_defaults(first: frozenset[str]) -> tuple[tuple[str, object], ...]:
    """The fields of RunSpec not in ``first`` with their defaults, made once (pydantic inspects a
    default factory's signature on each ``get_default``): only compared, never handed out."""
    return tuple(
        (name, field.get_default(call_default_factory=True))
        for name, field in RunSpec.model_fields.items()
        if name not in first
    )


def added_since(spec: RunSpec, first: frozenset[str] = HASHED_FIRST) -> set[str]:
    """The fields of ``spec`` added since ``first`` that hold their default: a request hash leaves
    them out, so that a submit retried across an upgrade still finds its run."""
    return {name for name, default in _added_defaults(first) if getattr(spec, name) == default}


def _request_hash(spec: RunSpec) -> str:
    """What an Idempotency-Key's request was (fields added since the first version left out while
    they hold their default)."""
    data = spec.model_dump(mode="json", exclude=added_since(spec))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Submitted:
    run: Run
    created: bool


def submit_run(ports: Ports, principal: Principal, spec: RunSpec, idempotency_key: str | None) -> Submitted:
    """Store a queued run and hint its pool queue. Same key, same request -> same run.

    A run whose ``run:`` inputs, ``after`` or ``after_sweep`` name runs or a sweep that have not
    succeeded yet is stored waiting for them, out of its pool's line, and hinted only once they have
    (``services.dependencies``).

    An ``idempotency_key`` is keyed with the stack's secret (``run_id_for``). What runs may read is
    ``ports.inputs``; a run that could never start under its owner's or group's quota is refused.
    Runs of one priority take turns between users (``scheduling.fair_tag``). The run is charged to
    ``spec.group`` (one of the caller's groups), else to the caller's only group, else to the
    default group an administrator set for a caller in several (``authority.charged_group``), else
    to no group. Raises Unschedulable/InvalidRequest when no pool fits, an input is not allowed, the
    group is not the caller's (or a caller in several groups names none and has no default) or a
    quota can never admit the run, NotFound for a ``run:`` input the caller cannot see or a secret
    the caller may not use (``secrets.check_run``: a missing one reads alike) or an ``upload:`` input
    the caller did not upload (``uploads.check_run``), NotAllowed for pools to fall back to it cannot
    take (``fallback.check_chain``), Forbidden when a caller who is not an admin asks a priority
    above the pool's ``max_user_priority``, Conflict when the key was used for a different request,
    and what ``checkpoints.pinned_source`` raises for ``from_checkpoint`` (NotFound, Conflict). A
    failed hint is logged, not raised: the run is stored, and the reaper re-sends hints for queued runs.
    """
    secret = ports.tokens.secret() if idempotency_key is not None else b""
    run_id = run_id_for(principal.user, idempotency_key, secret)
    request_hash = _request_hash(spec)
    if idempotency_key is not None:
        # a retried submit answers with its run before it is checked again or takes a place in
        # the line (what it waits for may have ended since: it got its answer then)
        try:
            return _replay(ports, ports.store.get(run_id), principal, request_hash)
        except NotFound:
            pass
    admitted = admit_spec(ports, principal, spec)
    pool, group, resolved = admitted.pool, admitted.group, admitted.spec
    if admitted.waiting_on:  # waiting runs cost the dispatcher's schedule: a user has a cap of them
        dependencies.check_waiting_cap(ports, pool, principal.user)
    now = ports.clock()
    # runs of one priority take turns between users (a run that waits for others takes its place
    # when it is released)
    tag = 0.0
    if not admitted.waiting_on:
        tag = fair_tag(ports, pool, principal.user, resolved.priority, now)
    run = Run(
        id=run_id,
        owner=principal.user,
        owner_groups=sorted(principal.groups),
        group=group,
        spec=resolved,
        queue=pool.name,
        created_at=now,
        request_hash=request_hash,
        fair_tag=tag,
        max_attempts=resolved.retry.attempts if resolved.retry is not None else DEFAULT_MAX_ATTEMPTS,
        hinted_at=now,
        waiting_reason=f"waiting for a worker of pool {pool.name}",
        events=[Event(at=now, state=RunState.QUEUED, message=f"submitted to pool {pool.name}")],
        restore_from=checkpoints.pinned_source(ports, principal, spec),
    )
    if admitted.waiting_on:
        run.waiting_on = admitted.waiting_on
        run.waiting_reason = admitted.waiting_reason
    else:  # a run that waits for others starts its time on its pool when it is released
        run.fallback_at = fallback.due_at(run, now)
    try:
        ports.store.create(run)
    except AlreadyExists as e:  # a retry that raced this one
        return _replay(ports, e.details["run"], principal, request_hash)
    if run.waiting_on:
        dependencies.follow(ports, run.id, run.waiting_on)
        try:
            return Submitted(dependencies.resolve(ports, run, principal), created=True)
        except RunplaneError as e:  # stored and followed: the dispatcher's schedule resolves it
            log.warning("run %s stored but could not be resolved now: %s", run.id, e)
            return Submitted(run, created=True)
    _hint(ports, run)
    return Submitted(run, created=True)


@dataclass(frozen=True)
class Admitted:
    pool: Pool
    group: str | None
    spec: RunSpec
    """The spec with the pool's defaults filled in."""
    waiting_on: list[str]
    """The runs (and sweep) it names that have not succeeded yet."""
    waiting_reason: str | None
    """Why it waits for them (None: it waits for nothing)."""


def admit_spec(ports: Ports, principal: Principal, spec: RunSpec) -> Admitted:
    """What a submit checks of a run before anything is stored (``submit_run`` says what it
    raises), and the run's pool, the group it is charged to, its spec with the pool's defaults
    filled in (image, queue, resources, retry rule) and what it waits for."""
    check_spec(spec)  # PayloadTooLarge: every write the run needs must fit its record
    pool = choose_pool(ports.pools, spec.resources, spec.queue)
    _check_priority(principal, pool, spec.priority)
    sessions.check_interactive(ports, pool, spec)
    group = charged_group(principal, spec.group)
    for name, source in spec.inputs.items():
        if not source.startswith("run:"):
            ports.inputs.check(name, source, principal.groups)
    secrets.check_run(ports, principal, spec)  # each must be the caller's to use (the worker checks again)
    uploads.check_run(ports, principal, spec)  # each must be the caller's own upload (404 otherwise)
    # the runs a run: input names are checked here, with those it waits for (the worker checks again)
    waits = dependencies.admit(ports, principal, spec)
    resolved = spec.model_copy(
        update={
            "image": spec.image or pool.default_image,
            "queue": pool.name,
            "resources": pool.with_defaults(spec.resources),
            "retry": spec.retry or pool.retry,
        }
    )
    refuse_alone(ports.quotas, principal.user, group, resolved.resources)
    _check_agents(ports, pool, resolved)

    def allowed(other: Pool) -> None:  # a pool to fall back to is checked as the first one is
        _check_priority(principal, other, spec.priority)
        sessions.check_interactive(ports, other, spec)
        _check_agents(ports, other, resolved)

    fallback.check_chain(ports, pool, spec, resolved, allowed)
    return Admitted(pool, group, resolved, waits.waiting, waits.reason)


def _check_agents(ports: Ports, pool: Pool, spec: RunSpec) -> None:
    """NotAllowed when ``spec`` sets a field added since the previous release that some live agent
    of ``pool`` does not know (it would wait for ever there): as the pool's record counted them. A
    record that cannot be read lets it in (the agents leave such a run, and say why it waits)."""
    if not skew.later_fields(spec):
        return
    try:
        versions = ports.pool_states.get(pool.name).agent_versions
    except RunplaneError as e:
        log.warning("pool record of %s unreadable, its agents' versions not checked: %s", pool.name, e)
        return
    why = skew.too_new_for(pool.name, spec, versions)
    if why:
        raise NotAllowed(why)


def _replay(ports: Ports, existing: Run, caller: Principal, request_hash: str) -> Submitted:
    """The answer to ``caller``'s submit whose Idempotency-Key made ``existing``: that run (hinted
    again while queued; one that waits for runs follows them and is resolved again, finishing a
    submit that stopped half-way: released only as the caller's token allows now, with its groups,
    ``dependencies.resolve``), or Conflict when the key was used for a different request."""
    if existing.owner != caller.user or existing.request_hash != request_hash:
        raise Conflict("Idempotency-Key was already used for a different request")
    if existing.state == RunState.QUEUED and existing.waiting_on:
        dependencies.follow(ports, existing.id, existing.waiting_on)
        try:
            existing = dependencies.resolve(ports, existing, caller)
        except RunplaneError as e:
            log.warning("run %s could not be resolved now: %s", existing.id, e)
    elif existing.state == RunState.QUEUED:
        _hint(ports, existing)
    return Submitted(existing, created=False)


def _check_priority(principal: Principal, pool: Pool | None, priority: int) -> None:
    """Users may give a run of ``pool`` a priority up to the pool's ``max_user_priority`` (a pool
    that is no longer configured: the default one); admins, any. Raises Forbidden."""
    most = pool.max_user_priority if pool is not None else Pool.model_fields["max_user_priority"].default
    if priority > most and not principal.admin:
        where = f"pool {pool.name}" if pool is not None else "this pool"
        raise Forbidden(f"priority {priority} is above {most}, the most {where} allows users; only admins may set more")


def _hint(ports: Ports, run: Run) -> None:
    try:
        ports.queue.send(run.queue, RunMessage(run_id=run.id, attempt=run.attempt))
        ports.queue.notify(DispatchEvent(pool=run.queue))
    except RunplaneError as e:
        log.warning("run %s stored but its queue hint failed (the reaper re-sends it): %s", run.id, e)
    fallback.send_timer(ports, run, ports.clock())


def get_run(ports: Ports, principal: Principal, run_id: str) -> Run:
    """The caller's run (an admin: anyone's). Raises NotFound, also for another user's."""
    run = ports.store.get(run_id)
    check_owner(principal, run)
    return run


def list_runs(
    ports: Ports,
    principal: Principal,
    *,
    owner: str | None = None,
    state: RunState | None,
    queue: str | None,
    limit: int,
    cursor: str | None,
    label: str | None = None,
) -> Page:
    """The caller's runs, newest first; an admin may list another ``owner``'s. With ``label``
    (``key=value``), only those with that label among the runs the listing reads: a page may come
    back short, even empty, with a cursor to go on. Raises Forbidden (another user's, without
    admin), InvalidRequest (a name that cannot be a user or a pool, a label filter that is not
    ``key=value``) and BadRequest (a cursor this listing did not make)."""
    owner = check_listing_owner(principal, owner)
    if queue is not None and not re.fullmatch(NAME_PATTERN, queue):
        raise InvalidRequest(f"queue {queue[:80]!r} is not a pool name")
    wanted = label_filter(label)
    page = ports.store.list(owner=owner, state=state, queue=queue, limit=limit, cursor=cursor)
    return page if wanted is None else Page(labelled(page.runs, wanted), page.next_cursor)


def label_filter(text: str | None) -> tuple[str, str] | None:
    """A listing's ``label`` filter, ``key=value``, as (key, value); None for none. Raises
    InvalidRequest when the key cannot be a label's or the value is too long to be one's."""
    if text is None:
        return None
    key, sep, value = text.partition("=")
    if not sep or not LABEL_KEY.fullmatch(key) or len(value) > MAX_LABEL_VALUE:
        raise InvalidRequest(
            f"label {text[:80]!r} is not key=value with a label's key (a-z, 0-9, . _ / -) and a value of at most "
            f"{MAX_LABEL_VALUE} characters"
        )
    return key, value


def labelled(found: list[Run], wanted: tuple[str, str] | None) -> list[Run]:
    """The runs of ``found`` that carry the label ``wanted`` (all of them for None)."""
    if wanted is None:
        return found
    key, value = wanted
    return [run for run in found if run.spec.labels.get(key) == value]


def check_listing_owner(principal: Principal, owner: str | None) -> str:
    """Whose runs (or sweeps) a listing shows: the caller's, or ``owner``'s for an admin. Raises
    Forbidden (another user's, without admin) and InvalidRequest (not a user name)."""
    owner = owner or principal.user
    if owner != principal.user and not principal.admin:
        raise Forbidden("listing another user's runs needs the admin scope")
    if not re.fullmatch(USER_PATTERN, owner):
        raise InvalidRequest(f"owner {owner[:80]!r} is not a user name")
    return owner


def kill_run(ports: Ports, principal: Principal, run_id: str) -> Run:
    """A queued run is killed at once; an active one is flagged and its worker stops it.

    Raises Conflict if the run has already finished.
    """
    return _kill(ports, get_run(ports, principal, run_id), who=principal.user)


def kill_and_release(ports: Ports, principal: Principal, run_id: str) -> Run:
    """``kill_run``, then free what the run held at once (a sweep member killed while queued
    gives its place to the next)."""
    run = kill_run(ports, principal, run_id)
    lifecycle.ended(ports.queue, run)
    return run


def set_priority(ports: Ports, principal: Principal, run_id: str, priority: int) -> Run:
    """Give a queued run of the caller's (an admin: anyone's) ``priority``: its place in its pool's
    line moves at once (the store ranks queued runs by priority). The run takes a new fair tag at
    its new priority from its owner's lane there, like a run submitted now (a backlog queued at a
    quiet priority and raised goes behind the runs already waiting at the new one). Setting the
    priority it already has writes nothing. Raises NotFound (no such run, or another user's),
    Conflict (the run is no longer queued, whatever the priority asked, or changes too often) and
    Forbidden (a caller who is not an admin asking above the pool's ``max_user_priority``, or an
    owner no longer allowed the run's group or inputs). A run stored charged to no group is charged,
    by its owner's request, as ``authority.charge`` says (InvalidRequest for an owner in several
    groups with no default group)."""
    run = get_run(ports, principal, run_id)
    group = run.group
    if run.owner == principal.user:  # the owner's authority now, not the one recorded at submit
        group = check_caller(principal, run.spec, run.group, ports.inputs)
    pool = ports.pools.get(run.queue)
    tag: float | None = None
    for _ in range(3):
        if run.state != RunState.QUEUED:
            raise Conflict(f"run {run.id} is {run.state}: only a queued run's priority can change")
        _check_priority(principal, pool, priority)
        old = run.spec.priority
        if old == priority:
            return run
        now = ports.clock()
        if tag is None:  # once: a retry keeps the place taken in the lane
            tag = run.fair_tag
            # a run that waits for others takes its place in the lane when it is released
            if pool is not None and not run.waiting_on:
                tag = fair_tag(ports, pool, run.owner, priority, now)
        try:
            return ports.store.update(
                run,
                Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt),
                {"spec": run.spec.model_copy(update={"priority": priority}), "fair_tag": tag, "group": group},
                Event(at=now, message=f"priority {old} -> {priority} by {principal.user}"),
            )
        except ConditionFailed as e:
            run = e.details["run"]
    raise Conflict(f"run {run.id} changed too often; try again")


def _kill(ports: Ports, run: Run, *, who: str | None = None, reason: str | None = None) -> Run:
    """Kill ``run`` (queued: at once; active: flagged, with ``reason``, for its worker) asked by
    user ``who`` or for ``reason``. Raises Conflict if it has already finished or changes state
    too often."""
    why = f" by {who}" if who else ""
    because = f": {reason}" if reason else ""
    for _ in range(3):
        if run.state.terminal:
            raise Conflict(f"run {run.id} has already finished: {run.state}")
        now = ports.clock()
        try:
            if run.state == RunState.QUEUED:
                return ports.store.update(
                    run,
                    Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt),
                    {
                        "state": RunState.KILLED,
                        "finished_at": now,
                        "waiting_reason": None,
                        "failure": Failure(
                            reason=FailureReason.KILLED, message=f"killed{why} before it started{because}"
                        ),
                    },
                    Event(at=now, state=RunState.KILLED, message=f"killed{why} while queued{because}"),
                )
            if run.kill_requested:
                return run
            return ports.store.update(
                run,
                Expect(states=ACTIVE_STATES, attempt=run.attempt),
                {"kill_requested": True, **({"kill_reason": reason} if reason else {})},
                Event(at=now, message=f"kill requested{why}{because}"),
            )
        except ConditionFailed as e:
            run = e.details["run"]
    raise Conflict(f"run {run.id} changed state too often; try again")


def unfinished_runs(ports: Ports) -> Iterator[Run]:
    """Every queued or active run of the pools, pool by pool, as listed (each listing page read
    before its runs are yielded; a run that changes state meanwhile may show up twice or not)."""
    for pool in ports.pools.pools:
        for state in (RunState.QUEUED, *sorted(ACTIVE_STATES)):
            cursor = None
            while True:
                page = ports.store.list(queue=pool.name, state=state, limit=100, cursor=cursor)
                yield from page.runs
                if not page.next_cursor:
                    break
                cursor = page.next_cursor
        cursor = None
        while True:
            page = ports.store.waiting(pool.name, 100, cursor)
            yield from page.runs
            if not page.next_cursor:
                break
            cursor = page.next_cursor


def stop_all(ports: Ports, reason: str, *, workers_gone: bool = False, active_only: bool = False) -> list[Run]:
    """Kill every unfinished run of the pools because of ``reason`` (an operator's act, e.g. "the
    local stack stopped": no owner is checked), recording the reason in each run's end.

    Queued runs are killed at once. Active runs are flagged (``kill_requested``, ``kill_reason``):
    their workers stop them and record ``killed`` -- unless ``workers_gone`` (their workers were
    stopped and can write nothing more): then they are recorded ``killed`` here. Returns the runs
    as written: killed, or flagged and still active (left to their workers). A run that cannot be
    written is logged and left as it is. ``active_only``: runs not yet active (queued, waiting) are
    left as they are, to run later. Raises what the store raises for a listing.
    """
    written: list[Run] = []
    for run in list(unfinished_runs(ports)):
        if active_only and not run.state.active:
            continue
        try:
            if workers_gone and run.state.active:
                written.append(_end_killed(ports, run, reason))
            else:
                written.append(_kill(ports, run, reason=reason))
        except (Conflict, ConditionFailed):
            continue  # it ended meanwhile (or another writer keeps moving it)
        except RunplaneError as e:
            log.warning("could not kill run %s: %s", run.id, e)
    return written


def _end_killed(ports: Ports, run: Run, reason: str) -> Run:
    """Record an active run ``killed`` whose worker can no longer do it. Raises ConditionFailed
    when the run moved on since it was read."""
    now = ports.clock()
    message = f"killed: {reason}"
    return ports.store.update(
        run,
        Expect(states=ACTIVE_STATES, attempt=run.attempt, worker_id=run.worker_id),
        {
            "state": RunState.KILLED,
            "finished_at": now,
            "lease_expires_at": None,
            "kill_requested": True,
            "kill_reason": reason,
            "failure": Failure(reason=FailureReason.KILLED, message=message),
        },
        Event(at=now, state=RunState.KILLED, message=message),
    )
