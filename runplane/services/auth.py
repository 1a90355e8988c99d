"""Bearer-token authentication and the checks every route makes: scopes, and owners.

Tokens are stored as SHA-256 hashes of their secret. What a caller may not see answers exactly as
what does not exist (404), so ids of other users' runs cannot be probed.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable

from runplane.domain.errors import Forbidden, NotFound, Unauthorized
from runplane.domain.runs import Run
from runplane.domain.tenancy import ApiToken, Principal, Scope, UserRecord
from runplane.ports import TokenStore

CACHE_SECONDS = 4.0
"""How long an API instance trusts a token it has read: a revoked token is refused by every
instance within this time."""


class CachedTokens:
    """A TokenStore that remembers tokens it read for ``ttl`` seconds, sparing warm functions a
    read per request. Unknown tokens are not remembered, so a new token works at once; a revoked
    one stops working within ``ttl`` on every instance (at once on the instance that revoked it).
    The stack's secret never changes, so it is read once."""

    def __init__(
        self, inner: TokenStore, ttl: float = CACHE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = inner
        self.ttl = ttl
        self.clock = clock
        self._hits: dict[str, tuple[float, ApiToken]] = {}
        self._users: dict[str, tuple[float, UserRecord | None]] = {}
        self._secret: bytes | None = None
        self._lock = threading.Lock()
        self.changes = 0
        """How many writes went through this instance: what reads tokens in bulk (``authority.Owners``)
        reads them again after one, as this instance's own lookups do at once."""

    def lookup(self, token_hash: str) -> ApiToken | None:
        now = self.clock()
        hit = self._hits.get(token_hash)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        token = self.inner.lookup(token_hash)
        with self._lock:
            if token is None:
                self._hits.pop(token_hash, None)
            else:
                if len(self._hits) > 10000:
                    self._hits.clear()
                self._hits[token_hash] = (now, token)
        return token

    def put(self, token_hash: str, token: ApiToken) -> None:
        self.inner.put(token_hash, token)
        with self._lock:
            self._hits.pop(token_hash, None)
            self.changes += 1

    def list(self) -> list[ApiToken]:
        return self.inner.list()

    def delete(self, token_id: str) -> bool:
        found = self.inner.delete(token_id)
        with self._lock:
            self.changes += 1
            for token_hash in [h for h, (_, t) in self._hits.items() if t.id == token_id]:
                del self._hits[token_hash]
        return found

    def user(self, name: str) -> UserRecord | None:
        now = self.clock()
        hit = self._users.get(name)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        record = self.inner.user(name)
        with self._lock:
            if len(self._users) > 10000:
                self._users.clear()
            self._users[name] = (now, record)
        return record

    def put_user(self, record: UserRecord) -> None:
        self.inner.put_user(record)
        with self._lock:
            self._users.pop(record.user, None)
            self.changes += 1

    def secret(self) -> bytes:
        if self._secret is None:
            self._secret = self.inner.secret()
        return self._secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "rp_" + secrets.token_urlsafe(24)


def new_token_id() -> str:
    return "tok-" + secrets.token_hex(8)


def register_token(
    tokens: TokenStore,
    token: str,
    user: str,
    *,
    groups: list[str] | None = None,
    scopes: list[Scope] | None = None,
    expires_at: float | None = None,
    created_by: str | None = None,
    now: float,
) -> ApiToken:
    """Store ``token`` (its hash) for ``user``, made at ``now`` (read from the caller's clock, as
    ``Ports.clock``); scopes default to reading and writing runs."""
    record = ApiToken(
        id=new_token_id(),
        user=user,
        groups=sorted(set(groups or [])),
        scopes=list(scopes) if scopes is not None else ["runs:read", "runs:write"],
        created_at=now,
        expires_at=expires_at,
        created_by=created_by,
    )
    tokens.put(hash_token(token), record)
    return record


def authenticate(tokens: TokenStore, authorization: str | None, *, now: float) -> Principal:
    """The caller of an ``Authorization: Bearer <token>`` header at ``now`` (the request's time,
    read from ``Ports.clock``). Raises Unauthorized for a missing, unknown, revoked or expired
    token."""
    if not authorization:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization header must be 'Bearer <token>'")
    record = tokens.lookup(hash_token(token.strip()))
    if record is None:
        raise Unauthorized("token is not valid")
    if record.expired(now):
        raise Unauthorized("token has expired; ask an administrator for a new one")
    principal = record.principal()
    if len(set(record.groups)) > 1:  # only then does a default group decide anything
        settings = tokens.user(record.user)
        if settings is not None and settings.default_group in record.groups:
            principal.default_group = settings.default_group
    return principal


def require(principal: Principal, scope: str) -> None:
    """Raise Forbidden unless the caller holds ``scope``: a token with no scopes can do nothing."""
    if not principal.can(scope):
        raise Forbidden(f"token of {principal.user} lacks the {scope!r} permission")


def check_owner(principal: Principal, run: Run) -> None:
    """Users see and act on their own runs only; admins on all. Another user's run answers
    exactly as a run that does not exist."""
    if run.owner != principal.user and not principal.admin:
        raise NotFound(f"run {run.id} not found")
