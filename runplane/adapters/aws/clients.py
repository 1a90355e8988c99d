"""boto3 clients built from one config. A session per call site: sessions are not thread-safe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config


@dataclass(frozen=True)
class AwsConfig:
    """Where the AWS APIs are. ``endpoint_url`` points at moto, LocalStack or a VPC endpoint."""

    region: str = "us-east-1"
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None


def new_session(config: AwsConfig) -> boto3.Session:
    return boto3.session.Session(
        aws_access_key_id=config.access_key_id,
        aws_secret_access_key=config.secret_access_key,
        aws_session_token=config.session_token,
        region_name=config.region,
    )


def make_client(service: str, config: AwsConfig, session: boto3.Session | None = None, **overrides: Any) -> Any:
    """A client with standard retries and timeouts. Build clients in one thread; use them from any."""
    session = session or new_session(config)
    botocore_config = Config(
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=3,
        read_timeout=overrides.pop("read_timeout", 30),
        max_pool_connections=32,
        **overrides,
    )
    return session.client(service, endpoint_url=config.endpoint_url, config=botocore_config)


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))
