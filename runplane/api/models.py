"""Request and response bodies of the HTTP API that are pydantic models: the OpenAPI document
takes their schemas from here, so what is documented is what is checked."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from runplane.domain.models import NAME_PATTERN, TOKEN_ID_PATTERN, USER_PATTERN, Scope


class TokenCreate(BaseModel):
    """``POST /v1/tokens``: a token for ``user`` (admins only)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    user: str = Field(pattern=USER_PATTERN, description="who the token acts for")
    groups: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list, max_length=32, description="groups of that user (workers with --group, input buckets)"
    )
    scopes: list[Scope] | None = Field(
        default=None,
        min_length=1,
        max_length=3,
        description='what it may do; default ["runs:read", "runs:write"]',
    )
    expires_in: str | Annotated[float, Field(gt=0)] | None = Field(
        default=None, description='lifetime, e.g. "30d", "12h" or seconds; none: it does not expire'
    )


class Token(BaseModel):
    """A token as listed: never its secret."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=TOKEN_ID_PATTERN)
    user: str
    groups: list[str]
    scopes: list[Scope]
    created_at: str = Field(description="ISO 8601, UTC")
    expires_at: str | None = Field(description="ISO 8601, UTC; null: never")
    created_by: str | None


class TokenCreated(Token):
    """The answer to ``POST /v1/tokens``: the only place the secret ever appears."""

    token: str = Field(description="the secret: send it as 'Authorization: Bearer <token>'; shown only once")


class TokenList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[Token]


class Me(BaseModel):
    """``GET /v1/me``: who the caller's token acts for."""

    model_config = ConfigDict(extra="forbid")

    user: str
    groups: list[str]
    scopes: list[str]
    token_id: str | None
