"""An in-process, stateful fake of the Azure Key Vault keys data plane, plugged into azure-core as
its transport (no socket is opened: a request for any other host fails as unreachable).

No Key Vault emulator exists, so the Key Vault adapter is tested against this. It follows the
REST API as documented for api-version 7.4:

- routes: ``GET /keys/{name}[/{version}]`` (the key's public half as a JWK, with ``attributes``),
  ``POST /keys/{name}[/{version}]/wrapkey`` and ``.../unwrapkey`` (``{"alg", "value"}``, values
  base64url without padding; answer ``{"kid", "value"}``, ``kid`` naming the version used; no
  version: the key's current one); RSA-OAEP-256, RSA-OAEP and RSA1_5, each done for real with
  the version's RSA key;
- ``api-version`` is required and must be one served (400 ``BadParameter`` otherwise);
- every request carries a bearer token for the vault's audience (401 ``Unauthorized`` with a
  ``WWW-Authenticate`` challenge otherwise), and each token holds the data actions its identity's
  roles allow (``tokens``); an action it lacks is 403 ``Forbidden`` / ``ForbiddenByRbac`` naming the
  action, as Azure RBAC answers; an operation not in the key's ``key_ops`` is 403 too;
- an unknown key or version is 404 ``KeyNotFound``; a wrapped value that does not unwrap with the
  version is 400 ``BadParameter``; errors are ``{"error": {"code", "message", "innererror"?}}``.

What it does not do: soft delete, key creation over REST, policies, or tokens that expire.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from azure.core.credentials import AccessToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.fakes.http_response import InProcessTransport

API_VERSIONS = frozenset({"7.3", "7.4", "7.5"})
AUDIENCE = "https://vault.azure.net"
READ = "Microsoft.KeyVault/vaults/keys/read"
WRAP = "Microsoft.KeyVault/vaults/keys/wrap/action"
UNWRAP = "Microsoft.KeyVault/vaults/keys/unwrap/action"
_ACTIONS = {"wrapkey": WRAP, "unwrapkey": UNWRAP}
_OPS = {"wrapkey": "wrapKey", "unwrapkey": "unwrapKey"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _padding(alg: str) -> padding.AsymmetricPadding:
    if alg == "RSA-OAEP-256":
        return padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    if alg == "RSA-OAEP":
        return padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    return padding.PKCS1v15()


class VaultError(Exception):
    def __init__(self, status: int, code: str, message: str, inner: str = "", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.inner, self.headers = status, code, message, inner, headers or {}


@dataclass
class Version:
    private: rsa.RSAPrivateKey
    key_ops: tuple[str, ...]
    created: int


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    token: str
    body: Any


@dataclass
class FakeKeyVault:
    """One vault: RSA keys by name (each a list of versions, the last the current), and the tokens
    it accepts, each with the data actions its identity's roles allow."""

    name: str = "runplanetest"
    tokens: dict[str, frozenset[str]] = field(default_factory=dict)
    keys: dict[str, dict[str, Version]] = field(default_factory=dict)
    current: dict[str, str] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    faults: list[VaultError] = field(default_factory=list)
    """Answers given, in order, to the next requests in place of theirs (throttling, outages)."""

    @property
    def url(self) -> str:
        return f"https://{self.name}.vault.azure.net"

    def create_key(self, name: str, key_ops: Iterable[str] = ("wrapKey", "unwrapKey"), size: int = 2048) -> str:
        """A new version of key ``name`` (made first if missing), now its current one; its ``kid``."""
        version = uuid.uuid4().hex
        private = rsa.generate_private_key(public_exponent=65537, key_size=size)
        self.keys.setdefault(name, {})[version] = Version(private, tuple(key_ops), int(time.time()))
        self.current[name] = version
        return f"{self.url}/keys/{name}/{version}"

    def grant(self, token: str, *actions: str) -> None:
        self.tokens[token] = frozenset(actions)

    def throttle(self, times: int = 1, retry_after: int = 1) -> None:
        """The next ``times`` requests are answered 429, as Key Vault throttles (with Retry-After)."""
        message = "Operations per second rate limit reached. Try again later."
        for _ in range(times):
            self.faults.append(VaultError(429, "Throttled", message, "", {"Retry-After": str(retry_after)}))

    def outage(self, times: int) -> None:
        """The next ``times`` requests are answered 503."""
        for _ in range(times):
            self.faults.append(VaultError(503, "ServiceUnavailable", "The service is temporarily unavailable."))

    # --- the wire ---------------------------------------------------------------------------

    def handle(self, method: str, url: str, headers: dict[str, str], content: bytes) -> tuple[int, dict, bytes]:
        split = urlsplit(url)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        by_name = {k.lower(): v for k, v in headers.items()}
        auth = by_name.get("authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        request_id = str(uuid.uuid4())
        try:
            body: Any = None
            if content:
                try:
                    body = json.loads(content)
                except ValueError as e:
                    raise VaultError(400, "BadParameter", "The request body is not valid JSON.") from e
            self.requests.append(Recorded(method, split.path, query, token, body))
            if self.faults:
                raise self.faults.pop(0)
            self._check_version(query)
            actions = self._authenticate(token)
            status, answer = self._route(method, split.path, body, actions)
        except VaultError as e:
            error: dict[str, Any] = {"code": e.code, "message": e.message}
            if e.inner:
                error["innererror"] = {"code": e.inner}
            out = {"Content-Type": "application/json; charset=utf-8", "x-ms-request-id": request_id, **e.headers}
            return e.status, out, json.dumps({"error": error}).encode()
        out = {"Content-Type": "application/json; charset=utf-8", "x-ms-request-id": request_id}
        return status, out, json.dumps(answer).encode()

    def _check_version(self, query: dict[str, str]) -> None:
        version = query.get("api-version")
        if not version:
            raise VaultError(400, "BadParameter", "The 'api-version' query parameter is missing.")
        if version not in API_VERSIONS:
            raise VaultError(
                400,
                "BadParameter",
                f"The specified version ({version}) is not recognized. Consider using the latest supported "
                f"version ({max(API_VERSIONS)}).",
            )

    def _authenticate(self, token: str) -> frozenset[str]:
        challenge = {
            "WWW-Authenticate": f'Bearer authorization="https://login.microsoftonline.com/{uuid.UUID(int=0)}", '
            f'resource="{AUDIENCE}"'
        }
        if not token:
            raise VaultError(401, "Unauthorized", "AKV10000: Request is missing a Bearer or PoP token.", "", challenge)
        audience, _, identity = token.partition("|")
        if audience != AUDIENCE:
            raise VaultError(
                401, "Unauthorized", f"AKV10022: Invalid audience. Expected {AUDIENCE}, found: {audience}."
            )
        if identity not in self.tokens:
            raise VaultError(401, "Unauthorized", "AKV10032: Invalid issuer.", "", challenge)
        return self.tokens[identity]

    def _forbidden(self, action: str, name: str) -> VaultError:
        return VaultError(
            403,
            "Forbidden",
            "Caller is not authorized to perform action on resource.\r\nIf role assignments, deny assignments or "
            "role definitions were changed recently, please observe propagation time.\r\n"
            f"Caller: appid=00000000;oid=00000000\r\nAction: '{action}'\r\n"
            "Resource: '/subscriptions/s/resourcegroups/rg/providers/microsoft.keyvault/vaults/"
            f"{self.name}/keys/{name}'"
            "\r\nAssignment: (not found)\r\nDecisionReason: null\r\n",
            "ForbiddenByRbac",
        )

    def _version(self, name: str, version: str) -> tuple[str, Version]:
        versions = self.keys.get(name, {})
        version = version or self.current.get(name, "")
        if version not in versions:
            raise VaultError(
                404,
                "KeyNotFound",
                f"A key with (name/id) {name}{f'/{version}' if version else ''} was not found in this key vault. "
                "If you recently deleted this key you may be able to recover it using the correct recovery command.",
            )
        return version, versions[version]

    def _route(self, method: str, path: str, body: Any, actions: frozenset[str]) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        operation = parts[-1] if method == "POST" and parts else ""
        target = parts[:-1] if operation else parts
        if (
            not target
            or target[0] != "keys"
            or len(target) not in (2, 3)
            or (method, operation)
            not in {
                ("GET", ""),
                ("POST", "wrapkey"),
                ("POST", "unwrapkey"),
            }
        ):
            raise VaultError(404, "NotFound", f"The requested resource {method} {path} was not found.")
        name = target[1]
        action = _ACTIONS.get(operation, READ)
        if action not in actions:
            raise self._forbidden(action, name)
        version, key = self._version(name, target[2] if len(target) == 3 else "")
        kid = f"{self.url}/keys/{name}/{version}"
        if not operation:
            numbers = key.private.public_key().public_numbers()
            jwk = {
                "kid": kid,
                "kty": "RSA",
                "key_ops": list(key.key_ops),
                "n": _b64url(numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")),
                "e": _b64url(numbers.e.to_bytes(3, "big")),
            }
            return 200, {"key": jwk, "attributes": {"enabled": True, "created": key.created, "updated": key.created}}
        if _OPS[operation] not in key.key_ops:
            raise VaultError(
                403, "Forbidden", f"Operation {_OPS[operation]} is not permitted on this key.", "KeyOperationForbidden"
            )
        if not isinstance(body, dict) or body.get("alg") not in ("RSA-OAEP-256", "RSA-OAEP", "RSA1_5"):
            raise VaultError(400, "BadParameter", "Property 'alg' is missing or not a supported algorithm.")
        try:
            value = base64.urlsafe_b64decode(str(body.get("value", "")) + "=" * (-len(str(body.get("value", ""))) % 4))
        except (binascii.Error, ValueError) as e:
            raise VaultError(400, "BadParameter", "Property 'value' is not base64url.") from e
        if operation == "wrapkey":
            try:
                result = key.private.public_key().encrypt(value, _padding(body["alg"]))
            except ValueError as e:
                raise VaultError(400, "BadParameter", "The value is too long for the key.") from e
        else:
            try:
                result = key.private.decrypt(value, _padding(body["alg"]))
            except ValueError as e:
                raise VaultError(400, "BadParameter", "Error decrypting the value.") from e
        return 200, {"kid": kid, "value": _b64url(result)}


class FakeKeyVaultTransport(InProcessTransport):
    """azure-core transport that hands each request to ``vault``; retry back-offs are recorded."""

    def __init__(self, vault: FakeKeyVault) -> None:
        super().__init__(vault.url, vault.handle)


class Identity:
    """A managed identity as a TokenCredential: a token for each audience asked, which the fake
    vault reads as ``audience|identity`` (a token for another audience is refused, as Key Vault does)."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        audience = scopes[0].removesuffix("/.default") if scopes else ""
        return AccessToken(f"{audience}|{self.identity}", int(time.time()) + 3600)


def deployed_keys(vault: FakeKeyVault | None = None, key: str = "secrets") -> tuple[Any, Any]:
    """The sealer and opener of an Azure stack as the template deploys them, on ``vault`` (a new
    one with the key ``key`` when None): the sealer with the Function App's identity (wrap only),
    the opener with the nodes' (unwrap only)."""
    from runplane.adapters.azure.keyvault import key_vault_keys

    if vault is None:
        vault = FakeKeyVault()
        vault.create_key(key)
    vault.grant("api", WRAP)
    vault.grant("nodes", UNWRAP)
    url = f"{vault.url}/keys/{key}"
    sealer, _ = key_vault_keys(url, Identity("api"), FakeKeyVaultTransport(vault))
    _, opener = key_vault_keys(url, Identity("nodes"), FakeKeyVaultTransport(vault))
    return sealer, opener
