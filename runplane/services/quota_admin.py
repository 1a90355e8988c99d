"""Quotas: the administrator's use cases, and what a user may see of the quotas that apply to them.

Admins set, read, list and remove the quota of any user or group. A user reads only the quotas
that bind them: their own and those of their groups. Any other quota answers exactly as one that
does not exist (404), so nobody learns which users or groups have one. Each quota is shown with
its use now: what its user or group holds and has used this period (``admission.use_of``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from runplane.domain.common import NAME_PATTERN
from runplane.domain.errors import Forbidden, InvalidRequest, NotFound
from runplane.domain.quotas import Quota, QuotaKind, UsageRecord
from runplane.domain.tenancy import USER_PATTERN, Principal
from runplane.ports import Ports
from runplane.services.admission import Use, use_of

LIMITS = ("max_running", "max_gpus", "max_cpus", "gpu_hours", "cpu_hours", "period")
"""What a quota sets (``set_quota``'s ``limits``): a limit left out does not apply."""


@dataclass(frozen=True)
class QuotaUse:
    """A quota with what its user or group holds and has used this period."""

    quota: Quota
    use: Use


def valid_name(kind: QuotaKind, name: str) -> bool:
    """Whether ``name`` can be a user (USER_PATTERN) or a group (NAME_PATTERN)."""
    return re.fullmatch(USER_PATTERN if kind == "user" else NAME_PATTERN, name) is not None


def label(kind: QuotaKind, name: str) -> str:
    """How answers name a quota: ``user alice``, ``group vision`` (a name that cannot be one is
    quoted and cut short: it came from a path)."""
    return f"{kind} {name}" if valid_name(kind, name) else f"{kind} {name[:80]!r}"


def applies_to(principal: Principal, kind: QuotaKind, name: str) -> bool:
    """Whether the quota of ``kind`` ``name`` binds ``principal``: their own, or a group's of theirs."""
    return name == principal.user if kind == "user" else name in principal.groups


def _with_use(ports: Ports, quota: Quota, now: float, record: UsageRecord | None = None) -> QuotaUse:
    found = record if record is not None else ports.quotas.usage(quota.kind, quota.name)
    return QuotaUse(quota, use_of(found, quota.period, now))


def set_quota(ports: Ports, principal: Principal, kind: QuotaKind, name: str, limits: Mapping[str, Any]) -> QuotaUse:
    """Store the quota of ``kind`` ``name`` with ``limits`` (replacing any it had: a limit left
    out no longer applies; none at all makes a quota that only counts use). Admins only: raises
    Forbidden for anyone else, InvalidRequest for a name that cannot be a user or group or a
    limit that is not acceptable."""
    if not principal.admin:
        raise Forbidden(f"token of {principal.user} lacks the 'admin' permission")
    if not valid_name(kind, name):
        rule = "1-64 letters, digits and . _ @ -" if kind == "user" else "lower-case letters, digits and -, at most 48"
        raise InvalidRequest(f"{kind} {name[:80]!r} is not valid: {rule}, starting with a letter or digit")
    unknown = sorted(set(limits) - set(LIMITS))
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: not a limit a quota has; limits are {', '.join(LIMITS)}")
    now = ports.clock()
    try:
        quota = Quota(kind=kind, name=name, **limits, updated_at=now, updated_by=principal.user)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"{where}: {first['msg'].removeprefix('Value error, ')}") from e
    ports.quotas.put(quota)
    return _with_use(ports, quota, now)


def get_quota(ports: Ports, principal: Principal, kind: QuotaKind, name: str) -> QuotaUse:
    """The quota of ``kind`` ``name`` with its use. An admin reads any; a user only their own and
    their groups'. Raises NotFound when there is none, and for one the caller may not read."""
    if not valid_name(kind, name) or not (principal.admin or applies_to(principal, kind, name)):
        raise NotFound(f"no quota for {label(kind, name)}")
    quota = ports.quotas.get(kind, name)
    if quota is None:
        raise NotFound(f"no quota for {label(kind, name)}")
    return _with_use(ports, quota, ports.clock())


def delete_quota(ports: Ports, principal: Principal, kind: QuotaKind, name: str) -> None:
    """Remove the quota of ``kind`` ``name`` (what its runs hold is still counted, so a quota set
    again starts from the use of the moment). Admins only: raises Forbidden for anyone else,
    NotFound when there is none."""
    if not principal.admin:
        raise Forbidden(f"token of {principal.user} lacks the 'admin' permission")
    if not valid_name(kind, name) or not ports.quotas.delete(kind, name):
        raise NotFound(f"no quota for {label(kind, name)}")


def list_quotas(ports: Ports, principal: Principal) -> list[QuotaUse]:
    """Every quota (an admin), or those that bind the caller: their own, then their groups' by
    name. Users first, each kind by name."""
    quotas, now = ports.quotas, ports.clock()
    if principal.admin:
        records = {r.key: r for r in quotas.list_usage()}
        return [_with_use(ports, q, now, records.get(q.key) or _fresh(q)) for q in quotas.list()]
    wanted: list[tuple[QuotaKind, str]] = [("user", principal.user)]
    wanted += [("group", g) for g in sorted(set(principal.groups))]
    found = [quotas.get(kind, name) for kind, name in wanted if valid_name(kind, name)]
    return [_with_use(ports, q, now) for q in found if q is not None]


def _fresh(quota: Quota) -> UsageRecord:
    return UsageRecord(kind=quota.kind, name=quota.name)
