"""Bearer-token authentication. Tokens are stored as SHA-256 hashes, mapped to a user."""

from __future__ import annotations

import hashlib
import secrets

from runplane.domain.errors import Forbidden, Unauthorized
from runplane.domain.models import Principal, Run
from runplane.ports import TokenStore


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
