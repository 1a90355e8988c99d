"""A client's settings and requests, and the plans of everything but runs and sweeps: pools,
workers, tokens, users, quotas, secrets and usage. ``Plans`` (``_plans``) adds runs and sweeps."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from runplane.api.models import PoolList, PoolView, WorkerList, WorkerView
from runplane.api.tenancy_models import (
    Me,
    QuotaList,
    QuotaView,
    SecretList,
    SecretView,
    Token,
    TokenCreated,
    TokenList,
    UsageReport,
    UserView,
)
from runplane.client._core import (
    USER_AGENT,
    ApiRequest,
    Plan,
    RawResponse,
    RetryPolicy,
    Sensitive,
    parse,
    query_params,
    quote_segment,
    send,
)
from runplane.client.config import resolve

M = TypeVar("M", bound=BaseModel)

MAX_WORKERS_PAGE = 500
"""The most workers the API lists in one page."""


class AdminPlans:
    """A client's settings and requests, and the plans of pools, workers, tokens, users, quotas and
    usage (``Plans`` adds runs and sweeps)."""

    def __init__(
        self,
        url: str | None,
        token: str | None,
        profile: str | None,
        *,
        timeout: float,
        retries: int,
        random: Callable[[], float] | None,
    ) -> None:
        found = resolve(url, token, profile)
        if found.token is not None and not (found.token.isascii() and found.token.isprintable()):
            raise ValueError("the token holds characters an HTTP header cannot carry")
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.url: str = found.url
        self.token: str | None = found.token
        self.profile: str | None = found.profile
        self.url_from: tuple[str, str | None] = (found.url_from, found.url_profile)
        self.timeout = timeout
        self.retries = retries
        self._policy = RetryPolicy(retries) if random is None else RetryPolicy(retries, random)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, profile={self.profile!r})"

    # requests as httpx takes them

    def http_args(self, request: ApiRequest) -> dict[str, Any]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        content = None
        if request.body is not None:
            content = json.dumps(request.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        headers.update(request.headers)
        return {
            "method": request.method.upper(),
            "url": self.url + request.path,
            "params": dict(request.query) or None,
            "content": content,
            "headers": headers,
        }

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Plan[RawResponse]:
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path[:80]!r}")
        request = ApiRequest(method.upper(), path, query_params(query), body, dict(headers or {}))
        return send(self._policy, request)

    def _get(self, model: type[M], path: str, query: Mapping[str, Any] | None = None) -> Plan[M]:
        return parse(model, (yield from self.raw("GET", path, query=query)))

    # pools, workers, tokens

    def pools(self) -> Plan[list[PoolView]]:
        return (yield from self._get(PoolList, "/v1/pools")).pools

    def workers(self, pool: str | None) -> Plan[list[WorkerView]]:
        found: list[WorkerView] = []
        cursor: str | None = None
        while True:
            query = {"pool": pool, "limit": MAX_WORKERS_PAGE, "cursor": cursor}
            page = yield from self._get(WorkerList, "/v1/workers", query)
            found.extend(page.workers)
            if not page.next_cursor or not page.workers:
                return found
            cursor = page.next_cursor

    def me(self) -> Plan[Me]:
        return self._get(Me, "/v1/me")

    def health(self) -> Plan[None]:
        yield from self.raw("GET", "/v1/health")

    def tokens(self, user: str | None) -> Plan[list[Token]]:
        return (yield from self._get(TokenList, "/v1/tokens", {"user": user})).tokens

    def create_token(
        self, user: str, groups: tuple[str, ...] | list[str], scopes: list[str] | None, expires_in: str | float | None
    ) -> Plan[TokenCreated]:
        body: dict[str, Any] = {"user": user, "groups": list(groups)}
        if scopes is not None:
            body["scopes"] = list(scopes)
        if expires_in is not None:
            body["expires_in"] = expires_in
        return parse(TokenCreated, (yield from self.raw("POST", "/v1/tokens", body)))

    def revoke_token(self, token_id: str) -> Plan[None]:
        yield from self.raw("DELETE", f"/v1/tokens/{quote_segment(token_id)}")

    def user(self, user: str) -> Plan[UserView]:
        return self._get(UserView, f"/v1/users/{quote_segment(user)}")

    def set_default_group(self, user: str, group: str | None) -> Plan[UserView]:
        return parse(
            UserView, (yield from self.raw("PUT", f"/v1/users/{quote_segment(user)}", {"default_group": group}))
        )

    # quotas

    def quotas(self) -> Plan[list[QuotaView]]:
        return (yield from self._get(QuotaList, "/v1/quotas")).quotas

    def quota(self, subject: str) -> Plan[QuotaView]:
        return self._get(QuotaView, quota_path(subject))

    def set_quota(self, subject: str, limits: Mapping[str, Any]) -> Plan[QuotaView]:
        """Raises ValueError for a limit that is not a finite number (JSON has no other)."""
        body = {k: v for k, v in limits.items() if v is not None}
        for key, value in body.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value}")
        return parse(QuotaView, (yield from self.raw("PUT", quota_path(subject), body)))

    def delete_quota(self, subject: str) -> Plan[None]:
        yield from self.raw("DELETE", quota_path(subject))

    # secrets

    def secrets(self, group: str | None) -> Plan[list[SecretView]]:
        return (yield from self._get(SecretList, secrets_path(group))).secrets

    def set_secret(self, name: str, value: str, group: str | None) -> Plan[SecretView]:
        """Raises TypeError for a value that is not text (the API keeps UTF-8 text)."""
        if not isinstance(value, str):
            raise TypeError(f"a secret's value is text (str), got {type(value).__name__}")
        body = Sensitive(value=value)
        return parse(SecretView, (yield from self.raw("PUT", secrets_path(group, name), body)))

    def delete_secret(self, name: str, group: str | None) -> Plan[None]:
        yield from self.raw("DELETE", secrets_path(group, name))

    # usage

    def usage(self, filters: Mapping[str, Any]) -> Plan[UsageReport]:
        """Raises ValueError for a moment that is not a datetime, a finite number or a string."""
        query = {k: moment(k, v) if k in ("since", "until") else v for k, v in filters.items()}
        return self._get(UsageReport, "/v1/usage", query)


def moment(name: str, value: datetime | float | str | None) -> str | None:
    """A moment as the API reads it: a datetime as ISO 8601 (a naive one is UTC), a number as
    Unix seconds, a string as it is (``2026-11-01``). Raises ValueError for anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value)
    raise ValueError(f"{name} must be a datetime, Unix seconds or an ISO 8601 string, got {value!r}")


def secrets_path(group: str | None, name: str | None = None) -> str:
    """Where secrets are: yours (``/v1/secrets``) or ``group``'s; ``name``: that one. Raises
    ValueError for an empty group or name (it would name the list)."""
    if group is not None and not group:
        raise ValueError("group is empty: give a group's name, or None for your own secrets")
    if name is not None and not name:
        raise ValueError("a secret's name is empty")
    path = "/v1/secrets" if group is None else f"/v1/groups/{quote_segment(group)}/secrets"
    return path if name is None else f"{path}/{quote_segment(name)}"


def quota_path(subject: str) -> str:
    """Where the quota of ``subject`` is: ``alice`` is the user alice, ``@vision`` the group
    vision (a user name never starts with @). Raises ValueError for an empty one."""
    kind, name = ("groups", subject[1:]) if subject.startswith("@") else ("users", subject)
    if not name:
        raise ValueError(f"{subject!r} names no user or group: give a user (alice) or a group (@vision)")
    return f"/v1/quotas/{kind}/{quote_segment(name)}"
