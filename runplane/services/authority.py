"""Authority checked when it is used: the group a run is charged to, and what a user may do now.

A run or a sweep records its owner's groups when it is made, but a group can be taken away while
it waits. So every later release (a retry, a change of a sweep's ``max_parallel``, a waiting run
released by the dispatcher, a sweep member released as room frees) asks again, with the caller's
token or, where no caller is in the request, with the owner's tokens as the token store holds
them now: the group charged must still be the owner's, and each input must still be one the
owner's groups may read. What fails ends ``not_permitted`` (or is refused, to a caller, with 403).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from runplane.domain.errors import Forbidden, InvalidRequest, NotAllowed
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.ports import Clock, InputRules, TokenStore
from runplane.services.auth import CACHE_SECONDS, CachedTokens
from runplane.services.inputs import InputPolicy


def charged_group(principal: Principal, asked: str | None) -> str | None:
    """The group a run of ``principal`` is charged to: ``asked``, which must be one of the caller's
    groups; else the caller's only group; else, for a caller in several, the default group an
    administrator set for them; else none (a caller in no group). Raises InvalidRequest for a group
    the caller is not in, and for a caller in several groups who names none and has no default."""
    groups = sorted(set(principal.groups))
    if asked is not None:
        if asked not in groups:
            raise NotAllowed(f"you are not in group {asked}")
        return asked
    if len(groups) <= 1:
        return groups[0] if groups else None
    if principal.default_group in groups:
        return principal.default_group
    raise NotAllowed(
        f"you are in several groups ({', '.join(groups)}): name the one to charge with group "
        "(or ask an administrator to set your default group)"
    )


def charge(principal: Principal, group: str | None) -> str | None:
    """The group a run recorded as charged to ``group`` is charged to when ``principal`` releases it
    now: ``group``; for one stored charged to none (by a release that charged a user in several
    groups to none), what a submit of theirs naming none is charged (``charged_group``: their only
    group, or their default group). Raises InvalidRequest, naming their groups, when that is none
    of them: they are in several and have no default group."""
    if group is not None:
        return group
    try:
        return charged_group(principal, None)
    except InvalidRequest:
        raise NotAllowed(_unnamed(principal)) from None


def _unnamed(principal: Principal) -> str:
    groups = ", ".join(sorted(set(principal.groups)))
    return (
        f"{principal.user} is in several groups ({groups}) and this is charged to none of them: "
        "submit it again naming the group to charge (or ask an administrator to set a default group)"
    )


def still_allowed(principal: Principal, spec: RunSpec, group: str | None, inputs: InputRules | None) -> str | None:
    """Why ``principal`` may no longer release a run of ``spec`` charged to ``group`` (no longer in
    that group; charged to none while in several groups with no default group, ``charge``; or an
    input their groups may no longer read), or None when they may."""
    if group is not None and group not in principal.groups:
        return f"{principal.user} is no longer in group {group}, which it is charged to"
    if group is None and len(set(principal.groups)) > 1 and principal.default_group not in principal.groups:
        return _unnamed(principal)
    policy = inputs or InputPolicy()
    for name, source in spec.inputs.items():
        if source.startswith("run:"):
            continue  # another run's outputs: the owner's own, checked again by the worker
        try:
            policy.check(name, source, principal.groups)
        except InvalidRequest as e:
            return e.message
    return None


def check_caller(principal: Principal, spec: RunSpec, group: str | None, inputs: InputRules | None) -> str | None:
    """The group a run of ``spec`` recorded as charged to ``group`` is charged to when ``principal``
    releases it now (``charge``). Raises InvalidRequest (charged to none, and the caller is in
    several groups with no default group) and Forbidden, saying why, unless ``principal`` may
    release it now."""
    charged = charge(principal, group)
    why = still_allowed(principal, spec, charged, inputs)
    if why is not None:
        raise Forbidden(f"not allowed any more: {why}")
    return charged


class Owners:
    """The owners of runs as the token store says now, for releases with no caller in the request.

    A user's groups are those of their tokens that have not expired (none left: no group). What the
    tokens say is kept ``ttl`` seconds (what an API instance trusts a token for anyway), so a pass
    that releases many runs reads them once; a token written or revoked through this process's
    ``CachedTokens`` is seen at once. A refusal is made only on what was read less than
    ``fresh_for`` seconds ago (``allows``), by a strongly consistent read of every token (the token
    store's ``list``: a consistent scan on DynamoDB; Table storage reads are always consistent), so a
    token made on another instance before that read is not missed. The cost: each read is the whole
    tokens table (expired tokens stay in it until an administrator deletes them), made at most once per ``ttl``
    for releases and once more per ``fresh_for`` while some release is refused."""

    def __init__(self, tokens: TokenStore, clock: Clock, ttl: float = CACHE_SECONDS, fresh_for: float = 1.0) -> None:
        self.tokens = tokens
        self.clock = clock
        self.ttl = ttl
        self.fresh_for = fresh_for
        self._seen: tuple[float, int, Mapping[str, list[str]]] | None = None
        self._lock = threading.Lock()

    def _changes(self) -> int:
        return self.tokens.changes if isinstance(self.tokens, CachedTokens) else 0

    def principal(self, user: str, *, within: float | None = None) -> Principal:
        """``user`` with the groups their tokens carry (no scopes: it acts for no request), as read
        at most ``within`` seconds ago (default ``ttl``). Raises what the token store raises."""
        now = self.clock()
        with self._lock:
            seen = self._seen
        changes = self._changes()
        if seen is None or now - seen[0] >= (self.ttl if within is None else within) or changes != seen[1]:
            groups: dict[str, set[str]] = {}
            for token in self.tokens.list():
                if not token.expired(now):
                    groups.setdefault(token.user, set()).update(token.groups)
            seen = (now, changes, {name: sorted(found) for name, found in groups.items()})
            with self._lock:
                self._seen = seen
        return Principal(user=user, groups=list(seen[2].get(user, [])))

    def allows(
        self, user: str, spec: RunSpec, group: str | None, inputs: InputRules | None
    ) -> tuple[Principal, str | None]:
        """``user`` as their tokens say now, and why they may no longer release a run of ``spec``
        charged to ``group`` (None: they may; ``still_allowed``). Raises what the token store
        raises."""
        owner = self.principal(user)
        why = still_allowed(owner, spec, group, inputs)
        if why is not None:  # refused on a view up to ttl old: look again before it counts
            owner = self.principal(user, within=self.fresh_for)
            why = still_allowed(owner, spec, group, inputs)
        return owner, why
