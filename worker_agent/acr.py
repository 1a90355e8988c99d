"""Logins to Azure Container Registry for a pool's ``{server, acr: true}`` registries: the node
identity's Microsoft Entra access token exchanged at the registry (``/oauth2/exchange``) for a
refresh token, which logs in as the user ACR names for it. Kept per server and exchanged again well
before it expires (the ``exp`` of the token), so that a long-lived worker never pulls with a stale one."""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import requests

from runplane.domain.secrets import RegistryCredentials, SecretUnavailable
from worker_agent.ecr import Token, refresh_at, renewed

ACR_USER = "00000000-0000-0000-0000-000000000000"
"""The user name a registry refresh token logs in as."""
SCOPE = "https://management.azure.com/.default"
"""The scope of the access token a registry exchanges."""
DEFAULT_LIFE_SECONDS = 3 * 3600.0
"""How long a refresh token without a readable ``exp`` is taken to last (ACR's last three hours)."""
SERVER_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.azurecr\.(?:io|cn|us)$")
"""An ACR registry's host (Azure's public cloud, Azure China, Azure Government): the only servers
the node identity's token is sent to."""


class AccessToken(Protocol):
    @property
    def token(self) -> str: ...


class TokenCredential(Protocol):
    """What azure-identity's credentials are (``get_token(scope)``)."""

    def get_token(self, *scopes: str) -> AccessToken: ...


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT, read without checking its signature (the registry checks it)."""
    try:
        payload = token.split(".")[1]
        claims: Any = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def node_identity() -> TokenCredential:
    """The node's managed identity (azure-identity's DefaultAzureCredential: a managed identity
    on Azure, environment or workload identity settings elsewhere)."""
    from azure.identity import DefaultAzureCredential  # the azure extra: only a worker with an ACR registry

    credential: TokenCredential = DefaultAzureCredential(exclude_interactive_browser_credential=True)
    return credential


class AcrLogins:
    """``(server) -> RegistryCredentials`` for ACR registries, safe to call from several threads at
    once (one exchange per server at a time). ``credential`` None: the node identity, made at the
    first call. The node identity's token goes only to a server ``servers`` matches (an ACR host),
    never along a redirect; ``scheme`` http and other ``servers`` are only for a stand-in of the
    registry on loopback."""

    def __init__(
        self,
        credential: TokenCredential | None = None,
        clock: Callable[[], float] = time.time,
        scheme: str = "https",
        timeout: float = 30.0,
        servers: re.Pattern[str] = SERVER_PATTERN,
    ) -> None:
        self.credential = credential
        self.clock = clock
        self.scheme = scheme
        self.timeout = timeout
        self.servers = servers
        self._lock = threading.Lock()
        self._server_locks: dict[str, threading.Lock] = {}
        self._tokens: dict[str, Token] = {}

    def __call__(self, server: str) -> RegistryCredentials:
        if self.servers.fullmatch(server.lower()) is None:
            raise SecretUnavailable(
                f"registry {server}: not an ACR registry (acr: true is for NAME.azurecr.io, "
                "NAME.azurecr.cn or NAME.azurecr.us): the node identity's token is not sent to it"
            )
        with self._lock:
            lock = self._server_locks.setdefault(server, threading.Lock())
        with lock:
            held = self._tokens.get(server)
            token, new = renewed(server, held, self.clock(), lambda: self._exchange(server), "ACR refresh token")
            if new:
                self._tokens[server] = token
            return token.credentials

    def _access_token(self, server: str) -> str:
        try:
            with self._lock:
                if self.credential is None:
                    self.credential = node_identity()
                credential = self.credential
            return credential.get_token(SCOPE).token
        except ImportError:
            raise SecretUnavailable(f"registry {server}: acr: true needs azure-identity on the worker") from None
        except Exception as e:  # azure-identity's errors (no identity on this node, say) share no base class here
            raise SecretUnavailable(
                f"registry {server}: the node identity gave no access token ({type(e).__name__}): the worker "
                "needs a managed identity with the AcrPull role on the registry"
            ) from None

    def _exchange(self, server: str) -> Token:
        access = self._access_token(server)
        fetched_at = self.clock()
        try:
            answer = requests.post(
                f"{self.scheme}://{server}/oauth2/exchange",
                data={"grant_type": "access_token", "service": server, "access_token": access},
                timeout=self.timeout,
                allow_redirects=False,  # the token is for this registry alone
            )
        except requests.RequestException as e:
            raise SecretUnavailable(f"registry {server}: cannot reach its token exchange: {type(e).__name__}") from None
        if answer.is_redirect:
            raise SecretUnavailable(
                f"registry {server}: its token exchange answered a redirect (HTTP {answer.status_code}), not followed"
            )
        if answer.status_code in (401, 403):
            raise SecretUnavailable(
                f"registry {server} refused the node identity's token (HTTP {answer.status_code}): the worker's "
                "managed identity needs the AcrPull role on the registry"
            )
        try:
            answer.raise_for_status()
            refresh = answer.json()["refresh_token"]
        except (requests.RequestException, ValueError, KeyError, TypeError):
            raise SecretUnavailable(
                f"registry {server}: its token exchange answered HTTP {answer.status_code} with no refresh token"
            ) from None
        if not isinstance(refresh, str) or not refresh:
            raise SecretUnavailable(f"registry {server}: its token exchange answered with no refresh token")
        expires_at = jwt_expiry(refresh) or fetched_at + DEFAULT_LIFE_SECONDS
        credentials = RegistryCredentials(username=ACR_USER, password=refresh)
        return Token(credentials, refresh_at(fetched_at, expires_at), expires_at)
