"""Secrets: a user's own and a group's, set, listed and removed; no answer ever holds a value."""

from __future__ import annotations

from runplane.api.requests import SecretPut
from runplane.api.routes.examples import SECRET_EXAMPLES
from runplane.api.routing import Answer, Call, PathParam, Reply, operation
from runplane.api.tenancy_models import SecretList, SecretView
from runplane.api.views import secret_view
from runplane.domain import errors
from runplane.domain.common import NAME_PATTERN
from runplane.domain.secrets import MAX_SECRET_BYTES, MAX_SECRETS_PER_SCOPE, SECRET_NAME_PATTERN
from runplane.services import secrets

_NAME = {"name": PathParam(SECRET_NAME_PATTERN, "secret", "the secret's name")}
_NEW_NAME = {
    "name": PathParam(
        SECRET_NAME_PATTERN, "secret", "the secret's name; a name that cannot be one is refused (422)", checked=False
    )
}
_GROUP = {"group": PathParam(NAME_PATTERN, "group", "the group")}
_NEW_GROUP = {"group": PathParam(NAME_PATTERN, "group", "the group; a name that cannot be one is refused (422)", False)}

_SET_REFUSALS: dict[type[errors.RunplaneError], str] = {
    errors.NotAllowed: f"{MAX_SECRETS_PER_SCOPE} secrets there already: remove one first",
    errors.PayloadTooLarge: f"a value over {MAX_SECRET_BYTES} bytes as UTF-8 (characters of several bytes)",
}


@operation(
    "GET",
    "/v1/secrets",
    operation_id="listSecrets",
    summary="The secrets you may use: your own and your groups', names only (never a value)",
    scope="runs:read",
    answers={200: Answer(SecretList)},
)
def list_secrets(call: Call) -> SecretList:
    return SecretList(secrets=[secret_view(s) for s in secrets.list_secrets(call.ports, call.principal)])


@operation(
    "PUT",
    "/v1/secrets/{name}",
    operation_id="setSecret",
    summary="Set a secret of your own (runs name it 'name'); the value is sealed and never shown again",
    scope="runs:write",
    path_params=_NEW_NAME,
    body=SecretPut,
    examples=SECRET_EXAMPLES,
    answers={200: Answer(SecretView, "stored: its name and size, never its value")},
    raises=(errors.PayloadTooLarge, errors.NotAllowed),
    valid_refusals=_SET_REFUSALS,
)
def set_secret(call: Call, name: str, body: SecretPut) -> SecretView:
    return secret_view(secrets.set_secret(call.ports, call.principal, name, body.value))


@operation(
    "DELETE",
    "/v1/secrets/{name}",
    operation_id="deleteSecret",
    summary="Remove a secret of your own: runs that start afterwards cannot use it",
    scope="runs:write",
    path_params=_NAME,
    answers={204: Answer(None, "done; no body")},
    raises=(errors.NotFound,),
    valid_refusals={errors.NotFound: "you have no secret of that name"},
)
def delete_secret(call: Call, name: str) -> Reply:
    secrets.delete_secret(call.ports, call.principal, name)
    return Reply(None)


@operation(
    "GET",
    "/v1/groups/{group}/secrets",
    operation_id="listGroupSecrets",
    summary="A group's secrets, names only (admin)",
    scope="admin",
    path_params=_GROUP,
    answers={200: Answer(SecretList)},
)
def list_group_secrets(call: Call, group: str) -> SecretList:
    found = secrets.list_group_secrets(call.ports, call.principal, group)
    return SecretList(secrets=[secret_view(s) for s in found])


@operation(
    "PUT",
    "/v1/groups/{group}/secrets/{name}",
    operation_id="setGroupSecret",
    summary="Set a group's secret (admin): its members' runs name it 'group/name'; the value is never shown again",
    scope="admin",
    path_params={**_NEW_GROUP, **_NEW_NAME},
    body=SecretPut,
    examples=SECRET_EXAMPLES,
    answers={200: Answer(SecretView, "stored: its name and size, never its value")},
    raises=(errors.PayloadTooLarge, errors.NotAllowed),
    valid_refusals=_SET_REFUSALS,
)
def set_group_secret(call: Call, group: str, name: str, body: SecretPut) -> SecretView:
    return secret_view(secrets.set_group_secret(call.ports, call.principal, group, name, body.value))


@operation(
    "DELETE",
    "/v1/groups/{group}/secrets/{name}",
    operation_id="deleteGroupSecret",
    summary="Remove a group's secret (admin): runs that start afterwards cannot use it",
    scope="admin",
    path_params={**_GROUP, **_NAME},
    answers={204: Answer(None, "done; no body")},
    raises=(errors.NotFound,),
    valid_refusals={errors.NotFound: "the group has no secret of that name"},
)
def delete_group_secret(call: Call, group: str, name: str) -> Reply:
    secrets.delete_group_secret(call.ports, call.principal, group, name)
    return Reply(None)
