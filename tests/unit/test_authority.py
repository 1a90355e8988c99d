"""Whom a run is charged to, and the owners' groups as releases read them: a kept view of the
tokens is used for at most its lifetime, a write through this process is seen at once, and a
refusal is never made on an old view. The token store is a dict here (its real ones are in the
contract suites); the clock is injected."""

import pytest

from runplane.domain.errors import InvalidRequest
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.services.auth import CACHE_SECONDS, CachedTokens, hash_token, register_token
from runplane.services.authority import Owners, charged_group


class DictTokens:
    def __init__(self):
        self.items, self.users, self.lists = {}, {}, 0

    def lookup(self, token_hash):
        return self.items.get(token_hash)

    def put(self, token_hash, token):
        self.items[token_hash] = token

    def list(self):
        self.lists += 1
        return sorted(self.items.values(), key=lambda t: t.created_at)

    def delete(self, token_id):
        found = [h for h, t in self.items.items() if t.id == token_id]
        for h in found:
            del self.items[h]
        return bool(found)

    def user(self, name):
        return self.users.get(name)

    def put_user(self, record):
        self.users[record.user] = record

    def secret(self):
        return b"s" * 32


def test_a_user_in_several_groups_names_one_or_has_a_default_among_them():
    carol = Principal(user="carol", groups=["vision", "nlp"])
    assert charged_group(carol, "nlp") == "nlp"
    with pytest.raises(InvalidRequest, match=r"^you are not in group audio$"):
        charged_group(carol, "audio")
    with pytest.raises(InvalidRequest, match=r"^you are in several groups \(nlp, vision\): name the one"):
        charged_group(carol, None)
    assert charged_group(carol.model_copy(update={"default_group": "vision"}), None) == "vision"
    with pytest.raises(InvalidRequest):  # a default the token does not carry is no default
        charged_group(carol.model_copy(update={"default_group": "audio"}), None)
    assert charged_group(Principal(user="solo", groups=["vision"]), None) == "vision"
    assert charged_group(Principal(user="none"), None) is None


def test_owners_are_read_once_a_lifetime_and_at_once_after_a_write_here():
    now = [1000.0]
    inner = DictTokens()
    register_token(inner, "a-1", "alice", groups=["vision"], now=now[0])
    register_token(inner, "a-old", "alice", groups=["audio"], expires_at=now[0] + 1, now=now[0] - 10)
    tokens = CachedTokens(inner, clock=lambda: now[0])
    owners = Owners(tokens, lambda: now[0])
    assert owners.principal("alice").groups == ["audio", "vision"]
    now[0] += 2  # the second token expired
    assert owners.principal("alice").groups == ["audio", "vision"] and inner.lists == 1  # kept
    now[0] += CACHE_SECONDS
    assert owners.principal("alice").groups == ["vision"] and inner.lists == 2  # read again
    (held,) = [t for t in inner.list() if "vision" in t.groups]
    tokens.delete(held.id)  # revoked through this process: seen at once
    assert owners.principal("alice").groups == [] and owners.principal("bob").groups == []


def test_a_refusal_is_made_only_on_what_the_tokens_said_a_moment_ago():
    now = [1000.0]
    inner = DictTokens()
    register_token(inner, "a-1", "alice", groups=["vision"], now=now[0])
    owners = Owners(inner, lambda: now[0])
    spec = RunSpec(command="x")
    assert owners.allows("alice", spec, "vision", None)[1] is None
    register_token(inner, "a-2", "alice", groups=["nlp"], now=now[0])  # made on another instance
    now[0] += 2  # the view is still kept, but no longer fresh enough to refuse on
    owner, why = owners.allows("alice", spec, "nlp", None)
    assert (why, owner.groups) == (None, ["nlp", "vision"])
    inner.delete(inner.lookup(hash_token("a-2")).id)
    now[0] += 2
    assert owners.allows("alice", spec, "nlp", None)[1] is None  # a revocation elsewhere: seen within ttl
    now[0] += CACHE_SECONDS
    owner, why = owners.allows("alice", spec, "nlp", None)
    assert why == "alice is no longer in group nlp, which it is charged to"
    lists = inner.lists
    assert owners.allows("alice", spec, "nlp", None)[1] == why and inner.lists == lists  # no read for each refusal
