"""What the stores of both clouds share: the one reader that turns what a store holds (an item's
attributes, an entity's document, a queue message) into a domain record, the one writer of what
they store, and how a record guarded by its version reads when what is stored there is not one.

Records are read and written here and nowhere else in the adapters, so how a record written by
another release reads (fields this one does not know: kept, and written back) is decided in one
place, ``runplane.domain.wire``, for every store of every cloud.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from runplane.domain.runs import Run
from runplane.domain.wire import stored, written, written_json

M = TypeVar("M", bound=BaseModel)

__all__ = ["check_changes", "jsonable", "record", "record_or_none", "subject_order", "versioned", "written_json"]


def record(model: type[M], data: Mapping[str, Any] | str | bytes) -> M:
    """``data`` (the record's fields, or their JSON text) read as a ``model`` that this release or
    another wrote. Raises ValueError (pydantic's ValidationError) when it is not one."""
    return stored(model, data)


def record_or_none(model: type[M], data: Mapping[str, Any] | str | bytes | None) -> M | None:
    """``data`` read as a ``model``; None for none, or for data that is not one."""
    if data is None:
        return None
    try:
        return record(model, data)
    except ValueError:
        return None


def versioned(fresh: M, version: int | None, data: Callable[[], Any], identity: Callable[[M], object]) -> M:
    """The record stored at ``version`` (None: nothing stored, or no readable version), read from
    what ``data`` returns. Written only while the stored version is the one its writer read, such a
    record reads as ``fresh`` when none is stored, and as ``fresh`` at the stored version when what
    is stored is not a readable record of the same ``identity`` at that version: the next write,
    made on that version, replaces it."""
    if version is None:
        return fresh
    try:
        found: M | None = record(type(fresh), data())
    except (ValueError, KeyError, TypeError):
        found = None
    if found is None or identity(found) != identity(fresh) or getattr(found, "version", None) != version:
        return fresh.model_copy(update={"version": version})
    return found


def jsonable(value: Any) -> Any:
    """A value to store (a record, a list of them, anything JSON holds) as JSON data."""
    if isinstance(value, BaseModel):
        return written(value)
    if isinstance(value, builtins.list):
        return [jsonable(v) for v in value]
    return value


FIXED_FIELDS = frozenset({"id", "owner", "queue", "created_at"})
"""A run's fields that never change once it is stored."""


def check_changes(changes: Mapping[str, Any]) -> None:
    """Raises ValueError for a change to a field a run does not have, or to one that never changes."""
    for field in changes:
        if field not in Run.model_fields or field in FIXED_FIELDS:
            raise ValueError(f"cannot update field {field!r}")


class _Subject(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str: ...


def subject_order(subject: _Subject) -> tuple[bool, str]:
    """The order quotas and usage records are listed in: users first, each kind by name."""
    return subject.kind != "user", subject.name
