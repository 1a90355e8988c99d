"""boto3 clients built from one config. A session per call site: sessions are not thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config


@dataclass(frozen=True)
class AwsConfig:
    """Where the AWS APIs are. ``endpoint_url`` points at moto, LocalStack or a VPC endpoint;
    ``dynamodb_endpoint_url``, when given, replaces it for DynamoDB alone."""

    region: str = "us-east-1"
    endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
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


def s3_options(config: AwsConfig) -> dict[str, Any]:
    """What S3 clients add to the common options: Signature Version 4 (S3 refuses the older
    signature in presigned URLs for new buckets and in newer regions), and, on AWS itself, the
    region's own endpoint in virtual-hosted style (``<bucket>.s3.<region>.amazonaws.com``;
    botocore falls back to path style for names that cannot be a host name), never the global
    endpoint, which redirects for buckets outside us-east-1. Left to botocore's endpoint rules
    rather than spelt out, so partitions other than aws (amazonaws.com.cn) come out right.
    An ``endpoint_url`` (moto, LocalStack) keeps its own addressing."""
    s3: dict[str, str] = {"us_east_1_regional_endpoint": "regional"}
    if config.endpoint_url is None:
        s3["addressing_style"] = "virtual"
    return {"signature_version": "s3v4", "s3": s3}


def make_client(service: str, config: AwsConfig, session: boto3.Session | None = None, **overrides: Any) -> Any:
    """A client with standard retries and timeouts. Build clients in one thread; use them from any."""
    session = session or new_session(config)
    if service == "s3":
        overrides = {**s3_options(config), **overrides}
    botocore_config = Config(
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=3,
        read_timeout=overrides.pop("read_timeout", 30),
        max_pool_connections=32,
        **overrides,
    )
    endpoint = (config.dynamodb_endpoint_url if service == "dynamodb" else None) or config.endpoint_url
    return session.client(service, endpoint_url=endpoint, config=botocore_config)


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class LazyClient:
    """A client made on first use by ``make`` (once, under a lock), then used as the client itself:
    attributes are the client's. For a service a process may never call (KMS in the API: only when
    a secret is set), so that building the stack does not pay for it."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether the client has been made."""
        return self._client is not None

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._make()
            return self._client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.client(), name)
