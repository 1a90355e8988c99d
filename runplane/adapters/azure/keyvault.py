"""Secrets' data keys wrapped by an RSA key in Azure Key Vault, over the Key Vault keys REST API
(api-version 7.4) through an azure-core pipeline, with a bearer token for the vault's audience
(``https://vault.azure.net/.default``) from a managed identity or the credential given.

The API's identity may only *wrap* (``POST {key}/wrapkey``, RSA-OAEP-256, sent to the vault: the
API needs no read of the key, and a new key version is used as soon as it is made); the workers'
identity may only *unwrap* (``POST {key}/{version}/unwrapkey``). RSA-OAEP has no associated data:
a value is bound to its scope and name by its own AES-GCM encryption (``envelope.py``).

A sealed value records the key version that wrapped its data key (Key Vault's ``kid``); the
opener sends a token only to the vault and key it was configured with, whatever a record says.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from azure.core import PipelineClient
from azure.core.credentials import TokenCredential
from azure.core.exceptions import AzureError
from azure.core.pipeline.policies import BearerTokenCredentialPolicy, RetryPolicy, UserAgentPolicy
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest, HttpResponse

from runplane.adapters.envelope import new_data_key, open_with, seal_with, unb64
from runplane.domain.errors import BackendError, Misconfigured
from runplane.domain.secrets import Sealed, SecretUnavailable

API_VERSION = "7.4"
ALGORITHM = "RSA-OAEP-256"
_NAME = re.compile(r"^[0-9A-Za-z-]{1,127}$")
_VERSION = re.compile(r"^[0-9A-Za-z]{1,64}$")
_TRANSIENT = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class KeyUrl:
    """A Key Vault key: ``https://VAULT.vault.azure.net/keys/NAME[/VERSION]`` (no version: the
    key's current one)."""

    vault: str
    name: str
    version: str = ""

    @classmethod
    def parse(cls, url: str) -> KeyUrl:
        """Raises ValueError saying what a key URL looks like."""
        parts = urlsplit(url.strip())
        path = [p for p in parts.path.split("/") if p]
        if (
            parts.scheme != "https"
            or not parts.hostname
            or "." not in parts.hostname
            or parts.query
            or parts.fragment
            or parts.username
            or len(path) not in (2, 3)
            or path[0] != "keys"
            or not _NAME.fullmatch(path[1])
            or (len(path) == 3 and not _VERSION.fullmatch(path[2]))
        ):
            raise ValueError(
                f"{url[:200]!r} is not a Key Vault key URL: https://VAULT.vault.azure.net/keys/NAME[/VERSION]"
            )
        return cls(f"https://{parts.netloc.lower()}", path[1], path[2] if len(path) == 3 else "")

    @property
    def scope(self) -> str:
        """The token audience of the vault: its host less the vault's name
        (``https://vault.azure.net/.default``; sovereign clouds and Managed HSM alike)."""
        return f"https://{self.vault.split('://', 1)[1].split('.', 1)[1]}/.default"

    def __str__(self) -> str:
        return f"{self.vault}/keys/{self.name}" + (f"/{self.version}" if self.version else "")


class KeyVaultError(Exception):
    """What Key Vault answered to a refused call: HTTP ``status``, its ``code`` (and inner code,
    e.g. ``ForbiddenByRbac``) and the first line of its message."""

    def __init__(self, status: int, code: str, inner: str, message: str) -> None:
        self.status, self.code, self.inner = status, code, inner
        self.first_line = message.strip().splitlines()[0] if message.strip() else "no message"
        super().__init__(f"HTTP {status} {code or 'error'}{f' ({inner})' if inner else ''}: {self.first_line}")

    @property
    def transient(self) -> bool:
        return self.status in _TRANSIENT


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _error(status: int, content: bytes) -> KeyVaultError:
    """The error of a non-2xx answer: ``{"error": {"code", "message", "innererror": {"code"}}}``."""
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return KeyVaultError(status, "", "", content[:200].decode("utf-8", "replace"))
    inner = error.get("innererror")
    inner_code = str(inner.get("code") or "") if isinstance(inner, dict) else ""
    return KeyVaultError(status, str(error.get("code") or ""), inner_code, str(error.get("message") or ""))


