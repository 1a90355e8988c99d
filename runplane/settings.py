"""Settings, read once per process from RUNPLANE_* environment variables."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

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


class StackSettings(BaseModel):
    """Where the stores are and how the control plane behaves. Shared by every deployable.

    Each field is read from ``RUNPLANE_<FIELD>`` (upper case) by ``from_env``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cloud: Literal["aws", "azure"] = "aws"
    prefix: str = "runplane"
    runs_table: str = ""
    workers_table: str = ""
    tokens_table: str = ""
    bucket: str = ""
    pools_table: str = ""
    aws_region: str = "us-east-1"
    """``from_env``: ``RUNPLANE_AWS_REGION``, else ``AWS_REGION`` (what Lambda and ECS set), else
    ``AWS_DEFAULT_REGION``, else us-east-1."""
    aws_endpoint_url: str | None = None
    """Another endpoint for every AWS API (LocalStack, moto's server, a VPC endpoint)."""
    dynamodb_endpoint_url: str | None = None
    """DynamoDB alone at another endpoint than ``aws_endpoint_url`` (DynamoDB Local, dynalite, a VPC
    endpoint of DynamoDB); the queues, the bucket and Batch stay at ``aws_endpoint_url``."""
    azure_storage_connection_string: str | None = None
    """Azure: a storage connection string (Azurite's, or an account key's). Without one,
    ``azure_storage_account`` is reached with the managed identity (DefaultAzureCredential)."""
    azure_storage_account: str | None = None
    azure_batch_account_url: str | None = None
    """Azure Batch: ``https://<account>.<region>.batch.azure.com`` for pools with backend azure-batch."""
    azure_batch_account_key: str | None = None
    """Azure Batch shared key; without one the managed identity is used."""
    pools: str = ""
    """Pools as a file path or inline YAML/JSON; empty means the built-in one-machine pool."""
    worker_stale_seconds: float = 30
    rehint_seconds: float = 300
    max_body_bytes: int = 256 * 1024
    local_state_dir: str = "~/.runplane/local"
    agent_args: str = ""
    """Extra arguments for every launched agent, as shell words."""
    input_buckets: str = ""
    """Buckets (Azure: containers) runs may read ``s3://`` inputs from: a comma-separated list for
    every user, or JSON mapping a group (or ``*``, everyone) to its list, e.g.
    ``{"*": ["public-data"], "vision": ["vision-raw"]}``. Empty: no bucket at all. The stack's own
    bucket is never allowed, whatever this says."""

    def input_bucket_allowlist(self) -> dict[str, frozenset[str]]:
        """``input_buckets`` read: group (``*`` for everyone) -> the buckets its members may read.
        Raises ValueError naming what is wrong."""
        return parse_bucket_allowlist(self.input_buckets)

    @field_validator("input_buckets")
    @classmethod
    def _allowlist(cls, value: str) -> str:
        parse_bucket_allowlist(value)
        return value

    def stack_id(self) -> str:
        """A short name for this control plane (where its runs table is), so that agents of
        different stacks sharing one Docker engine never touch each other's containers."""
        tables = self.dynamodb_endpoint_url or self.aws_endpoint_url or ""
        where = f"{self.cloud}|{tables}|{self.aws_region}|{self.runs_table or self.prefix}"
        if self.cloud == "azure":
            # the account's table endpoint (or its name), never its key
            parts = parse_connection_string(self.azure_storage_connection_string or "")
            account = parts.get("TableEndpoint") or parts.get("AccountName") or self.azure_storage_account or ""
            where = f"azure|{account}|{self.runs_table or self.prefix}"
        return hashlib.sha256(where.encode()).hexdigest()[:12]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StackSettings:
        """Settings from the environment; raises pydantic.ValidationError naming a bad variable."""
        env = os.environ if environ is None else environ
        values: dict[str, str | None] = {
            name: env[PREFIX + name.upper()] for name in cls.model_fields if PREFIX + name.upper() in env
        }
        for endpoint in ("aws_endpoint_url", "dynamodb_endpoint_url"):
            if values.get(endpoint) == "":
                values[endpoint] = None
        region = values.get("aws_region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            values["aws_region"] = region
        else:
            values.pop("aws_region", None)
        return cls.model_validate(values)
