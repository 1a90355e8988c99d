"""What the DynamoDB stores share: items to and from JSON values, the runs and workers tables'
index names, our errors for DynamoDB's, the cursors of listings that resume at a start key, and the
one conditional put of records guarded by their version.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel

from runplane.adapters.aws.clients import error_code
from runplane.adapters.records import record
from runplane.domain.cursors import listing_position
from runplane.domain.errors import BackendError, BadRequest, ConditionFailed

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


_ser = TypeSerializer()


_de = TypeDeserializer()


BY_OWNER = "by_owner"


BY_QUEUE_STATE = "by_queue_state"


BY_RANK = "by_rank"


BY_PURGE = "by_purge"
"""The runs table's sparse index of finished runs by when the retention sweep must look at them:
``PURGE_QUEUE`` (the run's queue), ``PURGE_DUE`` (``runplane.domain.retention.purge_due``), both
present only while that time is not None."""

PURGE_QUEUE, PURGE_DUE = "pq", "pd"


BY_POOL = "by_pool"
"""The workers table's index: a pool's workers."""


def to_dynamo(value: Any) -> dict[str, Any]:
    return _ser.serialize(json.loads(json.dumps(value), parse_float=Decimal))  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _plain(_de.deserialize(v)) for k, v in item.items()}


def document(model: type[M], item: Mapping[str, Any], attribute: str = "doc") -> M:
    """The record an item holds as one JSON document, in ``attribute``. Raises KeyError when it
    holds none, ValueError when it is not a ``model``."""
    return record(model, item[attribute]["S"])


def fields(model: type[M], item: Mapping[str, Any], *storage: str) -> M:
    """The record an item holds one attribute a field, less the ``storage`` attributes (keys of
    indexes, TTL) that only the store reads."""
    data = from_item(item)
    for attribute in storage:
        data.pop(attribute, None)
    return record(model, data)


def scan(client: Any, table: str, what: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Every item of ``table`` (that ``kwargs``' filter keeps), read strongly consistent, page by page."""
    items: list[dict[str, Any]] = []
    try:
        for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True, **kwargs):
            items.extend(page.get("Items", []))
    except (ClientError, BotoCoreError) as e:
        raise translate(e, what) from e
    return items


def put_versioned(
    client: Any, table: str, item: dict[str, Any], version: int, changed: ConditionFailed, what: str
) -> None:
    """Put ``item`` (a record at ``version`` + 1, in its ``version`` attribute) if the stored
    version is ``version`` (0: none stored, or an item without one). Raises ``changed`` when it is
    not: another writer came first."""
    condition: dict[str, Any] = {"ExpressionAttributeNames": {"#v": "version"}}
    if version == 0:
        condition["ConditionExpression"] = "attribute_not_exists(#v)"
    else:
        condition["ConditionExpression"] = "#v = :v"
        condition["ExpressionAttributeValues"] = {":v": {"N": str(version)}}
    try:
        client.put_item(TableName=table, Item=item, **condition)
    except ClientError as e:
        if error_code(e) == "ConditionalCheckFailedException":
            raise changed from e
        raise translate(e, what) from e
    except BotoCoreError as e:
        raise translate(e, what) from e


def version_of(item: Mapping[str, Any] | None) -> int | None:
    """The ``version`` attribute of an item; None when there is no item, or no readable version."""
    try:
        return int(item["version"]["N"]) if item else None
    except (KeyError, ValueError, TypeError):
        return None


def translate(e: Exception, what: str) -> Exception:
    """Our error for what DynamoDB (or botocore) answered: its code decides, and its own words
    (which may name tables, keys and attributes) are logged here, never carried to an answer."""
    code = error_code(e) if isinstance(e, ClientError) else e.__class__.__name__
    log.warning("%s: DynamoDB answered %s: %s", what, code, e)
    if code == "ValidationException":
        return BadRequest(f"{what}: the store refused the request")
    return BackendError(f"{what} failed: {code}")


def key_cursor(key: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(from_item(key)).encode()).decode()


def start_key(cursor: str, key_attr: str, key_value: str) -> dict[str, Any]:
    """The start key a cursor holds, checked to be one of this very listing (same index, same
    partition): anything else is a BadRequest, never a query DynamoDB would refuse."""
    created_at, item_id = listing_position(cursor, key_attr, key_value)
    return {"id": to_dynamo(item_id), key_attr: to_dynamo(key_value), "created_at": to_dynamo(created_at)}
