"""Who may do what: the caller, tokens, users, quotas, and the usage report."""

from __future__ import annotations

from pydantic import Field

from runplane.api.requests import QuotaLimits, TokenCreate, UserSettings
from runplane.api.routes.examples import QUOTA_EXAMPLES, TOKEN_EXAMPLES, USER_EXAMPLES
from runplane.api.routing import Answer, Call, PathParam, Query, Reply, operation
from runplane.api.tenancy_models import Me, QuotaList, QuotaView, TokenCreated, TokenList, UsageReport, UserView
from runplane.api.views import me_view, quota_view, token_view, usage_view, user_view
from runplane.domain import errors
from runplane.domain.common import NAME_PATTERN
from runplane.domain.quotas import QuotaKind
from runplane.domain.tenancy import TOKEN_ID_PATTERN, USER_PATTERN
from runplane.services import quota_admin, tenancy, usage


@operation(
    "GET",
    "/v1/me",
    operation_id="whoAmI",
    summary="Who the caller's token acts for (any valid token)",
    scope="",
    answers={200: Answer(Me)},
)
def me(call: Call) -> Me:
    return me_view(call.principal)


@operation(
    "POST",
    "/v1/tokens",
    operation_id="createToken",
    summary="Make a token for a user (admin); its secret is in this answer only",
    scope="admin",
    body=TokenCreate,
    examples=TOKEN_EXAMPLES,
    answers={201: Answer(TokenCreated)},
)
def create_token(call: Call, body: TokenCreate) -> TokenCreated:
    s = call.ports
    made = tenancy.create_token(
        s, user=body.user, groups=body.groups, scopes=body.scopes, expires_in=body.expires_in,
        created_by=call.principal.user,
    )  # fmt: skip
    return TokenCreated(**token_view(made.token).model_dump(), token=made.secret)


class TokensQuery(Query):
    user: str | None = Field(None, description="only this user's")


@operation(
    "GET",
    "/v1/tokens",
    operation_id="listTokens",
    summary="Every token, never a secret (admin)",
    scope="admin",
    query=TokensQuery,
    answers={200: Answer(TokenList)},
)
def list_tokens(call: Call, query: TokensQuery) -> TokenList:
    return TokenList(tokens=[token_view(t) for t in tenancy.list_tokens(call.ports, query.user)])


@operation(
    "DELETE",
    "/v1/tokens/{token_id}",
    operation_id="revokeToken",
    summary="Revoke a token (admin): refused everywhere within seconds; never the last admin token",
    scope="admin",
    path_params={"token_id": PathParam(TOKEN_ID_PATTERN, "token", "the token's id")},
    answers={204: Answer(None, "done; no body")},
    raises=(errors.NotFound, errors.LastAdmin),
    valid_refusals={
        errors.LastAdmin: "the only admin token that has not expired: another admin token must be made first"
    },
)
def revoke_token(call: Call, token_id: str) -> Reply:
    tenancy.revoke_token(call.ports, token_id)
    return Reply(None)


_USER = {
    "user": PathParam(
        USER_PATTERN, "user", "the user (percent-encoded); a name that cannot be one is a 422", checked=False,
        unquote=True,
    )
}  # fmt: skip


@operation(
    "GET",
    "/v1/users/{user}",
    operation_id="getUser",
    summary="A user's groups (those of their tokens now) and default group (admin)",
    scope="admin",
    path_params=_USER,
    answers={200: Answer(UserView)},
    raises=(errors.NotFound, errors.InvalidRequest),
)
def get_user(call: Call, user: str) -> UserView:
    return user_view(tenancy.get_user(call.ports, user))


@operation(
    "PUT",
    "/v1/users/{user}",
    operation_id="setUser",
    summary="Set a user's default group (admin): the group their runs naming none are charged to",
    scope="admin",
    path_params=_USER,
    body=UserSettings,
    examples=USER_EXAMPLES,
    answers={200: Answer(UserView)},
    raises=(errors.NotFound,),
    valid_refusals={
        errors.NotFound: "no token of the user's and nothing set",
        errors.NotAllowed: "a group that is not the user's",
    },
)
def set_user(call: Call, user: str, body: UserSettings) -> UserView:
    found = tenancy.set_default_group(call.ports, user, body.default_group, by=call.principal.user)
    return user_view(found)


def _quota_subject(kind: QuotaKind, *, setting: bool = False) -> dict[str, PathParam]:
    what = "user" if kind == "user" else "group"
    cannot = "refused (422)" if setting else "a quota that does not exist"
    return {
        what: PathParam(
            USER_PATTERN if kind == "user" else NAME_PATTERN,
            what,
            f"the {what} (percent-encoded); a name that cannot be one is {cannot}",
            checked=False,
            unquote=True,
        )
    }


