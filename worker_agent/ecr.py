"""Logins to Amazon ECR for a pool's ``{server, ecr: true}`` registries: a token the worker's own
AWS credentials get (``ecr:GetAuthorizationToken``), kept per server and fetched again well before
it expires (ECR's last 12 hours), so that a worker that lives for days never pulls with a stale one."""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import boto3
import botocore.exceptions

from runplane.domain.secrets import RegistryCredentials, SecretUnavailable

SERVER_PATTERN = re.compile(
    r"^(?P<account>[0-9]{12})\.dkr\.ecr(-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$"
)
"""An ECR registry's host: ``ACCOUNT.dkr.ecr.REGION.amazonaws.com``."""

REFRESH_SHARE = 0.75
"""A token is fetched again once this share of its life has passed ..."""
REFRESH_AHEAD_SECONDS = 3600.0
"""... or this long before it expires, whichever comes first."""
EXPIRY_MARGIN_SECONDS = 300.0
"""A token whose refresh failed is used until this long before it expires (the refresh is tried
again at each use meanwhile)."""

log = logging.getLogger(__name__)


def refresh_at(fetched_at: float, expires_at: float) -> float:
    """When a token fetched at ``fetched_at`` that expires at ``expires_at`` is replaced."""
    life = expires_at - fetched_at
    return min(fetched_at + REFRESH_SHARE * life, expires_at - REFRESH_AHEAD_SECONDS)


def ecr_server(server: str) -> tuple[str, str]:
    """The account and region an ECR registry's host names. Raises SecretUnavailable."""
    found = SERVER_PATTERN.match(server.lower())
    if found is None:
        raise SecretUnavailable(
            f"registry {server}: not an ECR registry (ecr: true is for ACCOUNT.dkr.ecr.REGION.amazonaws.com)"
        )
    return found["account"], found["region"]


@dataclass(frozen=True)
class Token:
    """A registry login and when it is to be replaced (``refresh_at``) and is over (``expires_at``)."""

    credentials: RegistryCredentials
    refresh_at: float
    expires_at: float


def renewed(server: str, held: Token | None, now: float, fetch: Callable[[], Token], what: str) -> tuple[Token, bool]:
    """The token to use for ``server``: ``held`` while fresh, else a new one from ``fetch``; when
    that fails (SecretUnavailable), ``held`` still, until EXPIRY_MARGIN_SECONDS before it is over,
    the failure logged (the next use tries again). The bool: whether the token is a new one."""
    if held is not None and now < held.refresh_at:
        return held, False
    try:
        return fetch(), True
    except SecretUnavailable as e:
        if held is None or now >= held.expires_at - EXPIRY_MARGIN_SECONDS:
            raise
        log.warning(
            "registry %s: the %s could not be renewed; the current one is used until it expires in %.0fs: %s",
            server,
            what,
            held.expires_at - now,
            e,
        )
        return held, False


class EcrLogins:
    """``(server) -> RegistryCredentials`` for ECR registries, safe to call from several threads
    at once (one fetch per server at a time; the others wait for it and use its token).
    ``endpoint_url`` is for an ECR stand-in; ``clock`` is the wall clock (tokens say when they expire)."""

    def __init__(self, endpoint_url: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.endpoint_url = endpoint_url
        self.clock = clock
        self._lock = threading.Lock()
        self._server_locks: dict[str, threading.Lock] = {}
        self._tokens: dict[str, Token] = {}
        self._clients: dict[str, Any] = {}

    def __call__(self, server: str) -> RegistryCredentials:
        account, region = ecr_server(server)
        with self._lock:
            lock = self._server_locks.setdefault(server, threading.Lock())
        with lock:
            held = self._tokens.get(server)
            token, new = renewed(server, held, self.clock(), lambda: self._fetch(server, account, region), "ECR token")
            if new:
                self._tokens[server] = token
            return token.credentials

    def _client(self, region: str) -> Any:
        with self._lock:
            if region not in self._clients:
                self._clients[region] = boto3.client("ecr", region_name=region, endpoint_url=self.endpoint_url)
            return self._clients[region]

    def _fetch(self, server: str, account: str, region: str) -> Token:
        fetched_at = self.clock()
        try:
            answer = self._client(region).get_authorization_token(registryIds=[account])
        except botocore.exceptions.NoCredentialsError:
            raise SecretUnavailable(
                f"registry {server}: this worker has no AWS credentials to get an ECR token"
            ) from None
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "error")
            raise SecretUnavailable(
                f"registry {server}: ECR refused a token ({code}): the worker's role needs "
                f"ecr:GetAuthorizationToken, and ecr:BatchGetImage and ecr:GetDownloadUrlForLayer on the repository"
            ) from None
        except botocore.exceptions.BotoCoreError as e:
            raise SecretUnavailable(f"registry {server}: cannot reach ECR in {region} for a token: {e}") from None
        try:
            data = answer["authorizationData"][0]
            user, sep, password = base64.b64decode(data["authorizationToken"], validate=True).decode().partition(":")
            expires = data.get("expiresAt")
            expires_at = expires.timestamp() if isinstance(expires, datetime) else fetched_at + 12 * 3600
        except (KeyError, IndexError, TypeError, binascii.Error, UnicodeDecodeError):
            raise SecretUnavailable(f"registry {server}: ECR answered with no token this worker can read") from None
        if not sep:
            raise SecretUnavailable(f"registry {server}: ECR answered with no token this worker can read")
        credentials = RegistryCredentials(username=user, password=password)
        return Token(credentials, refresh_at(fetched_at, expires_at), expires_at)
