"""Settings, read once per process from RUNPLANE_* environment variables."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from runplane.domain.retention import Retention, read_retention
from runplane.domain.uploads import DEFAULT_MAX_UPLOAD_BYTES

PREFIX = "RUNPLANE_"


def parse_connection_string(connection_string: str) -> dict[str, str]:
    """An Azure storage connection string's ``Key=Value;...`` pairs; values may contain '='
    (account keys end in it)."""
    parts = {}
    for part in connection_string.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name:
            parts[name] = value
    return parts


def parse_bucket_allowlist(text: str) -> dict[str, frozenset[str]]:
    """``RUNPLANE_INPUT_BUCKETS`` read (see ``StackSettings.input_buckets``). Raises ValueError."""
    text = text.strip()
    if not text:
        return {}
    if not text.startswith("{"):
        return {"*": frozenset(b.strip() for b in text.split(",") if b.strip())}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"RUNPLANE_INPUT_BUCKETS is not valid JSON: {e}") from e
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(b, str) for b in v) for k, v in data.items()
    ):
        raise ValueError('RUNPLANE_INPUT_BUCKETS must map groups to lists of buckets: {"*": ["bucket"], ...}')
    return {group: frozenset(buckets) for group, buckets in data.items()}


class EnvironSource(PydanticBaseSettingsSource):
    """The fields of ``settings_cls`` from ``environ`` (a mapping of environment variables), as
    text for the model to parse: field ``name`` from ``<env_prefix><NAME>``, else from the first
    variable of the model's ``env_fallbacks[name]`` that is not empty (with fallbacks, and with
    the model's ``env_ignore_empty``, an empty variable counts as unset). Variables no field reads
    are left alone, so a setting a newer release reads never stops an older one."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def env_names(self, field_name: str) -> tuple[str, ...]:
        """The variables field ``field_name`` is read from, in order."""
        fallbacks: Mapping[str, tuple[str, ...]] = getattr(self.settings_cls, "env_fallbacks", {})
        return (self.config.get("env_prefix", "") + field_name.upper(), *fallbacks.get(field_name, ()))

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """(value or None, the variable it came from (the first one when none is set), False)."""
        names = self.env_names(field_name)
        # a field with fallbacks takes the first variable with a value
        skip_empty = self.config.get("env_ignore_empty", False) or len(names) > 1
        for name in names:
            value = self.environ.get(name)
            if value is not None and (value or not skip_empty):
                return value, name, False
        return None, names[0], False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                values[name] = value
        return values


def problems(e: ValidationError) -> str:
    """``e``'s errors in one line, ``place: what`` each (the place left out for a rule of the whole),
    without pydantic's "Value error, " prefixes."""
    return "; ".join(
        f"{'.'.join(map(str, err['loc'])) + ': ' if err['loc'] else ''}{err['msg'].removeprefix('Value error, ')}"
        for err in e.errors()
    )