@operation(
    "GET",
    "/v1/quotas",
    operation_id="listQuotas",
    summary="Quotas and their use: every one (an admin), or those that apply to you",
    scope="runs:read",
    answers={200: Answer(QuotaList)},
)
def list_quotas(call: Call) -> QuotaList:
    found = quota_admin.list_quotas(call.ports, call.principal)
    return QuotaList(quotas=[quota_view(q) for q in found])


def _quota_routes(kind: QuotaKind) -> None:
    """The three operations on one user's or group's quota."""
    what = "user" if kind == "user" else "group"
    path, name, subject = f"/v1/quotas/{what}s/{{{what}}}", what.capitalize(), _quota_subject(kind)

    @operation(
        "GET",
        path,
        operation_id=f"get{name}Quota",
        summary=f"A {what}'s quota and its use (an admin: any; a user: their own and their groups')",
        scope="runs:read",
        path_params=subject,
        answers={200: Answer(QuotaView)},
        raises=(errors.NotFound,),
        valid_refusals={errors.NotFound: "no quota set, or one that does not apply to the caller"},
    )
    def get_quota(call: Call, **named: str) -> QuotaView:
        return quota_view(quota_admin.get_quota(call.ports, call.principal, kind, named[what]))

    @operation(
        "PUT",
        path,
        operation_id=f"set{name}Quota",
        summary=f"Set a {what}'s quota (admin): the limits given replace all it had",
        scope="admin",
        path_params=_quota_subject(kind, setting=True),
        body=QuotaLimits,
        examples=QUOTA_EXAMPLES,
        answers={200: Answer(QuotaView, "stored; with its use now")},
    )
    def set_quota(call: Call, body: QuotaLimits, **named: str) -> QuotaView:
        found = quota_admin.set_quota(call.ports, call.principal, kind, named[what], body.model_dump())
        return quota_view(found)

    @operation(
        "DELETE",
        path,
        operation_id=f"delete{name}Quota",
        summary=f"Remove a {what}'s quota (admin): its runs are no longer held to it",
        scope="admin",
        path_params=subject,
        answers={204: Answer(None, "done; no body")},
        raises=(errors.NotFound,),
        valid_refusals={errors.NotFound: "no quota set"},
    )
    def delete_quota(call: Call, **named: str) -> Reply:
        quota_admin.delete_quota(call.ports, call.principal, kind, named[what])
        return Reply(None)


_quota_routes("user")
_quota_routes("group")

MOMENT_PATTERN = (
    r"^\s*(\d{1,11}(\.\d{1,6})?|\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?)\s*$"
)


class UsageQuery(Query):
    user: str | None = Field(
        None,
        description="only this user's runs; another user's: admins only (403)",
        json_schema_extra={"pattern": USER_PATTERN},
    )
    group: str | None = Field(
        None, description="only runs charged to this group", json_schema_extra={"pattern": NAME_PATTERN}
    )
    pool: str | None = Field(None, description="only runs of this pool", json_schema_extra={"pattern": NAME_PATTERN})
    since: str | None = Field(
        None,
        description="ISO 8601 (UTC if no zone) or Unix seconds; default: this month (UTC)",
        json_schema_extra={"pattern": MOMENT_PATTERN, "examples": ["2026-11-01", "2026-11-01T09:30:00Z", "1793491200"]},
    )
    until: str | None = Field(
        None,
        description="ISO 8601 or Unix seconds, exclusive; default: now",
        json_schema_extra={"pattern": MOMENT_PATTERN, "examples": ["2026-12-01", "1793491200"]},
    )
    by: str | None = Field(
        None, description="rows per (default: user)", json_schema_extra={"enum": ["user", "group", "pool"]}
    )
    kept_empty = frozenset({"since", "until"})


@operation(
    "GET",
    "/v1/usage",
    operation_id="getUsage",
    summary="What runs submitted in a window used, per user, group or pool: yours (an admin: anyone's)",
    scope="runs:read",
    query=UsageQuery,
    answers={200: Answer(UsageReport)},
    valid_refusals={
        errors.BadRequest: "a date or time that does not exist (2026-02-30), or one before 1970 or after 9999",
        errors.UnknownName: "a pool that is not configured",
        errors.InvalidRequest: "a window that ends before it starts",
    },
)
def usage_report(call: Call, query: UsageQuery) -> UsageReport:
    report = usage.report(
        call.ports, call.principal, user=query.user, group=query.group, pool=query.pool, since=query.since,
        until=query.until, by=query.by,
    )  # fmt: skip
    return usage_view(report)