class KeyVaultKey:
    """Wrap and unwrap calls to one Key Vault key. ``credential``: a TokenCredential (default:
    DefaultAzureCredential, made at the first call; a user-assigned identity is named by
    ``AZURE_CLIENT_ID``); ``transport``: azure-core's requests transport unless given (tests)."""

    def __init__(
        self,
        url: str | KeyUrl,
        *,
        credential: TokenCredential | None = None,
        transport: HttpTransport[Any, Any] | None = None,
        retry_total: int = 3,
    ) -> None:
        self.url = url if isinstance(url, KeyUrl) else KeyUrl.parse(url)
        self._credential = credential
        self._transport = transport
        self._retry_total = retry_total
        self._client: PipelineClient[HttpRequest, HttpResponse] | None = None
        self._lock = threading.Lock()

    def _pipeline(self) -> PipelineClient[HttpRequest, HttpResponse]:
        with self._lock:
            if self._client is None:
                credential = self._credential
                if credential is None:
                    from azure.identity import DefaultAzureCredential  # heavy (MSAL): only on first use

                    credential = DefaultAzureCredential()
                transport = self._transport
                if transport is None:
                    from azure.core.pipeline.transport import RequestsTransport

                    transport = RequestsTransport(connection_timeout=10, read_timeout=30)
                policies: list[Any] = [
                    UserAgentPolicy("runplane-keyvault", user_agent_use_env=False),
                    # throttling and server errors, honouring Retry-After; signed afresh each try
                    RetryPolicy(retry_total=self._retry_total, retry_backoff_factor=0.5, retry_backoff_max=10),
                    BearerTokenCredentialPolicy(credential, self.url.scope),
                ]
                self._client = PipelineClient(self.url.vault, policies=policies, transport=transport)
            return self._client

    def _call(self, operation: str, key: KeyUrl, data: bytes) -> tuple[str, bytes]:
        """``operation`` (wrapkey, unwrapkey) of ``data`` with ``key``: the key version Key Vault
        used (its ``kid``) and the result. Raises KeyVaultError, or BackendError when the vault
        cannot be reached or answers something unreadable."""
        if key.vault != self.url.vault or key.name != self.url.name:
            raise KeyVaultError(0, "OtherKey", "", f"{key} is not the configured key {self.url}")
        body = json.dumps({"alg": ALGORITHM, "value": _b64url(data)}).encode()
        request = HttpRequest(
            "POST",
            f"{key}/{operation}?api-version={API_VERSION}",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                "x-ms-client-request-id": str(uuid.uuid4()),
            },
            content=body,
        )
        try:
            response = self._pipeline().send_request(request)
            content = response.read()
        except AzureError as e:
            raise BackendError(f"Key Vault {operation} with {self.url} failed: {e.message}") from e
        if not 200 <= response.status_code < 300:
            raise _error(response.status_code, content)
        try:
            answer = json.loads(content)
            kid, value = str(answer["kid"]), _unb64url(str(answer["value"]))
        except (ValueError, KeyError, TypeError, binascii.Error) as e:
            raise BackendError(
                f"Key Vault {operation} with {self.url}: the answer is not a key operation result"
            ) from e
        return kid, value

    def wrap(self, data_key: bytes) -> tuple[str, bytes]:
        """``data_key`` wrapped by the key (its version given, else the current one): the wrapping
        version's URL and the wrapped key."""
        return self._call("wrapkey", self.url, data_key)

    def unwrap(self, kid: str, wrapped: bytes) -> bytes:
        """What ``wrap`` wrapped as ``wrapped`` with version ``kid`` of this key."""
        return self._call("unwrapkey", KeyUrl.parse(kid), wrapped)[1]


class KeyVaultSealer:
    """Seals values under data keys that the Key Vault key wraps (the API's side: wrap only).
    Misconfigured when the vault refuses (no such key, a role missing); BackendError when it
    cannot be reached or is throttling."""

    def __init__(self, key: KeyVaultKey) -> None:
        self.key = key

    def seal(self, value: bytes, context: Mapping[str, str]) -> Sealed:
        data_key = new_data_key()
        try:
            kid, wrapped = self.key.wrap(data_key)
        except KeyVaultError as e:
            if e.transient:
                raise BackendError(f"Key Vault key {self.key.url} could not wrap now ({e}); retry") from e
            raise Misconfigured(
                f"Key Vault key {self.key.url} refused to wrap a secret's key: {e}{_hint(e, 'wrap')}"
            ) from e
        return seal_with(data_key, wrapped, kid, value, context)


class KeyVaultOpener:
    """Opens values whose data keys the Key Vault key wrapped (the workers' side: unwrap only).
    SecretUnavailable, saying why, for whatever keeps a value from being opened."""

    def __init__(self, key: KeyVaultKey) -> None:
        self.key = key

    def open(self, sealed: Sealed, context: Mapping[str, str]) -> bytes:
        try:
            kid = KeyUrl.parse(sealed.key_id)
        except ValueError:
            raise SecretUnavailable(
                f"the value was sealed under another key ({sealed.key_id[:40]}), not this stack's Key Vault key"
            ) from None
        if (kid.vault, kid.name) != (self.key.url.vault, self.key.url.name):
            raise SecretUnavailable(f"the value was sealed under another key ({kid}), not {self.key.url}")
        wrapped = unb64(sealed.wrapped_key, "wrapped key")
        try:
            data_key = self.key.unwrap(str(kid), wrapped)
        except KeyVaultError as e:
            raise SecretUnavailable(f"Key Vault key {kid} did not unwrap its key: {e}{_hint(e, 'unwrap')}") from e
        except BackendError as e:
            raise SecretUnavailable(e.message) from e
        return open_with(data_key, sealed, context)


def _hint(e: KeyVaultError, action: str) -> str:
    if e.status == 403:
        return f" (this identity needs Microsoft.KeyVault/vaults/keys/{action}/action on the key)"
    if e.status == 401:
        return " (no token for the vault: is the managed identity assigned, AZURE_CLIENT_ID set?)"
    return ""


def key_vault_keys(
    url: str, credential: TokenCredential | None = None, transport: HttpTransport[Any, Any] | None = None
) -> tuple[KeyVaultSealer, KeyVaultOpener]:
    """The sealer and opener of the key at ``url``, sharing one client. Raises Misconfigured for
    a URL that is not a key's."""
    try:
        key = KeyVaultKey(url, credential=credential, transport=transport)
    except ValueError as e:
        raise Misconfigured(f"RUNPLANE_SECRETS_KEY: {e}") from None
    return KeyVaultSealer(key), KeyVaultOpener(key)
