"""The secrets service: what a value may be, how a run's references resolve against the caller's
groups, and set/list/delete/check on the embedded stack's real store and key file (SQLite, a key
file of mode 0600). The API's answers to hostile users are in tests/security/test_secrets_api.py."""

import dataclasses
import json
import re

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.errors import Forbidden, InvalidRequest, Misconfigured, NotAllowed, NotFound, PayloadTooLarge
from runplane.domain.runs import RunSpec
from runplane.domain.secrets import MAX_SECRET_BYTES, MAX_SECRETS_PER_SCOPE, SecretRef, SecretUnavailable, context
from runplane.domain.tenancy import Principal
from runplane.services import secrets

ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"], groups=["vision"])
BOB = Principal(user="bob", scopes=["runs:read", "runs:write"])
ADMIN = Principal(user="root", scopes=["admin"])
VALUE = "hf_sekrit-value-0123456789"


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("", InvalidRequest, "cannot be empty"),
        ("ab\0" + VALUE, InvalidRequest, "NUL"),
        (VALUE + "\ud800", InvalidRequest, "lone surrogate"),
        ("é" * (MAX_SECRET_BYTES // 2 + 1), PayloadTooLarge, f"at most {MAX_SECRET_BYTES}"),
    ],
)
def test_a_value_it_cannot_hold_is_refused_without_being_echoed(value, error, words):
    with pytest.raises(error) as caught:
        secrets.value_bytes(value)
    assert words in caught.value.message
    assert VALUE not in caught.value.message and "é" not in caught.value.message


