"""Secrets on AWS, on the moto server: what the store contract suite (contracts/test_secrets.py)
cannot say of KMS. The data key itself is bound to the secret's scope and name (KMS checks the
encryption context, moto as AWS does), a refusal reads as ``SecretUnavailable`` or
``Misconfigured`` with no botocore text, the API builds no KMS client until it seals, and
provision() makes the key as template.yaml declares it."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from botocore.exceptions import ClientError

from runplane.adapters.aws import resources
from runplane.adapters.aws.provision import AwsNames, provision
from runplane.adapters.aws.secrets import DynamoSecretStore, KmsOpener, KmsSealer
from runplane.bootstrap import Stack, aws_clients, aws_names, build_stack
from runplane.domain.errors import Misconfigured
from runplane.domain.secrets import SecretRecord, SecretUnavailable, context
from runplane.settings import StackSettings

ALICE = context("user:alice", "wandb")


def test_kms_binds_the_data_key_to_the_context(aws_stack: Stack) -> None:
    """The wrapped data key of alice's secret does not unwrap for another scope or name: KMS itself
    refuses (InvalidCiphertextException), before AES-GCM's associated data is ever checked."""
    assert isinstance(aws_stack.sealer, KmsSealer) and isinstance(aws_stack.opener, KmsOpener)
    sealed = aws_stack.sealer.seal(b"wandb-key-1234", ALICE)
    assert aws_stack.opener.open(sealed, ALICE) == b"wandb-key-1234"
    kms = aws_stack.opener.client
    wrapped = base64.b64decode(sealed.wrapped_key)
    assert kms.decrypt(CiphertextBlob=wrapped, EncryptionContext=ALICE)["Plaintext"]
    for other in (context("user:bob", "wandb"), context("user:alice", "hf"), {}):
        with pytest.raises(ClientError) as refused:
            kms.decrypt(CiphertextBlob=wrapped, EncryptionContext=other)
        assert refused.value.response["Error"]["Code"] == "InvalidCiphertextException"
        with pytest.raises(SecretUnavailable, match="InvalidCiphertextException") as e:
            aws_stack.opener.open(sealed, other)
        assert "wandb-key" not in str(e.value) and "botocore" not in str(e.value)


def test_a_value_sealed_under_another_key_does_not_open(aws_stack: Stack, moto_endpoint: str) -> None:
    """The opener decrypts with the stack's key only: a record whose data key another KMS key
    wrapped (another stack's, one an attacker controls) is refused."""
    other = StackSettings(prefix=f"o{uuid.uuid4().hex[:8]}", aws_endpoint_url=moto_endpoint)
    clients = aws_clients(other)
    provision(aws_names(other), [], clients["dynamodb"], clients["sqs"], clients["s3"], kms=clients["kms"])
    foreign = KmsSealer(aws_names(other).secrets_key, clients["kms"]).seal(b"value", ALICE)
    assert aws_stack.opener is not None
    with pytest.raises(SecretUnavailable, match="KMS refused"):
        aws_stack.opener.open(foreign, ALICE)


def test_sealing_with_a_missing_key_is_misconfigured(aws_stack: Stack) -> None:
    assert isinstance(aws_stack.sealer, KmsSealer)
    sealer = KmsSealer("alias/no-such-key", aws_stack.sealer.client)
    with pytest.raises(Misconfigured, match="NotFoundException") as e:
        sealer.seal(b"value", ALICE)
    assert "RUNPLANE_SECRETS_KEY" in e.value.message and "alias/no-such-key" not in e.value.message


def test_the_stack_makes_no_kms_client_until_a_secret_is_sealed(moto_endpoint: str) -> None:
    settings = StackSettings(prefix=f"l{uuid.uuid4().hex[:8]}", aws_endpoint_url=moto_endpoint)
    clients = aws_clients(settings)
    stack = build_stack(settings, clients)
    _ = stack.ports  # what a handler builds
    assert not clients["kms"].built
    provision(aws_names(settings), [], clients["dynamodb"], clients["sqs"], clients["s3"], kms=clients["kms"])
    assert stack.sealer is not None
    stack.sealer.seal(b"value", ALICE)
    assert clients["kms"].built


