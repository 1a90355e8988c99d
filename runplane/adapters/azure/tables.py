"""What the Table storage stores share: keys made safe for Table storage, records as JSON over
properties, our errors for Table storage's, reads of one entity, and the cursors of listings that
resume after a RowKey; and the one conditional write of records guarded by their version.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, TableErrorCode, UpdateMode
from pydantic import BaseModel

from runplane.adapters.azure.errors import error_code
from runplane.adapters.records import jsonable, record
from runplane.domain.cursors import decode_cursor
from runplane.domain.errors import BackendError, BadRequest, ConditionFailed, PayloadTooLarge, RunplaneError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


CHUNK_CHARS = 32_000


MAX_CHUNKS = 15


MAX_RUN_CHARS = CHUNK_CHARS * MAX_CHUNKS
"""The largest run, as compact ASCII JSON, that one entity holds (about 960 KB as UTF-16)."""


_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-@+=")


_NEWEST = 10**18


_TOO_LARGE = (
    TableErrorCode.PROPERTY_VALUE_TOO_LARGE,
    TableErrorCode.ENTITY_TOO_LARGE,
    TableErrorCode.REQUEST_BODY_TOO_LARGE,
)


def key(value: str) -> str:
    """``value`` made safe for a PartitionKey or RowKey (which refuse / \\ # ? and control
    characters): anything but letters, digits and ``._-@+=`` becomes ``~XX`` per UTF-8 byte, so
    ':' stays free to separate the parts of a key."""
    return "".join(c if c in _SAFE else "".join(f"~{b:02X}" for b in c.encode()) for c in value)


def newest_first(created_at: float) -> str:
    """A sort key that orders later creation times first."""
    return f"{max(0, _NEWEST - round(created_at * 1_000_000)):019d}"


def pack(data: Any, what: str) -> dict[str, Any]:
    """``data`` as compact ASCII JSON over properties ``d0``.. ``dN``; raises PayloadTooLarge."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    if len(text) > MAX_RUN_CHARS:
        raise PayloadTooLarge(f"{what} is {len(text)} bytes as JSON; Table storage holds at most {MAX_RUN_CHARS}")
    chunks = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
    return {"n": len(chunks), **{f"d{i}": chunk for i, chunk in enumerate(chunks)}}


def unpack(entity: Mapping[str, Any]) -> Any:
    return json.loads("".join(entity[f"d{i}"] for i in range(int(entity["n"]))))


def packed(record: BaseModel, what: str) -> dict[str, Any]:
    """``record`` as stored (``written``), packed over properties; raises PayloadTooLarge."""
    return pack(jsonable(record), what)


def document(model: type[M], entity: Mapping[str, Any]) -> M:
    """The record an entity holds packed over its properties (``pack``). Raises KeyError when it
    holds none, ValueError when it is not a ``model``."""
    return record(model, unpack(entity))


def version_of(entity: Mapping[str, Any]) -> int | None:
    """The ``version`` property of an entity; None when it has no readable one."""
    version = entity.get("version")
    return None if isinstance(version, bool) or not isinstance(version, int) else version


def failure(e: AzureError, what: str) -> RunplaneError:
    """Our error for what Table storage answered: its code decides, and its own words (which may
    name accounts, tables and keys) are logged here, never carried to an answer."""
    code = error_code(e)
    log.warning("%s: Table storage answered %s: %s", what, code or e.__class__.__name__, e.message)
    if code in _TOO_LARGE:
        return PayloadTooLarge(f"{what}: the record is too large for Table storage")
    if code == TableErrorCode.TABLE_NOT_FOUND:
        return BackendError(f"{what} failed: the table does not exist; was the stack provisioned?")
    return BackendError(f"{what} failed: {code or e.__class__.__name__}")


def get_entity(table: TableClient, partition: str, row: str, what: str) -> Any | None:
    """One entity, or None when it does not exist; a missing table or any other failure raises
    (the table's absence is a broken deployment, not a missing entity)."""
    try:
        return table.get_entity(partition, row)
    except ResourceNotFoundError as e:
        if error_code(e) == TableErrorCode.TABLE_NOT_FOUND:
            raise failure(e, what) from e
        return None
    except AzureError as e:
        raise failure(e, what) from e


def select(table: TableClient, query: str, parameters: dict[str, str], what: str) -> list[Any]:
    """Every entity ``query`` (with ``parameters``) selects, read to the end."""
    try:
        return list(table.query_entities(query, parameters=parameters))
    except AzureError as e:
        raise failure(e, what) from e


def write_versioned(table: TableClient, entity: dict[str, Any], etag: str, changed: ConditionFailed, what: str) -> None:
    """Create ``entity`` (no ``etag``: none was read) or replace the one read with ``etag``;
    raises ``changed`` when it was written (or removed) since that read."""
    try:
        if not etag:
            table.create_entity(entity)
        else:
            table.update_entity(
                entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
            )
    except (ResourceExistsError, ResourceModifiedError) as e:
        raise changed from e  # written since our read: every write bumps the version, so ours is stale
    except ResourceNotFoundError as e:
        if error_code(e) == TableErrorCode.TABLE_NOT_FOUND:
            raise failure(e, what) from e
        raise changed from e  # removed since our read
    except AzureError as e:
        raise failure(e, what) from e


def row_cursor(row_key: str, owner: str | None = None) -> str:
    data = {"after": row_key} if owner is None else {"after": row_key, "owner": owner}
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


_ROW_KEY = re.compile(r"^[A-Za-z0-9._@+=~:-]{1,512}$")


def row_after(cursor: str, prefix: str, owner: str | None = None) -> str:
    """The row key a cursor holds, checked to be a key of this very listing (an owner's listing
    names its owner): anything else is a BadRequest, never a query Table storage would refuse."""
    try:
        data = decode_cursor(cursor)
        after = data["after"]
        if (
            not isinstance(after, str)
            or not after.startswith(prefix)
            or not _ROW_KEY.fullmatch(after)
            or data.get("owner") != owner
            or set(data) - {"after", "owner"}
        ):
            raise TypeError
    except (ValueError, TypeError, KeyError) as e:
        raise BadRequest("cursor is not valid; pass the next_cursor of a previous page") from e
    return after


def unkey(escaped: str) -> str:
    """What ``key`` escaped, read back."""
    return re.sub(r"(?:~[0-9A-F]{2})+", lambda m: bytes.fromhex(m.group().replace("~", "")).decode(), escaped)
