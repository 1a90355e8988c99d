"""Authentication, scopes and the token cache, with an injected clock."""

import pytest

from runplane.domain.errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from runplane.domain.runs import Run, RunSpec
from runplane.domain.tenancy import ApiToken, Principal
from runplane.services.auth import CACHE_SECONDS, CachedTokens, authenticate, check_owner, hash_token, require
from runplane.services.runs import run_id_for
from runplane.services.tenancy import check_token_request, lifetime


class DictTokens:
    """The smallest TokenStore: the contract suite runs the real ones."""

    def __init__(self):
        self.items, self.reads = {}, 0

    def lookup(self, token_hash):
        self.reads += 1
        return self.items.get(token_hash)

    def put(self, token_hash, token):
        self.items[token_hash] = token

    def list(self):
        return list(self.items.values())

    def delete(self, token_id):
        found = [h for h, t in self.items.items() if t.id == token_id]
        for h in found:
            del self.items[h]
        return bool(found)

    def secret(self):
        return b"s" * 32


def token(**extra):
    return ApiToken(id="tok-0123456789abcdef", user="alice", scopes=["runs:read"], created_at=0, **extra)


def test_a_revoked_token_is_refused_once_the_cache_ages_out():
    now = [0.0]
    inner = DictTokens()
    inner.put(hash_token("secret"), token())
    cached = CachedTokens(inner, clock=lambda: now[0])
    assert authenticate(cached, "Bearer secret", now=0.0).user == "alice"
    inner.delete("tok-0123456789abcdef")  # revoked by another instance
    now[0] = CACHE_SECONDS - 0.1
    assert authenticate(cached, "Bearer secret", now=0.0).user == "alice"  # still trusted for a moment
    assert inner.reads == 1
    now[0] = CACHE_SECONDS
    with pytest.raises(Unauthorized, match="not valid"):
        authenticate(cached, "Bearer secret", now=0.0)


def test_revoking_through_the_cache_takes_effect_at_once():
    inner = DictTokens()
    inner.put(hash_token("secret"), token())
    cached = CachedTokens(inner, clock=lambda: 0.0)
    authenticate(cached, "Bearer secret", now=0.0)
    assert cached.delete("tok-0123456789abcdef")
    with pytest.raises(Unauthorized, match="token is not valid"):
        authenticate(cached, "Bearer secret", now=0.0)


def test_an_expired_token_is_refused_even_from_the_cache():
    inner = DictTokens()
    inner.put(hash_token("secret"), token(expires_at=100.0))
    cached = CachedTokens(inner, clock=lambda: 0.0)
    assert authenticate(cached, "Bearer secret", now=99.9).user == "alice"
    with pytest.raises(Unauthorized, match="expired"):
        authenticate(cached, "Bearer secret", now=100.0)


@pytest.mark.parametrize(
    ("scopes", "scope", "allowed"),
    [
        ([], "runs:read", False),
        (["runs:write"], "runs:read", False),
        (["runs:read"], "runs:write", False),
        (["runs:read"], "admin", False),
        (["admin"], "runs:write", True),
        (["runs:read", "runs:write"], "runs:read", True),
    ],
)
def test_scopes_fail_closed(scopes, scope, allowed):
    principal = Principal(user="a", scopes=scopes)
    if allowed:
        require(principal, scope)
    else:
        with pytest.raises(Forbidden, match=f"token of a lacks the '{scope}' permission"):
            require(principal, scope)


def test_another_users_run_is_not_found_unless_admin():
    run = Run(id="r-1", owner="alice", spec=RunSpec(command="x"), queue="q", created_at=0)
    check_owner(Principal(user="alice"), run)
    check_owner(Principal(user="root", scopes=["admin"]), run)
    with pytest.raises(NotFound, match="run r-1 not found"):
        check_owner(Principal(user="bob"), run)


def test_run_ids_from_keys_depend_on_the_secret():
    a = run_id_for("alice", "k", b"1" * 32)
    assert a == run_id_for("alice", "k", b"1" * 32)
    assert a != run_id_for("alice", "k", b"2" * 32)
    assert a != run_id_for("bob", "k", b"1" * 32)
    with pytest.raises(ValueError, match="secret"):
        run_id_for("alice", "k", b"")


@pytest.mark.parametrize(
    ("user", "groups", "scopes", "message"),
    [
        ("", [], None, "user '' is not valid"),
        ("a b", [], None, "is not valid"),
        ("a", ["UPPER"], None, "group 'UPPER' is not valid"),
        ("a", [], [], "at least one scope"),
        ("a", [], ["root"], "unknown scope 'root'"),
        ("a", [f"g{i}" for i in range(33)], None, "at most 32 groups"),
    ],
)
def test_token_requests_are_checked(user, groups, scopes, message):
    with pytest.raises(InvalidRequest, match=message):
        check_token_request(user, groups, scopes)


def test_token_lifetimes():
    assert lifetime(None) is None
    assert lifetime("30d") == 30 * 86400
    assert lifetime(90) == 90
    assert lifetime("366d") == 366 * 86400
    refused = {
        "0s": "expires_in must be more than 0",
        "-1": "expires_in: cannot read duration '-1'",
        "soon": "expires_in: cannot read duration 'soon'",
        10**12: "expires_in: a duration cannot exceed 366 days",
        "367d": "expires_in: a duration cannot exceed 366 days",
        10**400: "expires_in: a duration cannot exceed 366 days",
    }
    for bad, message in refused.items():
        with pytest.raises(InvalidRequest, match=f"^{message}"):
            lifetime(bad)


def test_the_cli_offers_the_apis_scopes():
    from runplane.cli.tokens import Scope
    from runplane.domain.tenancy import SCOPES

    assert [s.value for s in Scope] == list(SCOPES)
