"""Listing cursors: the base64url JSON a page hands out in ``next_cursor`` and takes back.

Whoever reads one checks its shape; this only turns text into a value, and whatever the text (a
crafted one of nested brackets deep enough to exhaust the parser's recursion included), it raises
nothing but ``ValueError``, which the reader turns into a 4xx.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from runplane.domain.common import RUN_ID_PATTERN
from runplane.domain.errors import BadRequest

_CURSOR_ID = re.compile(RUN_ID_PATTERN)


def encode_cursor(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


def decode_cursor(cursor: str, most: int = 2048) -> Any:
    """The JSON value ``cursor`` holds. Raises ValueError for a cursor over ``most`` characters,
    one that is not base64 of JSON (``binascii.Error``, ``UnicodeDecodeError`` and
    ``JSONDecodeError`` are all ValueErrors), and one nested too deeply to parse."""
    if len(cursor) > most:
        raise ValueError(f"cursor is over {most} characters")
    try:
        return json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except RecursionError as e:
        raise ValueError("cursor is nested too deeply") from e


def listing_cursor(key_attr: str, key_value: str, created_at: float, item_id: str) -> str:
    """The cursor of a newest-first listing of ``key_attr`` ``key_value`` that goes on after the
    record ``item_id`` made at ``created_at``."""
    return encode_cursor({"id": item_id, key_attr: key_value, "created_at": created_at})


def listing_position(cursor: str, key_attr: str, key_value: str) -> tuple[float, str]:
    """The ``(created_at, id)`` a ``listing_cursor`` continues after, checked to be one of this very
    listing (``key_attr`` naming the same ``key_value``): anything else is a BadRequest, never a
    query a store would refuse."""
    try:
        data = decode_cursor(cursor)  # NaN and Infinity fail the range check
        if (
            not isinstance(data, dict)
            or set(data) != {"id", key_attr, "created_at"}
            or not isinstance(data["id"], str)
            or not _CURSOR_ID.fullmatch(data["id"])
            or data[key_attr] != key_value
            or isinstance(data["created_at"], bool)
            or not isinstance(data["created_at"], int | float)
            or not 0 <= data["created_at"] < 1e11
        ):
            raise TypeError
    except (ValueError, TypeError) as e:
        raise BadRequest("cursor is not valid; pass the next_cursor of a previous page") from e
    return data["created_at"], data["id"]
