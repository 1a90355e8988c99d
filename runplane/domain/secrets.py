"""Secrets: values a run needs but no one may read back (API keys, registry passwords).

A secret belongs to a *scope*: a user (``user:<name>``, set by that user) or a group
(``group:<name>``, set by an administrator, usable by the group's members). The secrets store
keeps each one sealed (``Sealed``): its value encrypted under a data key of its own, and that
key wrapped by the stack's key (AWS KMS, Azure Key Vault, or a key file on one machine). The
API seals and never opens; only the agent holding a run's lease opens the secrets the run names.
Every value is bound to its scope and name (``context``): a sealed value copied to another
scope or name does not open.

Runs name secrets by reference (``SecretRef``): ``name`` (the run's owner's own) or
``group/name`` (a group of the owner's). A run record holds these references only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from runplane.domain.wire import Record

SECRET_NAME = r"[a-z0-9][a-z0-9_.-]{0,62}"  # noqa: S105 (a pattern)
SECRET_NAME_PATTERN = f"^{SECRET_NAME}$"
"""A secret's name: lower-case letters, digits, ``_ . -``, at most 63 characters."""
GROUP_NAME = r"[a-z0-9][a-z0-9-]{0,47}"  # the groups' NAME_PATTERN (domain/common.py), unanchored
SECRET_REF_PATTERN = f"^(?:{GROUP_NAME}/)?{SECRET_NAME}$"
"""How a run names a secret: ``name`` (its owner's) or ``group/name`` (a group's)."""
MAX_SECRET_BYTES = 32 * 1024
"""The largest value, in bytes of UTF-8 (a Docker config, a service account key file)."""
MAX_SECRETS_PER_SCOPE = 200
"""The most secrets one user or one group holds."""
MAX_RUN_SECRETS = 32
"""The most secrets one run names in its environment."""
MIN_MASKED_LENGTH = 4
"""Values shorter than this are not masked in logs (masking "1" would hide every digit)."""
MASK = "***"

_SCOPE = re.compile("^(user|group):(.+)$")
_REF = re.compile(SECRET_REF_PATTERN)


def user_scope(user: str) -> str:
    return f"user:{user}"


def group_scope(group: str) -> str:
    return f"group:{group}"


def scope_parts(scope: str) -> tuple[str, str]:
    """``("user", name)`` or ``("group", name)``; raises ValueError for anything else."""
    match = _SCOPE.fullmatch(scope)
    if not match:
        raise ValueError(f"not a secret scope: {scope[:80]!r}")
    return match.group(1), match.group(2)


@dataclass(frozen=True)
class SecretRef:
    """A run's reference to a secret: its owner's (``group`` None) or a group's."""

    name: str
    group: str | None = None

    @classmethod
    def parse(cls, text: str) -> SecretRef:
        """Raises ValueError with a message for a user."""
        if not isinstance(text, str) or not _REF.fullmatch(text):
            raise ValueError(
                f"{str(text)[:80]!r} is not a secret reference: 'name' (yours) or 'group/name' (a group's); "
                "a name is lower-case letters, digits, '_', '.', '-'"
            )
        group, _, name = text.rpartition("/")
        return cls(name=name, group=group or None)

    def scope(self, owner: str) -> str:
        """The scope this reference names for a run of ``owner``."""
        return group_scope(self.group) if self.group else user_scope(owner)

    def __str__(self) -> str:
        return f"{self.group}/{self.name}" if self.group else self.name


def context(scope: str, name: str) -> dict[str, str]:
    """What a sealed value is bound to: its scope and name (KMS's encryption context, and the
    associated data of the value's AES-GCM encryption everywhere)."""
    return {"runplane:scope": scope, "runplane:name": name}


def associated_data(ctx: dict[str, str]) -> bytes:
    """``ctx`` as the bytes AES-GCM authenticates: canonical JSON, keys sorted."""
    return json.dumps(ctx, sort_keys=True, separators=(",", ":")).encode()


class Sealed(Record):
    """A value as the secrets store keeps it: never the value itself."""

    key_id: str = Field(description="the key that wrapped the data key (a KMS key, a Key Vault key, a key file)")
    wrapped_key: str = Field(description="the value's data key, wrapped by key_id (base64)")
    nonce: str = Field(description="AES-GCM nonce (base64, 12 bytes)")
    ciphertext: str = Field(description="the value under AES-256-GCM with the data key, tag included (base64)")


class SecretRecord(Record):
    """One secret as stored."""

    v: int = 1
    scope: str
    name: str
    sealed: Sealed
    updated_at: float
    updated_by: str
    size: int = 0
    """The value's length in bytes (shown; the value never is)."""


class SecretUnavailable(Exception):
    """A secret a run names cannot be given to it (gone, not the owner's to use, or not
    opened); the message says which and why, never the value."""


DOCKER_HUB = "docker.io"
"""Docker Hub, as ``registry_host`` names it (an image whose name has no registry host is Hub's)."""
_HUB_ALIASES = frozenset({DOCKER_HUB, "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})


def registry_host(server: str) -> str:
    """A registry as runplane compares them: its host (and port), lower-cased, without a scheme or
    a path (``https://ghcr.io`` and ``ghcr.io/v2/`` are ``ghcr.io``); Docker Hub's names (``docker
    login`` writes ``https://index.docker.io/v1/``) are all ``docker.io``."""
    host = server.strip().lower()
    host = host.partition("://")[2] if "://" in host else host
    host = host.partition("/")[0]
    return DOCKER_HUB if host in _HUB_ALIASES else host


@dataclass(frozen=True)
class RegistryCredentials:
    """A registry login held in a secret: ``{"username", "password"}``, or a Docker config
    ``auths`` entry (``{"auth": base64("user:password")}``, with or without a ``{"auths":
    {server: ...}}`` around it: a whole ``~/.docker/config.json``, its keys compared as
    ``registry_host`` names them)."""

    username: str
    password: str = field(repr=False)  # never in a log line or a traceback's locals

    @classmethod
    def parse(cls, value: str, server: str | None = None) -> RegistryCredentials:
        """Raises ValueError naming what is wrong (never echoing the value)."""
        import base64
        import binascii

        try:
            data: Any = json.loads(value)
        except ValueError:
            raise ValueError('is not JSON: registry credentials are {"username": ..., "password": ...}') from None
        if isinstance(data, dict) and isinstance(data.get("auths"), dict):
            entries = data["auths"]
            wanted = registry_host(server) if server else None
            entry = next((e for key, e in entries.items() if registry_host(str(key)) == wanted), None)
            if entry is None and len(entries) == 1:
                entry = next(iter(entries.values()))
            if entry is None:
                raise ValueError(f"holds no auths entry for {server}")
            data = entry
        if not isinstance(data, dict):
            raise ValueError('is not a JSON object: registry credentials are {"username": ..., "password": ...}')
        if isinstance(data.get("username"), str) and isinstance(data.get("password"), str):
            return cls(username=data["username"], password=data["password"])
        if isinstance(data.get("auth"), str):
            try:
                user, sep, password = base64.b64decode(data["auth"], validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise ValueError("has an 'auth' that is not base64 of user:password") from None
            if sep:
                return cls(username=user, password=password)
            raise ValueError("has an 'auth' that is not base64 of user:password")
        raise ValueError('holds neither "username" and "password" nor "auth"')
