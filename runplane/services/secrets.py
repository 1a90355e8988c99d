"""Secrets as users and administrators keep them: set, list and remove a user's own and a group's,
and the check a submit makes of the secrets a run names.

A user sets and removes their own secrets; an administrator a group's. Anyone lists those they may
use: their own and those of every group on their token. No answer ever holds a value: a value is
sealed (``SecretSealer``, bound to its scope and name) before it is stored, and only the agent that
holds a run's lease opens it. A run naming a secret that does not exist, another user's, or a
group's the caller is not in, is refused with the same words for all three (404), so nobody learns
which secrets others have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runplane.domain.common import NAME_PATTERN
from runplane.domain.errors import Forbidden, InvalidRequest, Misconfigured, NotAllowed, NotFound, PayloadTooLarge
from runplane.domain.runs import RunSpec
from runplane.domain.secrets import (
    MAX_SECRET_BYTES,
    MAX_SECRETS_PER_SCOPE,
    SECRET_NAME_PATTERN,
    SecretRecord,
    SecretRef,
    context,
    group_scope,
    user_scope,
)
from runplane.domain.tenancy import Principal
from runplane.ports import Ports, SecretSealer, SecretStore

NAME_RULE = "lower-case letters, digits, '_', '.' and '-', starting with a letter or digit, at most 63"
GROUP_RULE = "lower-case letters, digits and '-', starting with a letter or digit, at most 48"


@dataclass(frozen=True)
class Secret:
    """One secret as answers show it: where it is and how a run names it, never its value."""

    record: SecretRecord
    ref: str
    """What a run writes to use it: ``name`` (the caller's own) or ``group/name``."""


def check_name(name: str) -> None:
    """InvalidRequest, with the rule, for a name a secret cannot have."""
    if not re.fullmatch(SECRET_NAME_PATTERN, name):
        raise InvalidRequest(f"secret name {name[:80]!r} is not valid: {NAME_RULE}")


def value_bytes(value: str) -> bytes:
    """``value`` as the UTF-8 that is sealed. Raises InvalidRequest for an empty value, one that
    holds NUL or is not UTF-8 (a lone surrogate), PayloadTooLarge for one over MAX_SECRET_BYTES;
    the message never holds the value."""
    if not value:
        raise InvalidRequest("value: a secret's value cannot be empty")
    if "\0" in value:
        raise InvalidRequest("value: a secret's value cannot hold the NUL character")
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequest(f"value: not valid UTF-8 (character {e.start} is a lone surrogate)") from None
    if len(data) > MAX_SECRET_BYTES:
        raise PayloadTooLarge(f"value: {len(data)} bytes as UTF-8; a secret holds at most {MAX_SECRET_BYTES}")
    return data


def usable_scope(principal: Principal, ref: SecretRef) -> str | None:
    """The scope ``ref`` names for ``principal``, or None when they may not use it (a group not on
    their token)."""
    if ref.group is not None and ref.group not in principal.groups:
        return None
    return ref.scope(principal.user)


def run_refs(spec: RunSpec) -> list[SecretRef]:
    """The secrets ``spec`` names (its environment's, then its image's login), each once, in order."""
    texts = [*spec.secrets.values(), *([spec.image_pull_secret] if spec.image_pull_secret else [])]
    return [SecretRef.parse(text) for text in dict.fromkeys(texts)]


def _missing(ref: SecretRef | str) -> NotFound:
    return NotFound(f"secret {ref} does not exist")


def _store(ports: Ports) -> SecretStore:
    if ports.secrets is None:
        raise Misconfigured("this stack was built without a secrets store")
    return ports.secrets


def _sealer(ports: Ports) -> SecretSealer:
    if ports.sealer is None:
        raise Misconfigured("this stack was built without a key to seal secrets with")
    return ports.sealer


def _admin(principal: Principal) -> None:
    if not principal.admin:
        raise Forbidden(f"token of {principal.user} lacks the 'admin' permission: a group's secrets are set by admins")


def _group(group: str) -> None:
    if not re.fullmatch(NAME_PATTERN, group):
        raise InvalidRequest(f"group {group[:80]!r} is not valid: {GROUP_RULE}")


def _put(ports: Ports, principal: Principal, scope: str, name: str, value: str) -> SecretRecord:
    check_name(name)
    data = value_bytes(value)
    store, sealer = _store(ports), _sealer(ports)
    if store.get(scope, name) is None and len(store.list(scope)) >= MAX_SECRETS_PER_SCOPE:
        raise NotAllowed(f"{scope} holds {MAX_SECRETS_PER_SCOPE} secrets, the most one may: remove one first")
    sealed = sealer.seal(data, context(scope, name))
    record = SecretRecord(
        scope=scope, name=name, sealed=sealed, updated_at=ports.clock(), updated_by=principal.user, size=len(data)
    )
    return store.put(record)


def set_secret(ports: Ports, principal: Principal, name: str, value: str) -> Secret:
    """Store the caller's own secret ``name`` (replacing its value if it has one): runs of theirs
    name it ``name``. Raises InvalidRequest (a name or value it cannot have), PayloadTooLarge (a
    value over MAX_SECRET_BYTES), NotAllowed (MAX_SECRETS_PER_SCOPE already), Misconfigured (a
    stack without a secrets store or key)."""
    record = _put(ports, principal, user_scope(principal.user), name, value)
    return Secret(record, name)


def set_group_secret(ports: Ports, principal: Principal, group: str, name: str, value: str) -> Secret:
    """Store group ``group``'s secret ``name``: runs of its members name it ``group/name``.
    Admins only (Forbidden); otherwise as ``set_secret``."""
    _admin(principal)
    _group(group)
    record = _put(ports, principal, group_scope(group), name, value)
    return Secret(record, f"{group}/{name}")


def delete_secret(ports: Ports, principal: Principal, name: str) -> None:
    """Remove the caller's own secret ``name``; runs that start afterwards cannot use it. NotFound
    when they have none of that name."""
    if not re.fullmatch(SECRET_NAME_PATTERN, name) or not _store(ports).delete(user_scope(principal.user), name):
        raise _missing(name)


def delete_group_secret(ports: Ports, principal: Principal, group: str, name: str) -> None:
    """Remove group ``group``'s secret ``name`` (admins only: Forbidden); NotFound when it has none."""
    _admin(principal)
    found = re.fullmatch(NAME_PATTERN, group) and re.fullmatch(SECRET_NAME_PATTERN, name)
    if not found or not _store(ports).delete(group_scope(group), name):
        raise _missing(f"{group[:80]}/{name[:80]}")


def list_secrets(ports: Ports, principal: Principal) -> list[Secret]:
    """The secrets the caller may use: their own, then each group's on their token (by group), each
    scope's by name. An admin sees a group's that is not theirs with ``list_group_secrets``."""
    store = _store(ports)
    found = [Secret(r, r.name) for r in store.list(user_scope(principal.user))]
    for group in sorted(set(principal.groups)):
        if re.fullmatch(NAME_PATTERN, group):
            found += [Secret(r, f"{group}/{r.name}") for r in store.list(group_scope(group))]
    return found


def list_group_secrets(ports: Ports, principal: Principal, group: str) -> list[Secret]:
    """Group ``group``'s secrets by name (admins only: Forbidden)."""
    _admin(principal)
    _group(group)
    return [Secret(r, f"{group}/{r.name}") for r in _store(ports).list(group_scope(group))]


def check_run(ports: Ports, principal: Principal, spec: RunSpec) -> None:
    """What a submit checks of the secrets a run (or a sweep's template) names: each must exist and
    be the caller's to use (their own, or a group's on their token). Raises NotFound "secret X does
    not exist" alike for a missing one, another user's and a group's the caller is not in, and
    Misconfigured when a run names one on a stack without a secrets store. Values are not read: the
    worker reads them when the run starts, and checks again then."""
    refs = run_refs(spec)
    if not refs:
        return
    store = _store(ports)
    for ref in refs:
        scope = usable_scope(principal, ref)
        if scope is None or store.get(scope, ref.name) is None:
            raise _missing(ref)
