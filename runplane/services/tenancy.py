"""Users, groups and API tokens: the administrator's use cases.

A user is a name on tokens; a group is a name a token carries (a worker started with ``--group``
serves only its members, and operators allow input buckets per group). A token's secret is shown
once, when it is made, and stored only as its SHA-256.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from runplane.domain.common import NAME_PATTERN
from runplane.domain.errors import InvalidRequest, LastAdmin, NotAllowed, NotFound
from runplane.domain.tenancy import DEFAULT_SCOPES, SCOPES, USER_PATTERN, ApiToken, Scope, UserRecord
from runplane.domain.units import parse_duration
from runplane.ports import Ports
from runplane.services.auth import new_token, register_token


@dataclass(frozen=True)
class NewToken:
    secret: str
    token: ApiToken


def check_token_request(user: str, groups: Sequence[str], scopes: Sequence[str] | None) -> list[Scope]:
    """Raise InvalidRequest naming what is wrong; return the scopes to give (default: read and
    write runs)."""
    if not re.fullmatch(USER_PATTERN, user):
        raise InvalidRequest(f"user {user!r} is not valid: 1-64 letters, digits and . _ @ -, starting with one")
    for group in groups:
        if not re.fullmatch(NAME_PATTERN, group):
            raise InvalidRequest(f"group {group!r} is not valid: lower-case letters, digits and -, at most 48")
    if len(set(groups)) > 32:
        raise InvalidRequest("a token may carry at most 32 groups")
    if scopes is None:
        return list(DEFAULT_SCOPES)
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise InvalidRequest(f"unknown scope {unknown[0]!r}; scopes are {', '.join(SCOPES)}")
    if not scopes:
        raise InvalidRequest("a token needs at least one scope")
    return [s for s in SCOPES if s in scopes]


def lifetime(expires_in: str | float | None) -> float | None:
    """Seconds from ``"30d"``, ``"12h"`` or a number, more than 0 and at most a year (what any
    duration may be); None for a token that does not expire."""
    if expires_in is None:
        return None
    try:
        seconds = parse_duration(expires_in)
    except ValueError as e:
        raise InvalidRequest(f"expires_in: {e}") from e
    if seconds <= 0:
        raise InvalidRequest("expires_in must be more than 0")
    return seconds


def create_token(
    ports: Ports,
    *,
    user: str,
    groups: Sequence[str] = (),
    scopes: Sequence[str] | None = None,
    expires_in: str | float | None = None,
    created_by: str | None,
) -> NewToken:
    """A new token for ``user``; the secret is in the answer and nowhere else. Raises
    InvalidRequest."""
    granted = check_token_request(user, groups, scopes)
    seconds = lifetime(expires_in)
    secret = new_token()
    now = ports.clock()
    record = register_token(
        ports.tokens,
        secret,
        user,
        groups=list(groups),
        scopes=granted,
        expires_at=None if seconds is None else now + seconds,
        created_by=created_by,
        now=now,
    )
    return NewToken(secret, record)


def list_tokens(ports: Ports, user: str | None = None) -> list[ApiToken]:
    """Every token (no secrets), or those of ``user``, oldest first."""
    return [t for t in ports.tokens.list() if user is None or t.user == user]


ADMIN_MARGIN_SECONDS = 86_400.0
"""An admin token that expires sooner than this is no administrator that remains (see revoke_token)."""


def revoke_token(ports: Ports, token_id: str) -> None:
    """Remove a token; every API instance refuses it within seconds. Raises NotFound, and
    LastAdmin for an admin token that has not expired when no other admin token lasts: one that
    does not expire, or expires more than ADMIN_MARGIN_SECONDS from now (revoking it would lock
    every administrator out of the stack, at once or when the short-lived one expires; an expired
    admin token may always go).

    Two administrators revoking each other's tokens at the same moment may both succeed: the
    check and the delete are two calls to the store. The way back in is then
    ``runplane token create --direct``, which needs the stack's credentials, not a token."""
    now = ports.clock()
    tokens = ports.tokens.list()
    admins = {t.id: t for t in tokens if "admin" in t.scopes and not t.expired(now)}
    lasting = [
        i
        for i, t in admins.items()
        if i != token_id and (t.expires_at is None or t.expires_at > now + ADMIN_MARGIN_SECONDS)
    ]
    if token_id in admins and not lasting:
        raise LastAdmin(
            f"{token_id} is the last admin token that lasts (no other admin token is valid for more than a day): "
            "revoking it would leave no one able to administer this stack; make another admin token first "
            "(runplane token create USER --scope admin)"
        )
    if not ports.tokens.delete(token_id):
        raise NotFound(f"token {token_id} not found")


@dataclass(frozen=True)
class UserFacts:
    user: str
    groups: list[str]
    """The groups of the user's tokens that have not expired."""
    record: UserRecord | None
    """What an administrator set for them (None: nothing)."""


def _check_user(user: str) -> None:
    if not re.fullmatch(USER_PATTERN, user):
        raise InvalidRequest(f"user {user[:80]!r} is not valid: 1-64 letters, digits and . _ @ -, starting with one")


def get_user(ports: Ports, user: str) -> UserFacts:
    """A user's groups now and their settings. Raises InvalidRequest (not a user name) and NotFound
    (no token of theirs and nothing set)."""
    _check_user(user)
    now = ports.clock()
    theirs = [t for t in ports.tokens.list() if t.user == user]
    groups = sorted({g for t in theirs if not t.expired(now) for g in t.groups})
    record = ports.tokens.user(user)
    if not theirs and record is None:
        raise NotFound(f"user {user} not found")
    return UserFacts(user, groups, record)


def set_default_group(ports: Ports, user: str, group: str | None, *, by: str) -> UserFacts:
    """Charge ``user``'s runs and sweeps that name no group to ``group`` when their token carries
    several (None: no default; they must name one). The group must be one of the user's groups
    now. Raises InvalidRequest (not a user name, or a group that is not theirs) and NotFound."""
    facts = get_user(ports, user)
    if group is not None and group not in facts.groups:
        theirs = ", ".join(facts.groups) or "none"
        raise NotAllowed(f"{user} is not in group {group} (their groups: {theirs})")
    record = UserRecord(user=user, default_group=group, updated_at=ports.clock(), updated_by=by)
    ports.tokens.put_user(record)
    return UserFacts(user, facts.groups, record)