def test_provision_makes_the_key_once_as_resources_says(moto_endpoint: str) -> None:
    settings = StackSettings(prefix=f"k{uuid.uuid4().hex[:8]}", aws_endpoint_url=moto_endpoint)
    clients = aws_clients(settings)
    names = aws_names(settings)
    assert names.secrets_key == f"alias/{settings.prefix}-secrets"
    kms = clients["kms"]
    for _ in range(2):
        provision(names, [], clients["dynamodb"], clients["sqs"], clients["s3"], kms=kms)
    (alias,) = [a for a in kms.list_aliases()["Aliases"] if a["AliasName"] == names.secrets_key]
    key = kms.describe_key(KeyId=alias["TargetKeyId"])["KeyMetadata"]
    assert (key["KeySpec"], key["KeyUsage"]) == (resources.SECRETS_KEY_SPEC, resources.SECRETS_KEY_USAGE)
    assert kms.get_key_rotation_status(KeyId=key["KeyId"])["KeyRotationEnabled"] is resources.SECRETS_KEY_ROTATION
    policy = json.loads(kms.get_key_policy(KeyId=key["KeyId"], PolicyName="default")["Policy"])
    assert policy == resources.secrets_key_policy("aws", key["Arn"].split(":")[4])
    # a key the operator names by id is theirs: provision makes none
    given = AwsNames(prefix=f"g{uuid.uuid4().hex[:8]}", secrets_key=key["Arn"])
    before = len(kms.list_keys()["Keys"])
    provision(given, [], clients["dynamodb"], clients["sqs"], clients["s3"], kms=kms)
    assert len(kms.list_keys()["Keys"]) == before


def _record(scope: str, name: str, aws_stack: Stack) -> SecretRecord:
    assert aws_stack.sealer is not None
    sealed = aws_stack.sealer.seal(name.encode(), context(scope, name))
    return SecretRecord(scope=scope, name=name, sealed=sealed, updated_at=1.0, updated_by="alice", size=len(name))


def test_items_are_read_tolerantly(aws_stack: Stack) -> None:
    """A record another release wrote (an unknown field) reads; an item that holds no record, or
    one of another scope or name (copied there), reads as no secret, and lists leave it out."""
    store = aws_stack.secrets
    assert isinstance(store, DynamoSecretStore)
    record = _record("user:alice", "a", aws_stack)
    doc = json.loads(record.model_dump_json()) | {"labels": {"team": "nlp"}}
    items = {
        "a": json.dumps(doc),
        "b": "not json",
        "c": _record("user:bob", "c", aws_stack).model_dump_json(),
    }
    for name, text in items.items():
        item = {"scope": {"S": "user:alice"}, "name": {"S": name}, "doc": {"S": text}}
        store.client.put_item(TableName=store.table, Item=item)
    store.client.put_item(TableName=store.table, Item={"scope": {"S": "user:alice"}, "name": {"S": "d"}})
    got = store.get("user:alice", "a")
    assert got is not None and got.sealed == record.sealed
    assert [store.get("user:alice", n) for n in "bcd"] == [None, None, None]
    assert [r.name for r in store.list("user:alice")] == ["a"]


def test_list_reads_one_scope_in_name_order_up_to_its_limit(aws_stack: Stack) -> None:
    store = aws_stack.secrets
    assert isinstance(store, DynamoSecretStore)
    for name in ("m", "b", "z", "a"):
        store.put(_record("group:vision", name, aws_stack))
    store.put(_record("group:visionary", "c", aws_stack))
    assert [r.name for r in store.list("group:vision")] == ["a", "b", "m", "z"]
    assert [r.name for r in store.list("group:vision", limit=3)] == ["a", "b", "m"]
    assert store.delete("group:vision", "m") and not store.delete("group:vision", "m")
    assert [r.name for r in store.list("group:vision")] == ["a", "b", "z"]
