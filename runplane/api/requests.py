"""The bodies users send to the HTTP API: strict (an unknown field is a 422 that names it), and the
OpenAPI document takes their schemas from here (``RunSpec`` and ``SweepSpec`` are the domain's)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema, field_validator, model_validator

from runplane.domain.common import NAME_PATTERN, WHOLE
from runplane.domain.quotas import Period
from runplane.domain.secrets import MAX_SECRET_BYTES
from runplane.domain.sessions import MAX_COMMAND_ARGS, MAX_COMMAND_BYTES, TERM_PATTERN, SessionKind
from runplane.domain.sweeps import MAX_SWEEP
from runplane.domain.tenancy import USER_PATTERN, Scope
from runplane.domain.units import MAX_DURATION
from runplane.domain.uploads import SHA256_PATTERN

LIFETIME_PATTERN = (
    r"^(?:[1-9][0-9]{0,6}s?|[1-9][0-9]{0,4}m|[1-9][0-9]{0,2}h|(?:[1-9][0-9]?|[12][0-9]{2}|3[0-5][0-9]|36[0-6])d)$"
)
"""A token's lifetime as text, as the document gives it: one whole number of one unit, more than 0 and
at most 366 days (the server also reads "1h30m" or "2.5d", as it does a run's time, within those bounds)."""


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
    expires_in: Annotated[
        str | Annotated[float, Field(gt=0)] | None,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DURATION},
                    {"type": "string", "pattern": LIFETIME_PATTERN, "description": "units s, m, h, d"},
                    {"type": "null"},
                ],
                "examples": ["30d", "12h", 86400],
            },
            mode="validation",
        ),
    ] = Field(default=None, description='lifetime, e.g. "30d", "12h" or seconds, up to a year; none: never expires')


class QuotaLimits(BaseModel):
    """``PUT /v1/quotas/users/{user}`` and ``.../groups/{group}``: the quota's limits (admins only).

    The body replaces the quota whole: a limit left out (or null) does not apply, and ``{}``
    makes a quota that limits nothing and only counts use. Numbers must be JSON numbers (no text,
    no booleans), finite and not negative; a count is a whole number (4 or 4.0). Budgets are hours
    of the resource held (a run's gpus or cpus times its wall-clock time) per calendar ``period`` in
    UTC; 0 refuses every run that asks for any of it.
    """

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={"examples": [{"max_running": 4, "max_gpus": 2, "gpu_hours": 200, "period": "month"}]},
    )

    max_running: Annotated[int | None, WHOLE] = Field(
        default=None, ge=0, le=1_000_000, strict=True, description="runs started and not yet ended, at once"
    )
    max_gpus: Annotated[int | None, WHOLE] = Field(
        default=None, ge=0, le=1_000_000, strict=True, description="GPUs held by running runs, at once"
    )
    max_cpus: float | None = Field(
        default=None, ge=0, le=1_000_000, strict=True, description="cpus held by running runs, at once"
    )
    gpu_hours: float | None = Field(
        default=None, ge=0, le=1e9, strict=True, description="GPU-hours per period (gpus x hours run)"
    )
    cpu_hours: float | None = Field(
        default=None, ge=0, le=1e9, strict=True, description="cpu-hours per period (cpus x hours run)"
    )
    period: Period = Field(default="month", description="the calendar period (UTC) budgets are counted in")


class SetPriority(BaseModel):
    """``POST /v1/runs/{run_id}/priority``: the priority a queued run takes from now on.

    A user may give a priority up to the run's pool's ``max_user_priority``; an admin, any. The
    number must be a JSON integer (80 or 80.0; no text, no fraction, no boolean)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"priority": 80}]})

    priority: Annotated[int, WHOLE] = Field(
        ge=0, le=100, strict=True, description="0..100: the run starts before every waiting run of lower priority"
    )


class KeepRequest(BaseModel):
    """``POST /v1/runs/{run_id}/keep``: pin the run (``keep``: true), so that its pool's retention deletes
    none of its outputs, logs or record, or let it go (false), so that it does again."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"keep": True}, {"keep": False}]})

    keep: bool = Field(default=True, strict=True, description="true: keep it; false: let it go")


class UserSettings(BaseModel):
    """``PUT /v1/users/{user}``: what an administrator sets for a user (admins only)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    default_group: str | None = Field(
        pattern=NAME_PATTERN,
        description="the group the user's runs and sweeps are charged to when they name none and their token "
        "carries several groups; one of the user's groups; null: none (a run must then name its group)",
    )


class SecretPut(BaseModel):
    """``PUT /v1/secrets/{name}`` and ``PUT /v1/groups/{group}/secrets/{name}``: a secret's value,
    which replaces any it had. It is sealed before it is stored and no answer ever holds it."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"value": "hf_0123456789abcdefghijklmnopqrstuvwxyz"}]}
    )

    value: str = Field(
        min_length=1,
        max_length=MAX_SECRET_BYTES,
        strict=True,
        json_schema_extra={"pattern": "^[^\\u0000]*$"},
        description=f"the value: text of 1 to {MAX_SECRET_BYTES} bytes as UTF-8, without NUL (registry "
        'credentials: {"username": ..., "password": ...} as JSON text, or a Docker config auths entry)',
    )

    @field_validator("value")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\0" in value:  # the message never holds the value
            raise ValueError("a secret's value cannot hold the NUL character")
        return value


