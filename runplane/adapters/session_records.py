"""What the three session stores share: the slot a session id names, which changes a session
takes, and how a stored session reads when this release cannot read it."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from runplane.adapters.records import record_or_none
from runplane.domain.errors import NotFound
from runplane.domain.sessions import SESSION_ID_PATTERN, Session, run_of

log = logging.getLogger(__name__)

__all__ = ["FIXED_FIELDS", "check_session_changes", "readable", "session_slot"]

FIXED_FIELDS = frozenset({"id", "run_id", "slot", "attempt", "owner", "asked_by", "kind", "command", "created_at"})
"""A session's fields that never change once it is stored."""


def session_slot(session_id: str) -> tuple[str, int]:
    """The run id and slot ``session_id`` names; NotFound for text that is not a session id (no
    store is asked about a key made of what a caller typed)."""
    if not isinstance(session_id, str) or not re.fullmatch(SESSION_ID_PATTERN, session_id):
        raise NotFound(f"session {session_id!r} not found")
    return run_of(session_id)


def check_session_changes(changes: Mapping[str, Any]) -> None:
    """Raises ValueError for a change to a field a session does not have, or to one that never changes."""
    for field in changes:
        if field not in Session.model_fields or field in FIXED_FIELDS:
            raise ValueError(f"cannot update session field {field!r}")


def readable(data: Mapping[str, Any] | str | None, where: str) -> Session | None:
    """The session ``data`` holds (written by this release or another); None, logged, when it holds
    none this release can read (a kind or state added later): such a slot is neither listed nor
    taken over, and its session is not found."""
    found = record_or_none(Session, data)
    if found is None and data is not None:
        log.warning("the session in %s is not one this release reads", where)
    return found
