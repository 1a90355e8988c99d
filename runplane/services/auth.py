"""Bearer-token authentication. Tokens are stored as SHA-256 hashes, mapped to a user."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

from runplane.domain.errors import Forbidden, Unauthorized
from runplane.domain.models import Principal, Run
from runplane.ports import TokenStore


class CachedTokens:
    """A TokenStore that remembers valid tokens for ``ttl`` seconds, sparing warm functions a
    read per request. Unknown tokens are not remembered, so a new token works at once; a
    revoked one stops working within ``ttl``."""

    def __init__(self, inner: TokenStore, ttl: float = 60, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.ttl = ttl
        self.clock = clock
        self._hits: dict[str, tuple[float, Principal]] = {}

    def lookup(self, token_hash: str) -> Principal | None:
        now = self.clock()
        hit = self._hits.get(token_hash)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        principal = self.inner.lookup(token_hash)
        if principal is None:
            self._hits.pop(token_hash, None)
        else:
            if len(self._hits) > 10000:
                self._hits.clear()
            self._hits[token_hash] = (now, principal)
        return principal

    def put(self, token_hash: str, principal: Principal) -> None:
        self.inner.put(token_hash, principal)
        self._hits.pop(token_hash, None)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "rp_" + secrets.token_urlsafe(24)


def register_token(tokens: TokenStore, token: str, principal: Principal) -> None:
    tokens.put(hash_token(token), principal)


def authenticate(tokens: TokenStore, authorization: str | None) -> Principal:
    """The caller of an ``Authorization: Bearer <token>`` header. Raises Unauthorized."""
    if not authorization:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization header must be 'Bearer <token>'")
    principal = tokens.lookup(hash_token(token.strip()))
    if principal is None:
        raise Unauthorized("token is not valid")
    return principal


def require(principal: Principal, scope: str) -> None:
    if not principal.can(scope):
        raise Forbidden(f"token of {principal.user} lacks the {scope!r} permission")


def check_owner(principal: Principal, run: Run) -> None:
    """Users see and act on their own runs only; admins on all."""
    if run.owner != principal.user and not principal.can("admin"):
        raise Forbidden(f"run {run.id} belongs to another user")