class Settings(BaseSettings):
    """One deployable's settings. ``from_env`` reads them from the environment; constructed
    directly, only the values given count, never the environment (tests build them so)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Settings from the environment (``os.environ`` when None), through ``EnvironSource``.
        Raises pydantic.ValidationError; an error's ``loc`` is ``(field_name,)``, the field read from
        ``<env_prefix><FIELD_NAME>``, or ``()`` for a rule between fields."""
        return cls(**EnvironSource(cls, os.environ if environ is None else environ)())

    @classmethod
    def problem(cls, e: ValidationError) -> str:
        """What ``from_env`` refused (``e``) in one line: each error after the variable its field is
        read from (``RUNPLANE_RETENTION: outputs: cannot read duration '3x': ...``)."""
        source = EnvironSource(cls, {})
        parts = []
        for err in e.errors():
            field, rest = (str(err["loc"][0]), err["loc"][1:]) if err["loc"] else ("", ())
            where = source.env_names(field)[0] if field in cls.model_fields else "settings"
            place = "".join(f"{p}: " for p in rest)
            parts.append(f"{where}: {place}{err['msg'].removeprefix('Value error, ')}")
        return "; ".join(parts)

    def environment(self) -> dict[str, str]:
        """The variables ``from_env`` reads these settings back from: ``<env_prefix><NAME>`` of each
        field given (None left out), as text. What a process started with them needs to have them."""
        source = EnvironSource(type(self), {})
        return {
            source.env_names(name)[0]: str(value)
            for name in sorted(self.model_fields_set)
            if (value := getattr(self, name)) is not None
        }

    def exported(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``environ`` with these settings in place of the ones it names: the environment of a process
        (an agent, a job) that must read exactly these settings, and the rest of ``environ``."""
        source = EnvironSource(type(self), {})
        own = {source.env_names(name)[0] for name in type(self).model_fields}
        return {**{k: v for k, v in environ.items() if k not in own}, **self.environment()}


class StackSettings(Settings):
    """Where the stores are and how the control plane behaves. Shared by every deployable.

    ``from_env`` reads each field from ``RUNPLANE_<FIELD>`` (upper case). README.md's table of
    them is ``markdown_table()`` (``python -m runplane.settings``).
    """

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", frozen=True)
    env_fallbacks: ClassVar[Mapping[str, tuple[str, ...]]] = {"aws_region": ("AWS_REGION", "AWS_DEFAULT_REGION")}
    """Variables read, in order, for a field whose ``RUNPLANE_<FIELD>`` is unset or empty."""

    cloud: Literal["aws", "azure", "local"] = Field(
        "aws",
        description="Where the stores are: `aws` (DynamoDB, SQS, S3), `azure` (Tables, Queues, Blob storage) or "
        "`local` (one SQLite database and a directory of objects on this machine, under `RUNPLANE_STATE_DIR`).",
    )
    state_dir: str = Field(
        "~/.runplane/state",
        description="Cloud `local`: the directory (0700) of the stack's database (`state.db`) and its objects "
        "(`objects/`).",
    )
    public_url: str = Field(
        "",
        description="Cloud `local`: the URL the stack's front is reached at, the start of every object URL it signs "
        "(`runplane serve` and `runplane dev` set it).",
    )
    prefix: str = Field("runplane", description="The start of every resource name the stack derives.")
    runs_table: str = Field("", description="The runs table; empty: derived from the prefix (AWS: `PREFIX-runs`).")
    workers_table: str = Field(
        "", description="The workers table; empty: derived from the prefix (AWS: `PREFIX-workers`)."
    )
    tokens_table: str = Field(
        "", description="The tokens table; empty: derived from the prefix (AWS: `PREFIX-tokens`)."
    )
    bucket: str = Field(
        "", description="The data bucket (Azure: container) of logs and outputs; empty: derived from the prefix."
    )
    pools_table: str = Field("", description="The pools' state table; empty: derived from the prefix.")
    quotas_table: str = Field(
        "", description="The quotas and usage table; empty: derived from the prefix (AWS: `PREFIX-quotas`)."
    )
    secrets_table: str = Field(
        "",
        description="The secrets table (sealed values only); empty: derived from the prefix (AWS: `PREFIX-secrets`).",
    )
    sessions_table: str = Field(
        "",
        description="The sessions table (`runplane exec`, `shell`, `port-forward`); empty: derived from the prefix "
        "(AWS: `PREFIX-sessions`).",
    )
    relay_url: str = Field(
        "",
        description="AWS: the `wss://` URL of the sessions' WebSocket API stage (the template's `RelayUrl`); "
        "empty: the stack has no relay and opening a session answers 422.",
    )
    relay_table: str = Field(
        "", description="AWS: the relay's connections table; empty: derived from the prefix (`PREFIX-relay`)."
    )
    relay_message_rate: int = Field(
        250,
        ge=1,
        le=100_000,
        description="AWS: the most messages one relay connection may send in a second (frames of up to 16 KiB); "
        "one more ends its session (GONE `too_fast`). The stage takes 1000 a second for all sessions together.",
    )
    secrets_key: str = Field(
        "",
        description="The key that wraps secrets' data keys. AWS: a KMS key id, ARN or alias (empty: "
        "`alias/PREFIX-secrets`); Azure: a Key Vault key URL (`https://VAULT.vault.azure.net/keys/NAME`) or "
        "`file:PATH`; local: a key file (empty: `secrets.key` in `RUNPLANE_STATE_DIR`, mode 0600).",
    )
    aws_region: str = Field(
        "us-east-1",
        description="The AWS region; unset or empty: `AWS_REGION` (what Lambda and ECS set), "
        "else `AWS_DEFAULT_REGION`.",
    )
    aws_endpoint_url: str | None = Field(
        None,
        description="Another endpoint for every AWS API (LocalStack, moto's server, a VPC endpoint); "
        "empty: AWS itself.",
    )
    dynamodb_endpoint_url: str | None = Field(
        None,
        description="DynamoDB alone at another endpoint (DynamoDB Local, dynalite, a VPC endpoint); the queues, "
        "the bucket and Batch stay at `RUNPLANE_AWS_ENDPOINT_URL`. Empty: the same as the others.",
    )
    azure_storage_connection_string: str | None = Field(
        None,
        description="Azure: a storage connection string (Azurite's, or an account key's). Without one, "
        "`RUNPLANE_AZURE_STORAGE_ACCOUNT` is reached with the managed identity.",
    )
    azure_storage_account: str | None = Field(
        None, description="Azure: the storage account, reached with the managed identity (DefaultAzureCredential)."
    )
    azure_batch_account_url: str | None = Field(
        None,
        description="Azure Batch: `https://<account>.<region>.batch.azure.com`, for pools with backend `azure-batch`.",
    )
    azure_batch_account_key: str | None = Field(
        None, description="Azure Batch: the account's shared key; without one the managed identity is used."
    )
    webpubsub_connection_string: str = Field(
        "",
        description="Azure: the Web PubSub resource sessions meet in (`Endpoint=https://NAME.webpubsub.azure.com;"
        "AccessKey=...;Version=1.0;`), for the function app only (workers dial without it); empty: the stack has no "
        "relay and opening a session answers 422.",
    )
    webpubsub_hub: str = Field(
        "runplane",
        description="Azure: the Web PubSub hub of the sessions, whose event handler is the function app's "
        "`/relay/events` (system events connect, connected, disconnected).",
    )
    pools: str = Field(
        "", description="The pools, as a file path or inline YAML/JSON; empty: the built-in one-machine pool."
    )
    worker_stale_seconds: float = Field(
        30, description="A worker silent for longer than this (no heartbeat) counts as gone."
    )
    rehint_seconds: float = Field(
        300,
        description="The reaper sends a queued run's hint again once the last one is this old (the first 32 "
        "runs of each pool's line).",
    )
    schedule_calls: int = Field(
        2000,
        ge=1,
        description="Store and queue calls one scheduled dispatcher pass spends on waiting runs and sweeps, after "
        "its pools; the next pass goes on where it stopped (docs/scheduling.md).",
    )
    event_calls: int = Field(
        1000,
        ge=1,
        description="Store and queue calls one dispatcher event spends on the runs and sweeps that wait for a run "
        "or sweep that ended; an event of its own goes on with the rest.",
    )
    max_body_bytes: int = Field(256 * 1024, description="The largest HTTP request body the API reads.")
    max_upload_bytes: int = Field(
        DEFAULT_MAX_UPLOAD_BYTES,
        ge=1,
        description="The largest archive of a directory a user uploads for their runs (`runplane run --upload`); "
        "a larger one is refused (413).",
    )
    retention: str = Field(
        "",
        description="How long what runs leave is kept, as JSON: `outputs`, `logs` and `runs` (a finished run's "
        "record) after a run ends, `uploads` after their last use, each a duration or `forever`, e.g. "
        '`{"outputs": "30d", "logs": "30d", "runs": "180d", "uploads": "14d"}`. A pool\'s `retention` overrides it '
        "field by field. Empty: everything is kept (docs/retention.md).",
    )
    upload_retention_days: int = Field(
        0,
        ge=0,
        le=36500,
        description="Over 0: uploads are deleted this many days after their last use, in place of `retention`'s "
        "`uploads` (the deploy templates' `UploadRetentionDays`, which also sets the bucket's lifecycle rule). "
        "0: `retention`'s `uploads` holds.",
    )
    local_state_dir: str = Field(
        "~/.runplane/local", description="Backend `local`: where the agents it starts keep their logs."
    )
    agent_args: str = Field("", description="Extra arguments for every agent launched, as shell words.")
    input_buckets: str = Field(
        "",
        description="Buckets (Azure: containers) runs may read `s3://` inputs from: a comma-separated list for every "
        'user, or JSON mapping a group (or `*`, everyone) to its list, e.g. `{"*": ["public-data"], "vision": '
        '["vision-raw"]}`. Empty: none. The stack\'s own bucket is never allowed.',
    )

    @field_validator("relay_url")
    @classmethod
    def _relay_url(cls, value: str) -> str:
        if value and not re.fullmatch(r"wss?://[^/\s]+(/\S*)?", value):
            raise ValueError(f"must be a ws:// or wss:// URL, not {value[:200]!r}")
        return value

    @field_validator("aws_endpoint_url", "dynamodb_endpoint_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    def input_bucket_allowlist(self) -> dict[str, frozenset[str]]:
        """``input_buckets`` read: group (``*`` for everyone) -> the buckets its members may read.
        Raises ValueError naming what is wrong."""
        return parse_bucket_allowlist(self.input_buckets)

    @field_validator("input_buckets")
    @classmethod
    def _allowlist(cls, value: str) -> str:
        parse_bucket_allowlist(value)
        return value

    def kept(self) -> Retention:
        """``retention`` read, with ``upload_retention_days`` (over 0) as its ``uploads``: the stack's retention."""
        kept = read_retention(self.retention)
        if self.upload_retention_days > 0:
            return kept.model_copy(update={"uploads": self.upload_retention_days * 86400.0})
        return kept

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        try:
            read_retention(value)
        except ValidationError as e:
            raise ValueError(problems(e)) from None
        return value

    def stack_id(self) -> str:
        """A short name for this control plane (where its runs table is), so that agents of
        different stacks sharing one Docker engine never touch each other's containers."""
        tables = self.dynamodb_endpoint_url or self.aws_endpoint_url or ""
        where = f"{self.cloud}|{tables}|{self.aws_region}|{self.runs_table or self.prefix}"
        if self.cloud == "local":
            where = f"local|{Path(self.state_dir).expanduser().resolve()}|{self.runs_table or self.prefix}"
        if self.cloud == "azure":
            # the account's table endpoint (or its name), never its key
            parts = parse_connection_string(self.azure_storage_connection_string or "")
            account = parts.get("TableEndpoint") or parts.get("AccountName") or self.azure_storage_account or ""
            where = f"azure|{account}|{self.runs_table or self.prefix}"
        return hashlib.sha256(where.encode()).hexdigest()[:12]


def markdown_table(settings_cls: type[BaseSettings] = StackSettings) -> str:
    """The fields of ``settings_cls`` as a Markdown table: variable, default, description."""
    source = EnvironSource(settings_cls, {})
    rows = ["| variable | default | what it sets |", "| --- | --- | --- |"]
    for name, field in settings_cls.model_fields.items():
        default = "" if field.default in (None, "") else f"`{field.default}`"
        text = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{source.env_names(name)[0]}` | {default} | {text} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
