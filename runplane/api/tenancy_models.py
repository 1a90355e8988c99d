"""The answers of the HTTP API about who may do what: tokens, the caller, users, quotas and usage.
The OpenAPI document takes their schemas from here, so what is documented is what is checked."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runplane.api.models import Timestamp, WireModel
from runplane.domain.quotas import Period, QuotaKind
from runplane.domain.secrets import SECRET_NAME_PATTERN, SECRET_REF_PATTERN
from runplane.domain.tenancy import TOKEN_ID_PATTERN, Scope


class Token(BaseModel):
    """A token as listed: never its secret."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(pattern=TOKEN_ID_PATTERN)
    user: str
    groups: list[str]
    scopes: list[Scope]
    created_at: str = Field(description="ISO 8601, UTC", json_schema_extra={"format": "date-time"})
    expires_at: str | None = Field(description="ISO 8601, UTC; null: never", json_schema_extra={"format": "date-time"})
    created_by: str | None


class TokenCreated(Token):
    """The answer to ``POST /v1/tokens``: the only place the secret ever appears."""

    token: str = Field(description="the secret: send it as 'Authorization: Bearer <token>'; shown only once")


class TokenList(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[Token]


class Me(BaseModel):
    """``GET /v1/me``: who the caller's token acts for."""

    model_config = ConfigDict(extra="ignore")

    user: str
    groups: list[str]
    scopes: list[str]
    token_id: str | None
    default_group: str | None = Field(
        default=None, description="the group a run naming none is charged to, for a token of several groups"
    )


class UserView(BaseModel):
    """``GET``/``PUT /v1/users/{user}``: a user's groups now and what an administrator set."""

    model_config = ConfigDict(extra="ignore")

    user: str
    groups: list[str] = Field(description="the groups of the user's tokens that have not expired")
    default_group: str | None
    updated_at: str | None = Field(
        default=None, description="ISO 8601, UTC; null: never set", json_schema_extra={"format": "date-time"}
    )
    updated_by: str | None = None


# ---------------------------------------------------------------------------------------------
# Responses. The handlers build these and the OpenAPI document takes their schemas, so what the
# API sends is what it documents (tests/integration/contracts/test_wire.py holds the two together).
# Parsing ignores fields it does not know, so that a client keeps working with a newer server; the
# document says exactly which fields the server sends.


class QuotaUsage(WireModel):
    """What a user or group holds now and has used this period."""

    running: int = Field(description="runs started and not yet ended")
    gpus: int = Field(description="GPUs those runs hold")
    cpus: float = Field(description="cpus those runs hold")
    gpu_hours: float = Field(description="GPU-hours used this period: runs that ended, and those going so far")
    cpu_hours: float = Field(description="cpu-hours used this period")
    period: str = Field(description="the period counted: day:2026-11-23, week:2026-W48 or month:2026-11 (UTC)")


class QuotaView(WireModel):
    """A user's or a group's quota with its use. A limit that is null does not apply."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "kind": "group",
                    "name": "vision",
                    "max_running": 4,
                    "max_gpus": 2,
                    "max_cpus": None,
                    "gpu_hours": 200.0,
                    "cpu_hours": None,
                    "period": "month",
                    "updated_at": "2026-11-23T09:30:00.125Z",
                    "usage": {
                        "running": 1,
                        "gpus": 1,
                        "cpus": 4.0,
                        "gpu_hours": 12.5,
                        "cpu_hours": 50.0,
                        "period": "month:2026-11",
                    },
                }
            ]
        },
    )

    kind: QuotaKind
    name: str = Field(description="the user, or the group")
    max_running: int | None = Field(description="runs started and not yet ended, at once")
    max_gpus: int | None = Field(description="GPUs held at once")
    max_cpus: float | None = Field(description="cpus held at once")
    gpu_hours: float | None = Field(description="GPU-hours per period")
    cpu_hours: float | None = Field(description="cpu-hours per period")
    period: Period = Field(description="the calendar period (UTC) budgets are counted in")
    updated_at: Timestamp
    usage: QuotaUsage


class QuotaList(WireModel):
    """``GET /v1/quotas``: every quota (an admin), or those that apply to the caller: their own and
    their groups'. Users first, each kind by name."""

    quotas: list[QuotaView]


UsageBy = Literal["user", "group", "pool"]
"""What a usage report's rows are per."""


class UsageRow(WireModel):
    """What the runs of one user, group or pool used."""

    key: str | None = Field(description="the user, the group (null: runs charged to no group) or the pool")
    runs: int = Field(description="runs submitted in the window")
    cpu_seconds: float = Field(description="CPU time their processes used")
    gpu_seconds: float = Field(description="their GPUs times the seconds their containers ran")
    cost: float | None = Field(description="what they cost (null: none ran on a pool with a price)")


class UsageReport(WireModel):
    """``GET /v1/usage``: what the runs submitted in ``[since, until)`` used, per ``by``, with the
    totals. A user sees only their own runs; an admin anyone's. Runs under way count with what
    they used so far."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "by": "pool",
                    "since": "2026-11-01T00:00:00.000Z",
                    "until": "2026-11-23T09:30:00.125Z",
                    "user": "ada",
                    "group": None,
                    "pool": None,
                    "rows": [
                        {"key": "cpu", "runs": 12, "cpu_seconds": 4210.5, "gpu_seconds": 0.0, "cost": 1.84},
                        {"key": "gpu", "runs": 3, "cpu_seconds": 900.0, "gpu_seconds": 7200.0, "cost": 24.0},
                    ],
                    "total": {"key": None, "runs": 15, "cpu_seconds": 5110.5, "gpu_seconds": 7200.0, "cost": 25.84},
                }
            ]
        },
    )

    by: UsageBy = Field(description="what the rows are per")
    since: Timestamp = Field(description="the window's start: runs submitted at or after it count")
    until: Timestamp = Field(description="the window's end: runs submitted before it count")
    user: str | None = Field(description="only this user's runs (a user's own report: always themselves)")
    group: str | None = Field(description="only runs charged to this group")
    pool: str | None = Field(description="only runs of this pool")
    rows: list[UsageRow] = Field(description="one per user, group or pool, by key")
    total: UsageRow = Field(description="all rows together (key null)")


class SecretView(WireModel):
    """A secret as every answer shows it: its name, who it belongs to and how a run names it, never
    its value (no answer of any route holds one)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "name": "hf-token",
                    "ref": "vision/hf-token",
                    "scope": "group",
                    "owner": "vision",
                    "size": 37,
                    "updated_at": 1795426200.125,
                    "updated_by": "admin",
                }
            ]
        },
    )

    name: str = Field(pattern=SECRET_NAME_PATTERN)
    ref: str = Field(
        pattern=SECRET_REF_PATTERN,
        description="what a run writes to use it (in secrets or image_pull_secret): 'name' for the caller's own, "
        "'group/name' for a group's",
    )
    scope: Literal["user", "group"] = Field(description="whose it is: a user's own, or a group's")
    owner: str = Field(description="the user, or the group")
    size: int = Field(ge=0, description="the value's length in bytes of UTF-8")
    updated_at: float = Field(description="when its value was last set (Unix seconds)")
    updated_by: str = Field(description="who set it")


class SecretList(WireModel):
    """``GET /v1/secrets``: the secrets the caller may use, their own then each of their groups' (by
    group), each by name; ``GET /v1/groups/{group}/secrets``: that group's. Never a value."""

    secrets: list[SecretView]