class SweepPatch(BaseModel):
    """``PATCH /v1/sweeps/{id}``: how many members may be out at once, while it goes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"max_parallel": 4}]})

    max_parallel: Annotated[int | None, WHOLE] = Field(
        ge=1,
        le=MAX_SWEEP,
        strict=True,
        description="null: as many as the pool can run; members out beyond a lowered cap go on",
    )


MD5_BASE64_PATTERN = r"^[A-Za-z0-9+/]{22}==$"
"""The base64 of an MD5 digest (16 bytes), as ``Content-MD5`` carries it."""


class UploadCreate(BaseModel):
    """``POST /v1/uploads``: an archive (a gzip'd tar of a directory) the caller means to name as a
    run's input; the answer says it is there already, or where to PUT it."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                    "size": 48213,
                    "md5": "1B2M2Y8AsgTpgAmY7PhCfg==",
                }
            ]
        },
    )

    sha256: str = Field(pattern=SHA256_PATTERN, description="the SHA-256 of the archive's bytes, in lower-case hex")
    size: Annotated[int, WHOLE] = Field(gt=0, strict=True, description="the archive's length in bytes")
    md5: str = Field(
        pattern=MD5_BASE64_PATTERN,
        description="the base64 of the archive's MD5: the store refuses a PUT of other bytes",
    )


NO_NUL = "^[^\\u0000]*$"
"""Text without the NUL character, as a JSON Schema pattern."""
_KIND_RULES: list[JsonValue] = [
    {
        "properties": {"kind": {"const": "exec"}, "command": {"type": "array"}, "port": {"type": "null"}},
        "required": ["command"],
    },
    {"properties": {"kind": {"const": "shell"}, "command": {"type": "null"}, "port": {"type": "null"}}},
    {
        "properties": {
            "kind": {"const": "port_forward"},
            "command": {"type": "null"},
            "port": {"type": "integer"},
            "tty": {"enum": [False, None]},
            "stdin": {"enum": [False, None]},
        },
        "required": ["port"],
    },
    {
        "properties": {
            "kind": {"const": "attach"},
            "command": {"type": "null"},
            "port": {"type": "null"},
            "tty": {"type": "null"},
            "stdin": {"type": "null"},
        }
    },
]
"""What each kind of session takes, as the document says it (``SessionRequest._fits_kind`` checks it)."""


class SessionRequest(BaseModel):
    """``POST /v1/runs/{run_id}/sessions``: a session into a running run of the caller's: a command
    (``exec``), the image's shell (``shell``), or connections to a port inside the run
    (``port_forward``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": _KIND_RULES,
            "examples": [
                {"kind": "exec", "command": ["sh", "-c", "echo hi; exit 3"], "stdin": True},
                {"kind": "shell", "term": "xterm-256color", "rows": 40, "cols": 120},
                {"kind": "port_forward", "port": 8000},
                {"kind": "attach", "term": "xterm-256color", "rows": 40, "cols": 120},
            ],
        },
    )

    kind: SessionKind = Field(
        description="exec: a command; shell: the image's shell; port_forward: a port's; attach: an interactive "
        "run's own command (its input, its output, its terminal if it has one)"
    )
    command: list[Annotated[str, Field(max_length=MAX_COMMAND_BYTES, json_schema_extra={"pattern": NO_NUL})]] | None = (
        Field(
            default=None,
            min_length=1,
            max_length=MAX_COMMAND_ARGS,
            description=f"exec (required there only): the command and its arguments, 1 to {MAX_COMMAND_ARGS}, "
            f"at most {MAX_COMMAND_BYTES} bytes of UTF-8 in all (more: 413), no NUL; run as the run's user with "
            "its environment",
        )
    )
    tty: bool | None = Field(
        default=None, strict=True, description="a terminal (stdout and stderr as one); default: a shell's only"
    )
    stdin: bool | None = Field(
        default=None, strict=True, description="the client's input goes to the command; default: a shell's only"
    )
    term: str | None = Field(default=None, pattern=TERM_PATTERN, description="TERM, with a terminal")
    rows: Annotated[int | None, WHOLE] = Field(default=None, ge=1, le=1000, strict=True, description="terminal rows")
    cols: Annotated[int | None, WHOLE] = Field(default=None, ge=1, le=1000, strict=True, description="terminal columns")
    port: Annotated[int | None, WHOLE] = Field(
        default=None, ge=1, le=65535, strict=True, description="port_forward (required there only): the run's port"
    )

    @field_validator("command")
    @classmethod
    def _no_nul(cls, command: list[str] | None) -> list[str] | None:
        if command is not None and any("\0" in arg for arg in command):
            raise ValueError("a command's arguments cannot hold the NUL character")
        return command

    @model_validator(mode="after")
    def _fits_kind(self) -> SessionRequest:
        if self.kind == SessionKind.EXEC and self.command is None:
            raise ValueError("exec needs a command")
        if self.kind != SessionKind.EXEC and self.command is not None:
            raise ValueError(f"{self.kind} takes no command")
        if self.kind == SessionKind.PORT_FORWARD:
            if self.port is None:
                raise ValueError("port_forward needs a port")
            if self.tty or self.stdin:
                raise ValueError("port_forward takes no tty or stdin")
        elif self.port is not None:
            raise ValueError(f"{self.kind} takes no port (port_forward does)")
        if self.kind == SessionKind.ATTACH and (self.tty is not None or self.stdin is not None):
            raise ValueError("attach takes no tty or stdin: it has the run's (its tty, and its input)")
        return self
