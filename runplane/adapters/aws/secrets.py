"""Secrets on AWS: sealed records in a DynamoDB table (key: scope, name), their data keys made and
wrapped by a KMS key under an encryption context naming the secret's scope and name.

The API's role may only ``kms:GenerateDataKey`` (``KmsSealer``); the workers' policy alone may
``kms:Decrypt`` (``KmsOpener``), each on the stack's key and only with that context
(template.yaml). KMS refuses a data key whose context is not the one it was made with, so a
sealed value copied to another scope or name opens nowhere.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.dynamodb import translate
from runplane.adapters.envelope import open_with, seal_with, unb64
from runplane.adapters.records import record_or_none, written_json
from runplane.domain.errors import BackendError, Misconfigured
from runplane.domain.secrets import MAX_SECRETS_PER_SCOPE, Sealed, SecretRecord, SecretUnavailable

log = logging.getLogger(__name__)

__all__ = ["DynamoSecretStore", "KmsOpener", "KmsSealer"]

SCOPE = "scope"
NAME = "name"
"""The table's keys: the scope (HASH) and the secret's name (RANGE)."""

# What KMS answers when it will not use the key for this caller or this value: none of them is
# cured by asking again. Any other code (throttling, KMSInternalException) may be.
REFUSALS = frozenset(
    {
        "AccessDeniedException",
        "DisabledException",
        "IncorrectKeyException",
        "InvalidCiphertextException",
        "InvalidGrantTokenException",
        "InvalidKeyUsageException",
        "KMSInvalidStateException",
        "KeyUnavailableException",
        "NotFoundException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
        "ValidationException",
    }
)


class DynamoSecretStore:
    """Sealed secrets, one item each: ``scope``, ``name`` and the record as JSON in ``doc``.
    Reads are strongly consistent (a secret just set is what the next run opens; one just removed
    is gone for it). A stored item that is not a readable record reads as no secret."""

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    @staticmethod
    def _key(scope: str, name: str) -> dict[str, Any]:
        return {SCOPE: {"S": scope}, NAME: {"S": name}}

    def put(self, record: SecretRecord) -> SecretRecord:
        item = {**self._key(record.scope, record.name), "doc": {"S": written_json(record)}}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "store secret") from e
        return record

    def get(self, scope: str, name: str) -> SecretRecord | None:
        try:
            item = self.client.get_item(TableName=self.table, Key=self._key(scope, name), ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read secret") from e
        return _record(item.get("Item"), scope, name)

    def list(self, scope: str, limit: int = MAX_SECRETS_PER_SCOPE) -> builtins.list[SecretRecord]:
        """The scope's secrets by name, at most ``limit``: one Query of the scope's partition
        (DynamoDB keeps it sorted by name), page by page until ``limit`` records are read."""
        found: builtins.list[SecretRecord] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#s = :s",
            "ExpressionAttributeNames": {"#s": SCOPE},
            "ExpressionAttributeValues": {":s": {"S": scope}},
            "ConsistentRead": True,
        }
        while len(found) < limit:
            try:
                page = self.client.query(**kwargs, Limit=limit - len(found))
            except (ClientError, BotoCoreError) as e:
                raise translate(e, "list secrets") from e
            for item in page.get("Items", []):
                record = _record(item, scope, item.get(NAME, {}).get("S", ""))
                if record is not None:
                    found.append(record)
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return found[:limit]

    def delete(self, scope: str, name: str) -> bool:
        try:
            old = self.client.delete_item(TableName=self.table, Key=self._key(scope, name), ReturnValues="ALL_OLD")
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "delete secret") from e
        return bool(old.get("Attributes"))


def _record(item: Mapping[str, Any] | None, scope: str, name: str) -> SecretRecord | None:
    """The record an item holds; None for none, or for one that is not a record of that scope and
    name (a record is opened with the context of where it is stored, so a moved one would not open)."""
    found = record_or_none(SecretRecord, item["doc"].get("S") if item and "doc" in item else None)
    if found is None or (found.scope, found.name) != (scope, name):
        return None
    return found


def _kms_code(e: Exception) -> str:
    return error_code(e) if isinstance(e, ClientError) else e.__class__.__name__


class KmsSealer:
    """Seals values with data keys from ``GenerateDataKey`` on ``key_id`` (a key id, ARN, alias
    name or alias ARN), bound to the context. ``client``: a KMS client, or anything that makes one
    on first use (``clients.LazyClient``): the API pays for KMS only when a secret is set."""

    def __init__(self, key_id: str, client: Any) -> None:
        self.key_id = key_id
        self.client = client

    def seal(self, value: bytes, context: Mapping[str, str]) -> Sealed:
        """Raises Misconfigured when KMS refuses (no such key, disabled, not this role's to use),
        BackendError when it fails in a way that may pass."""
        try:
            made = self.client.generate_data_key(KeyId=self.key_id, KeySpec="AES_256", EncryptionContext=dict(context))
        except (ClientError, BotoCoreError) as e:
            code = _kms_code(e)
            log.warning("seal a secret with %s: KMS answered %s: %s", self.key_id, code, e)
            if code in REFUSALS:
                raise Misconfigured(
                    f"the stack's secrets key cannot seal values (KMS: {code}): check RUNPLANE_SECRETS_KEY "
                    "and that the API's role may kms:GenerateDataKey on it"
                ) from None
            raise BackendError(f"seal a secret failed: {code}") from None
        return seal_with(made["Plaintext"], made["CiphertextBlob"], str(made["KeyId"]), value, context)


class KmsOpener:
    """Opens sealed values: ``Decrypt`` of the data key with the value's context, on ``key_id``
    only (a record naming another key does not open). ``client`` as ``KmsSealer``'s."""

    def __init__(self, key_id: str, client: Any) -> None:
        self.key_id = key_id
        self.client = client

    def open(self, sealed: Sealed, context: Mapping[str, str]) -> bytes:
        """Raises SecretUnavailable when KMS refuses (a context the data key was not made for, a
        key this worker may not use, an altered value), BackendError when it fails in a way that
        may pass."""
        wrapped = unb64(sealed.wrapped_key, "data key")
        try:
            opened = self.client.decrypt(CiphertextBlob=wrapped, EncryptionContext=dict(context), KeyId=self.key_id)
        except (ClientError, BotoCoreError) as e:
            code = _kms_code(e)
            log.warning("open a secret with %s: KMS answered %s", self.key_id, code)
            if code in REFUSALS:
                raise SecretUnavailable(f"KMS refused its data key ({code})") from None
            raise BackendError(f"open a secret failed: {code}") from None
        return open_with(opened["Plaintext"], sealed, context)
