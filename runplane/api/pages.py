"""List pages under Lambda's response limit: a page holds the items that fit ``MAX_PAGE_BYTES`` as
Lambda's response carries them, and a page cut short goes on after its last item."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel

from runplane.api.routing import Reply
from runplane.domain.wire import shown_json

MAX_PAGE_BYTES = 5 * 1024 * 1024
"""The largest list page as it travels in Lambda's response (its body is a JSON string there, so
quotes and backslashes count twice): under Lambda's 6 MB limit."""

RESERVE = 1024
"""Bytes of a page kept for what is not its items (its envelope, its cursor)."""
View = TypeVar("View", bound=BaseModel)


def within_page(
    views: Sequence[View], cursor: str | None, resume: Callable[[int], str]
) -> tuple[list[View], str | None]:
    """The views that fit one page and the page's ``next_cursor``: ``cursor`` when all fit, else
    ``resume(n)``, the cursor after the first ``n`` (those kept)."""
    size = RESERVE
    for n, view in enumerate(views):
        wire = len(json.dumps(shown_json(view)))
        if n and size + wire > MAX_PAGE_BYTES:
            return list(views[:n]), resume(n)
        size += wire
    return list(views), cursor


def page_reply(
    make: Callable[[list[View], str | None], BaseModel],
    views: Sequence[View],
    cursor: str | None,
    resume: Callable[[int], str],
) -> Reply:
    """The page ``make`` builds of the views that fit (``within_page``). A page whose every view
    fits, the most common, is serialised once, here, and sent as it is."""
    whole = make(list(views), cursor)
    text = shown_json(whole)
    if len(json.dumps(text)) + RESERVE <= MAX_PAGE_BYTES:
        return Reply(whole, text=text)
    return Reply(make(*within_page(views, cursor, resume)))
