"""Contract of the secrets store and of each stack's key: ``SecretStore``, ``SecretSealer``,
``SecretOpener`` (runplane/ports.py), the same on every stack.

What each stack's builder provides (``Stack.secrets``, ``.sealer``, ``.opener``, all three set):
- the store keeps records by (scope, name): ``put`` replaces and returns the record; ``get`` is
  None when there is none; ``list(scope, limit)`` is that scope's records sorted by name as Python
  sorts them, at most ``limit``, never another scope's (``user:al`` is not a prefix of
  ``user:alice``, ``user:x`` is not ``group:x``), whole even when the scope's records outgrow one
  page of the cloud's reads (DynamoDB's 1 MB); ``delete`` says whether there was one.
- a record of the largest value (MAX_SECRET_BYTES, sealed) is stored whole (on Table storage: more
  than one property's 64 KiB).
- fields of a later release, in the record and in its sealed value, are kept through put and get.
- the store's table is the one the stack's names give (``secrets_table``: AWS ``PREFIX-secrets``
  in DynamoDB, Azure ``PREFIXsecrets`` in Table storage, local ``secrets`` in state.db), made by
  the test fixture's provisioning; the raw read below scans it whole: it holds the sealed value,
  never the value's bytes (nor their base64).
- ``opener.open(sealer.seal(value, ctx), ctx) == value``; the opener raises SecretUnavailable
  (never an SDK error) for a sealed value opened under another context (scope or name), one whose
  ciphertext, nonce or wrapped key was altered, and one sealed under another stack's key (here a
  key file's: on the clouds, a wrapped key that is no KMS ciphertext nor Key Vault wrapping).
"""

import base64
import json
import os
import sqlite3
from pathlib import Path

import pytest

from runplane.adapters.local.db import DB_FILE
from runplane.adapters.local.keyfile import KeyFileSealer
from runplane.bootstrap import aws_clients, aws_names, azure_clients, azure_names
from runplane.domain.secrets import (
    MAX_SECRET_BYTES,
    Sealed,
    SecretRecord,
    SecretUnavailable,
    context,
    group_scope,
    user_scope,
)
from runplane.domain.wire import stored, written
from tests.integration.contracts.conftest import _STACKS

STACKS = {**_STACKS, "aws-dynalite": "aws_dynalite_stack"}
"""Every stack of the other contract suites; AWS on dynalite too, which pages reads at 1 MB as DynamoDB does."""


@pytest.fixture(params=list(STACKS))
def any_stack(request):
    return request.getfixturevalue(STACKS[request.param])


def sealed_blob(size=24):
    """A sealed-looking value (the store never opens what it keeps)."""
    return Sealed(
        key_id="file:0123456789abcdef",
        wrapped_key=base64.b64encode(os.urandom(60)).decode(),
        nonce=base64.b64encode(os.urandom(12)).decode(),
        ciphertext=base64.b64encode(os.urandom(size + 16)).decode(),
    )


def record(scope, name, sealed=None, at=10.0, size=24):
    return SecretRecord(
        scope=scope, name=name, sealed=sealed or sealed_blob(size), updated_at=at, updated_by="alice", size=size
    )


def raw_items(stack):
    """Every item of the stack's secrets table as the cloud holds it, as text."""
    settings = stack.settings
    if settings.cloud == "local":
        connection = sqlite3.connect(f"{(Path(settings.state_dir) / DB_FILE).as_uri()}?mode=ro", uri=True)
        try:
            return repr(connection.execute("SELECT * FROM secrets").fetchall())
        finally:
            connection.close()
    if settings.cloud == "azure":
        table = azure_clients(settings).tables.get_table_client(azure_names(settings).secrets_table)
        return repr([dict(entity) for entity in table.list_entities()])
    client = aws_clients(settings)["dynamodb"]
    return repr(client.get_paginator("scan").paginate(TableName=aws_names(settings).secrets_table).build_full_result())


def test_put_get_replace_and_delete(any_stack):
    secrets = any_stack.secrets
    assert secrets.get(user_scope("alice"), "wandb") is None
    first = record(user_scope("alice"), "wandb")
    assert secrets.put(first) == first
    assert secrets.get(user_scope("alice"), "wandb") == first
    second = record(user_scope("alice"), "wandb", at=20.0, size=40)
    secrets.put(second)
    assert secrets.get(user_scope("alice"), "wandb") == second
    assert secrets.get(user_scope("bob"), "wandb") is None
    assert secrets.get(group_scope("alice"), "wandb") is None
    assert secrets.delete(user_scope("alice"), "wandb") is True
    assert secrets.get(user_scope("alice"), "wandb") is None
    assert secrets.delete(user_scope("alice"), "wandb") is False
    assert secrets.delete(user_scope("nobody"), "never") is False


