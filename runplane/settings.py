"""Settings, read once per process from RUNPLANE_* environment variables."""

from __future__ import annotations

from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class StackSettings(BaseSettings):
    """Where the stores are and how the control plane behaves. Shared by every deployable."""

    model_config = SettingsConfigDict(env_prefix="RUNPLANE_", extra="ignore")

    cloud: Literal["aws"] = "aws"
    prefix: str = "runplane"
    runs_table: str = ""
    workers_table: str = ""
    tokens_table: str = ""
    bucket: str = ""
    aws_region: str = "us-east-1"
    aws_endpoint_url: str | None = None
    pools: str = ""
    """Pools as a file path or inline YAML/JSON; empty means the built-in one-machine pool."""
    worker_stale_seconds: float = 30
    rehint_seconds: float = 300
    max_body_bytes: int = 256 * 1024
    local_state_dir: str = "~/.runplane/local"
    agent_args: str = ""
    """Extra arguments for every launched agent, as shell words."""
