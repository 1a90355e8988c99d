"""DynamoDB API tokens, users' records and the stack's own secret."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.dynamodb import scan, translate
from runplane.adapters.records import record_or_none, written_json
from runplane.domain.errors import BackendError
from runplane.domain.tenancy import ApiToken, UserRecord


class DynamoTokenStore:
    """API tokens, stored under the SHA-256 of their secret; the document as JSON. The stack's own
    secret is one more item, under a key no hash can take."""

    SECRET_KEY = "stack-secret"  # noqa: S105 - a key name, not a secret
    USER_PREFIX = "user:"
    """Users' records (``UserRecord``) are items under ``user:<name>``: no SHA-256 is one."""

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    def lookup(self, token_hash: str) -> ApiToken | None:
        if token_hash == self.SECRET_KEY:
            return None
        try:
            resp = self.client.get_item(TableName=self.table, Key={"token_hash": {"S": token_hash}})
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read token") from e
        return _token(resp.get("Item"))

    def put(self, token_hash: str, token: ApiToken) -> None:
        item = {"token_hash": {"S": token_hash}, "id": {"S": token.id}, "doc": {"S": written_json(token)}}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "store token") from e

    def _scan(self, **kwargs: Any) -> list[dict[str, Any]]:
        # strongly consistent: a release refuses a run on what this read says (``authority.Owners``),
        # and a revoke must find a token made a moment ago
        return scan(self.client, self.table, "list tokens", **kwargs)

    def list(self) -> list[ApiToken]:
        tokens = [_token(item) for item in self._scan() if "doc" in item]
        return sorted((t for t in tokens if t is not None), key=lambda t: (t.created_at, t.id))

    def delete(self, token_id: str) -> bool:
        found = self._scan(
            FilterExpression="#id = :id",
            ExpressionAttributeNames={"#id": "id"},
            ExpressionAttributeValues={":id": {"S": token_id}},
        )
        for item in found:
            try:
                self.client.delete_item(TableName=self.table, Key={"token_hash": item["token_hash"]})
            except (ClientError, BotoCoreError) as e:
                raise translate(e, "delete token") from e
        return bool(found)

    def user(self, name: str) -> UserRecord | None:
        key = {"token_hash": {"S": self.USER_PREFIX + name}}
        try:
            item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read user") from e
        return UserRecord.read(item.get("user_doc", {}).get("S") if item else None)

    def put_user(self, record: UserRecord) -> None:
        # "user_doc", not "doc": a release that lists tokens reads no token in it
        item = {"token_hash": {"S": self.USER_PREFIX + record.user}, "user_doc": {"S": written_json(record)}}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "store user") from e

    def secret(self) -> bytes:
        key = {"token_hash": {"S": self.SECRET_KEY}}
        for _ in range(2):
            try:
                item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
                if item:
                    return base64.b64decode(item["secret"]["S"])
                self.client.put_item(
                    TableName=self.table,
                    Item={**key, "secret": {"S": base64.b64encode(secrets.token_bytes(32)).decode()}},
                    ConditionExpression="attribute_not_exists(token_hash)",
                )
            except ClientError as e:
                if error_code(e) != "ConditionalCheckFailedException":  # lost the race: read the winner's
                    raise translate(e, "read the stack secret") from e
            except BotoCoreError as e:
                raise translate(e, "read the stack secret") from e
        raise BackendError("the stack secret could not be read or made; retry")


def _token(item: Mapping[str, Any] | None) -> ApiToken | None:
    """The token of an item; None for none, or for an item that does not hold a valid token."""
    return record_or_none(ApiToken, item["doc"]["S"] if item and "doc" in item else None)