def test_list_is_by_name_within_one_scope(any_stack):
    secrets = any_stack.secrets
    names = ["hf", "a.b", "a-1", "a_2", "0x", "b"]
    for name in names:
        secrets.put(record(user_scope("alice"), name))
    secrets.put(record(user_scope("al"), "hf"))
    secrets.put(record(user_scope("alice2"), "zz"))
    secrets.put(record(group_scope("alice"), "shared"))
    assert [r.name for r in secrets.list(user_scope("alice"))] == sorted(names)
    assert all(r.scope == user_scope("alice") for r in secrets.list(user_scope("alice")))
    assert [r.name for r in secrets.list(user_scope("alice"), limit=2)] == sorted(names)[:2]
    assert [r.name for r in secrets.list(user_scope("al"))] == ["hf"]
    assert [r.name for r in secrets.list(group_scope("alice"))] == ["shared"]
    assert secrets.list(user_scope("carol")) == []


def test_the_largest_values_are_kept_whole_and_listed_past_a_page(any_stack):
    secrets = any_stack.secrets
    big = [record(user_scope("alice"), f"key-{i:02d}", size=MAX_SECRET_BYTES) for i in range(26)]  # > 1 MB
    for each in big:
        secrets.put(each)
    assert secrets.get(user_scope("alice"), "key-07") == big[7]
    assert secrets.list(user_scope("alice")) == big


def test_fields_of_a_later_release_are_kept(any_stack):
    data = written(record(group_scope("ml"), "hf-token"))
    data["rotates_at"] = 99.0
    data["sealed"]["algorithm"] = "aes-256-gcm"
    later = stored(SecretRecord, data)
    any_stack.secrets.put(later)
    got = any_stack.secrets.get(group_scope("ml"), "hf-token")
    assert written(got) == data
    assert written(any_stack.secrets.list(group_scope("ml"))[0]) == data


def test_a_sealed_value_opens_for_its_own_scope_and_name_only(any_stack):
    value = "wandb-" + os.urandom(8).hex()
    ctx = context(user_scope("alice"), "wandb")
    sealed = any_stack.sealer.seal(value.encode(), ctx)
    assert value not in sealed.model_dump_json()
    assert any_stack.opener.open(sealed, ctx) == value.encode()
    for other in (
        context(user_scope("bob"), "wandb"),
        context(user_scope("alice"), "hf"),
        context("group:alice", "wandb"),
    ):
        with pytest.raises(SecretUnavailable):
            any_stack.opener.open(sealed, other)
    again = any_stack.sealer.seal(value.encode(), ctx)
    assert again.ciphertext != sealed.ciphertext and again.wrapped_key != sealed.wrapped_key  # a data key each


@pytest.mark.parametrize("part", ["ciphertext", "nonce", "wrapped_key"])
def test_an_altered_sealed_value_is_refused(any_stack, part):
    ctx = context(group_scope("ml"), "registry")
    sealed = any_stack.sealer.seal(b'{"username": "u", "password": "p4ssw0rd"}', ctx)
    data = bytearray(base64.b64decode(getattr(sealed, part)))
    data[len(data) // 2] ^= 0x01
    altered = sealed.model_copy(update={part: base64.b64encode(bytes(data)).decode()})
    with pytest.raises(SecretUnavailable):
        any_stack.opener.open(altered, ctx)
    with pytest.raises(SecretUnavailable):
        any_stack.opener.open(sealed.model_copy(update={part: "not base64!"}), ctx)
    assert any_stack.opener.open(sealed, ctx) == b'{"username": "u", "password": "p4ssw0rd"}'


def test_a_value_sealed_under_another_stacks_key_is_refused(any_stack, tmp_path):
    ctx = context(user_scope("alice"), "wandb")
    foreign = KeyFileSealer(tmp_path / "elsewhere" / "secrets.key").seal(b"from another any_stack", ctx)
    with pytest.raises(SecretUnavailable):
        any_stack.opener.open(foreign, ctx)
    mine = any_stack.sealer.seal(b"from this any_stack", ctx)
    # this any_stack's key id, another key's wrapping: refused too
    with pytest.raises(SecretUnavailable):
        any_stack.opener.open(foreign.model_copy(update={"key_id": mine.key_id}), ctx)


def test_the_stored_item_holds_no_value(any_stack):
    value = ("hf_" + os.urandom(12).hex()).encode()
    ctx = context(user_scope("alice"), "hf")
    sealed = any_stack.sealer.seal(value, ctx)
    any_stack.secrets.put(
        SecretRecord(
            scope=user_scope("alice"), name="hf", sealed=sealed, updated_at=1.0, updated_by="alice", size=len(value)
        )
    )
    raw = raw_items(any_stack)
    assert sealed.ciphertext in raw  # the raw read did read the item
    for form in (value, base64.b64encode(value), value.hex().encode()):
        assert form.decode() not in raw
    assert json.loads(any_stack.secrets.get(user_scope("alice"), "hf").sealed.model_dump_json()) == sealed.model_dump()
    assert any_stack.opener.open(any_stack.secrets.get(user_scope("alice"), "hf").sealed, ctx) == value
