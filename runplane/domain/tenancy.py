"""Who calls: principals, API tokens, scopes and what an administrator set for a user."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from runplane.domain.common import NAME_PATTERN, SCHEMA_VERSION
from runplane.domain.wire import Record, stored

Scope = Literal["runs:read", "runs:write", "admin"]
SCOPES: tuple[Scope, ...] = ("runs:read", "runs:write", "admin")
DEFAULT_SCOPES: tuple[Scope, ...] = ("runs:read", "runs:write")
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"
TOKEN_ID_PATTERN = r"^tok-[0-9a-f]{16}$"  # noqa: S105 - a pattern, not a secret


class Principal(BaseModel):
    """An authenticated caller."""

    model_config = ConfigDict(extra="forbid")

    user: str
    scopes: list[str] = Field(default_factory=list)
    """None unless given: a caller holds only what its token grants."""
    groups: list[str] = Field(default_factory=list)
    token_id: str | None = None
    default_group: str | None = None
    """The group a run of this caller is charged to when it names none and the caller is in
    several (an administrator's setting, ``UserRecord``); only while it is one of ``groups``."""

    def can(self, scope: str) -> bool:
        """Whether the caller holds ``scope``; ``admin`` holds every scope."""
        return scope in self.scopes or "admin" in self.scopes

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


class ApiToken(Record):
    """An API token as stored, under the SHA-256 of its secret (never the secret itself).

    A record that does not validate is no token: a store reading one answers as if it were absent,
    so a damaged or hand-written record fails closed.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    id: str = Field(pattern=TOKEN_ID_PATTERN)
    user: str = Field(pattern=USER_PATTERN)
    groups: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(default_factory=list, max_length=32)
    scopes: list[Scope]
    created_at: float = Field(ge=0, lt=1e11)
    expires_at: float | None = Field(default=None, ge=0, lt=1e11)
    created_by: str | None = Field(default=None, max_length=200)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def principal(self) -> Principal:
        return Principal(user=self.user, scopes=list(self.scopes), groups=list(self.groups), token_id=self.id)


class UserRecord(Record):
    """What an administrator set for a user (``PUT /v1/users/{user}``), stored beside the tokens.

    A record that does not validate is read as none: the user has no default group."""

    model_config = ConfigDict(allow_inf_nan=False)

    v: int = SCHEMA_VERSION
    user: str = Field(pattern=USER_PATTERN)
    default_group: str | None = Field(default=None, pattern=NAME_PATTERN)
    """The group the user's runs and sweeps are charged to when they name none and their token
    carries several groups (one of them: a default the token does not carry is not used)."""
    updated_at: float = Field(default=0.0, ge=0, lt=1e11)
    updated_by: str | None = Field(default=None, max_length=200)

    @classmethod
    def read(cls, doc: str | None) -> UserRecord | None:
        """The record stored as ``doc`` (JSON); None for none, or for one that does not validate."""
        if doc is None:
            return None
        try:
            return stored(cls, doc)
        except ValueError:
            return None
