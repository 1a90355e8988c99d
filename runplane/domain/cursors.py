"""Listing cursors: the base64url JSON a page hands out in ``next_cursor`` and takes back.

Whoever reads one checks its shape; this only turns text into a value, and whatever the text (a
crafted one of nested brackets deep enough to exhaust the parser's recursion included), it raises
nothing but ``ValueError``, which the reader turns into a 4xx.
"""

from __future__ import annotations

import base64
import json
from typing import Any


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