def test_a_value_of_exactly_the_limit_is_its_utf8():
    value = "é" * (MAX_SECRET_BYTES // 2)
    assert secrets.value_bytes(value) == value.encode() and len(value.encode()) == MAX_SECRET_BYTES


def test_a_reference_resolves_to_the_callers_own_or_a_group_on_their_token():
    assert secrets.usable_scope(ALICE, SecretRef.parse("wandb")) == "user:alice"
    assert secrets.usable_scope(ALICE, SecretRef.parse("vision/hf")) == "group:vision"
    assert secrets.usable_scope(ALICE, SecretRef.parse("nlp/hf")) is None
    assert secrets.usable_scope(BOB, SecretRef.parse("vision/hf")) is None
    assert secrets.usable_scope(ADMIN, SecretRef.parse("vision/hf")) is None  # admins too: only their groups'


def test_a_runs_references_are_its_environments_then_its_image_login_each_once():
    spec = RunSpec(command="x", secrets={"A": "wandb", "B": "vision/hf", "C": "wandb"}, image_pull_secret="reg")
    assert [str(r) for r in secrets.run_refs(spec)] == ["wandb", "vision/hf", "reg"]
    assert secrets.run_refs(RunSpec(command="x")) == []


@pytest.mark.parametrize("name", ["Upper", "-lead", "a/b", "x" * 64, "sp ace", ""])
def test_a_name_a_secret_cannot_have_is_refused_with_the_rule(name):
    with pytest.raises(InvalidRequest, match="lower-case letters"):
        secrets.check_name(name)


@pytest.fixture
def ports(local_stack):
    return make_ports(local_stack, clock=lambda: 1_800_000_000.5)


def test_a_secret_is_stored_sealed_to_its_scope_and_name(ports, local_stack):
    made = secrets.set_secret(ports, ALICE, "wandb", VALUE)
    assert made.ref == "wandb"
    record = ports.secrets.get("user:alice", "wandb")
    assert (record.size, record.updated_at, record.updated_by) == (len(VALUE), 1_800_000_000.5, "alice")
    assert VALUE not in record.model_dump_json()
    assert local_stack.opener.open(record.sealed, context("user:alice", "wandb")) == VALUE.encode()
    with pytest.raises(SecretUnavailable):  # bound to where it was sealed
        local_stack.opener.open(record.sealed, context("user:bob", "wandb"))
    secrets.set_secret(ports, ALICE, "wandb", "another")  # replaced
    replaced = ports.secrets.get("user:alice", "wandb")
    assert local_stack.opener.open(replaced.sealed, context("user:alice", "wandb")) == b"another"


def test_a_list_holds_the_callers_own_then_their_groups_and_no_one_elses(ports):
    secrets.set_secret(ports, ALICE, "wandb", VALUE)
    secrets.set_secret(ports, BOB, "aws", VALUE)
    secrets.set_group_secret(ports, ADMIN, "vision", "hf", VALUE)
    secrets.set_group_secret(ports, ADMIN, "nlp", "hf", VALUE)
    assert [s.ref for s in secrets.list_secrets(ports, ALICE)] == ["wandb", "vision/hf"]
    assert [s.ref for s in secrets.list_secrets(ports, BOB)] == ["aws"]
    assert [s.ref for s in secrets.list_group_secrets(ports, ADMIN, "nlp")] == ["nlp/hf"]
    with pytest.raises(Forbidden):
        secrets.list_group_secrets(ports, ALICE, "vision")
    with pytest.raises(Forbidden):
        secrets.set_group_secret(ports, ALICE, "vision", "hf", "mine now")
    with pytest.raises(Forbidden):
        secrets.delete_group_secret(ports, ALICE, "vision", "hf")


def test_a_delete_removes_only_the_callers_own(ports):
    secrets.set_secret(ports, ALICE, "wandb", VALUE)
    with pytest.raises(NotFound, match=r"^secret wandb does not exist$"):
        secrets.delete_secret(ports, BOB, "wandb")
    assert ports.secrets.get("user:alice", "wandb") is not None
    secrets.delete_secret(ports, ALICE, "wandb")
    with pytest.raises(NotFound):
        secrets.delete_secret(ports, ALICE, "wandb")


def test_a_run_may_name_only_secrets_that_are_the_callers_to_use(ports):
    secrets.set_secret(ports, ALICE, "wandb", VALUE)
    secrets.set_group_secret(ports, ADMIN, "vision", "hf", VALUE)
    secrets.check_run(ports, ALICE, RunSpec(command="x", secrets={"A": "wandb", "B": "vision/hf"}))
    refused = {}
    for who, ref in [(BOB, "wandb"), (ALICE, "nothing"), (BOB, "vision/hf"), (ALICE, "nlp/hf")]:
        with pytest.raises(NotFound) as caught:
            secrets.check_run(ports, who, RunSpec(command="x", image_pull_secret=ref))
        refused[ref] = caught.value.message
    # another user's, a missing one and a group's the caller is not in read alike
    assert refused == {ref: f"secret {ref} does not exist" for ref in refused}


def test_a_scope_holds_at_most_its_limit_and_a_value_may_still_change(ports):
    for i in range(MAX_SECRETS_PER_SCOPE):
        secrets.set_secret(ports, BOB, f"s{i:03d}", "v")
    with pytest.raises(NotAllowed, match=f"{MAX_SECRETS_PER_SCOPE} secrets"):
        secrets.set_secret(ports, BOB, "one-more", "v")
    secrets.set_secret(ports, BOB, "s000", "changed")
    secrets.set_secret(ports, ALICE, "one-more", "v")  # another scope has its own room


def test_a_stack_without_a_secrets_store_refuses_what_needs_one_and_nothing_else(ports):
    bare = dataclasses.replace(ports, secrets=None, sealer=None)
    secrets.check_run(bare, ALICE, RunSpec(command="x"))
    with pytest.raises(Misconfigured):
        secrets.check_run(bare, ALICE, RunSpec(command="x", secrets={"A": "wandb"}))
    with pytest.raises(Misconfigured):
        secrets.set_secret(bare, ALICE, "wandb", VALUE)
    with pytest.raises(Misconfigured):
        secrets.list_secrets(bare, ALICE)


def test_no_answer_of_the_api_can_hold_a_sealed_value_or_a_secrets_value():
    """Every answer's schema is exact (no other field may appear: test_wire.py), so a schema that
    never names a sealed value or a secret's value is an answer that never carries one."""
    from runplane.api.openapi import openapi_document

    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    responses = [op["responses"] for item in doc["paths"].values() for op in item.values()]
    reached, todo = set(), [r.rsplit("/", 1)[1] for r in re.findall(r'"\$ref": "([^"]+)"', json.dumps(responses))]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [r.rsplit("/", 1)[1] for r in re.findall(r'"\$ref": "([^"]+)"', json.dumps(schemas[name]))]
    assert "SecretView" in reached and not {"Sealed", "SecretRecord", "SecretPut"} & reached
    fields = {f for name in reached for f in schemas[name].get("properties", {})}
    assert not {"sealed", "ciphertext", "wrapped_key", "value"} & fields
