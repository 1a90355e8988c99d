"""Records across releases: how stored records and queue messages are read and written.

A ``Record`` is a model that is stored or travels on a queue (a run and everything in it, a
worker, a pool record, a message, a sweep, a token, a quota, ...). Releases of the functions and of
the agents run side by side on one stack, so each reads what another release wrote:

- ``stored(Model, data)`` is the one reader of stored records and queue messages. A field this
  release does not know, at any depth, is kept on the record (pydantic's ``extra="allow"`` for that
  one validation), never an error; a field a record from an older release lacks takes its default.
- Read any other way (a user's request: a run's spec is also what users send), a Record is strict:
  an unknown field is an error naming it, and the API answers 422. Its JSON schema says
  ``additionalProperties: false``, as strict as the server.
- ``written(record)`` (``written_json``) is the one serializer of stored records and queue
  messages: the fields it kept that this release does not know are written back unchanged, so a
  record re-written whole by an older release loses nothing a newer one put there; and a field
  marked ``Since`` (added after the previous release, whose readers refuse fields they do not know)
  is left out while it holds its default, so that the previous release still reads the record.
- ``shown_json(answer)`` serializes an answer of the API by the same rule for ``Since`` fields (the
  previous release's SDK refuses a field it does not know), without the unknown fields a record was
  read with: an answer holds what its documented schema says, where those fields are optional.
- ``read_answer(Model, data)`` is how a client reads an answer of the API, which a newer release may
  have written: fields it does not know, at any depth, are ignored, and a value of a field marked
  ``Extensible`` (a state, a reason: lists a release may add to) that it does not know is kept as
  its text instead of refused. Read any other way, such a field takes only the values it lists.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import to_json

M = TypeVar("M", bound=BaseModel)


class Record(BaseModel):
    """A model that is stored or travels on a queue: strict unless read with ``stored``."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Since:
    """Marks a field added after the previous release (``Annotated[T, Since("0.2")]``): it is left
    out of what ``written`` makes while it holds its default, since the previous release's readers
    refuse a field they do not know. The marker may go when no supported release lacks the field."""

    release: str


_ANSWER = "runplane.answer"


def _known_or_text(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
    try:
        return handler(value)
    except ValidationError:
        if isinstance(value, str) and isinstance(info.context, dict) and info.context.get(_ANSWER):
            return value
        raise


Extensible = WrapValidator(_known_or_text)
"""Marks a field of listed values (an enum, a literal) that a later release may add to
(``Annotated[RunState, Extensible]``): read by ``read_answer``, a value not listed is kept as its text
(a ``str``, compared and printed as such), never an error. Its JSON schema is the list's."""


def read_answer(model: type[M], data: Any) -> M:
    """``data`` (a mapping) read as ``model``, an answer of the API that a newer release may have
    written: fields ``model`` does not know, at any depth, are ignored, and an ``Extensible`` field
    keeps a value it does not list as text. Raises pydantic's ValidationError for any other misfit."""
    return model.model_validate(data, extra="ignore", context={_ANSWER: True})


def stored(model: type[M], data: Any) -> M:
    """``data`` (a mapping, or JSON text or bytes) read as a ``model`` that another release may have
    written: fields ``model`` does not know, at any depth, are kept (``written`` writes them back).
    Raises pydantic's ValidationError when a field this release knows is not valid."""
    if isinstance(data, str | bytes | bytearray):
        return model.model_validate_json(data, extra="allow")
    return model.model_validate(data, extra="allow")


def written(record: BaseModel) -> dict[str, Any]:
    """``record`` as JSON data to store or send: with the fields it was read with that this release
    does not know, and without ``Since`` fields that hold their default."""
    data = record.model_dump(mode="json")
    _complete(record, data)
    return data


def written_json(record: BaseModel) -> str:
    """``written(record)`` as compact JSON text."""
    return to_json(written(record)).decode()


def shown_json(answer: BaseModel) -> str:
    """An answer of the API as JSON text: without ``Since`` fields that hold their default, at any
    depth, and without fields a record was read with that this release does not know."""
    if not _reaches_since(type(answer)):
        return answer.model_dump_json()
    return answer.model_dump_json(exclude=_at_default(answer) or None)


def _at_default(model: BaseModel) -> dict[Any, Any]:
    """What to leave out of ``model``'s dump (pydantic's ``exclude``): its ``Since`` fields that hold
    their default, at every depth."""
    since, nested = _plan(type(model))
    out: dict[Any, Any] = {name: True for name, default in since if getattr(model, name) == default}
    for name in nested:
        if name not in out and (inner := _default_in(getattr(model, name))):
            out[name] = inner
    return out


def _default_in(value: Any) -> dict[Any, Any]:
    if isinstance(value, BaseModel):
        return _at_default(value) if _reaches_since(type(value)) else {}
    if isinstance(value, list | tuple):
        return {i: inner for i, item in enumerate(value) if (inner := _default_in(item))}
    if isinstance(value, dict):
        return {key: inner for key, item in value.items() if (inner := _default_in(item))}
    return {}


def since_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The names of ``model``'s own fields marked ``Since``."""
    return tuple(name for name, _ in _plan(model)[0])


def _complete(model: BaseModel, data: dict[str, Any]) -> None:
    """Put ``model``'s unknown fields into ``data`` (its dump) and drop its ``Since`` fields at their
    default, at every depth."""
    since, nested = _plan(type(model))
    for name, default in since:
        if name in data and getattr(model, name) == default:
            del data[name]
    for name in nested:
        if name in data:
            _nested(getattr(model, name), data[name])
    extra = model.__pydantic_extra__
    if extra:
        for name, value in extra.items():
            data.setdefault(name, value)


@functools.cache
def _plan(model: type[BaseModel]) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """``model``'s ``Since`` fields with their defaults, and the fields that may hold models."""
    since = tuple(
        (name, field.get_default(call_default_factory=True))
        for name, field in model.model_fields.items()
        if any(isinstance(m, Since) for m in field.metadata)
    )
    nested = tuple(name for name, field in model.model_fields.items() if _holds_models(field.annotation))
    return since, nested


@functools.cache
def _reaches_since(model: type[BaseModel]) -> bool:
    """Whether ``model`` or a model it may hold, at any depth, has a ``Since`` field."""
    return _since_below(model, set())


def _since_below(model: type[BaseModel], seen: set[type[BaseModel]]) -> bool:
    if model in seen:
        return False
    seen.add(model)
    if _plan(model)[0]:
        return True
    return any(_since_below(m, seen) for f in model.model_fields.values() for m in _models_in(f.annotation))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _holds_models(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_models(arg) for arg in typing.get_args(annotation))


def _nested(value: Any, data: Any) -> None:
    if isinstance(value, BaseModel):
        if isinstance(data, dict):
            _complete(value, data)
    elif isinstance(value, list | tuple) and isinstance(data, list):
        for item, dumped in zip(value, data, strict=False):
            _nested(item, dumped)
    elif isinstance(value, dict) and isinstance(data, dict):
        for key, dumped in data.items():
            if key in value:
                _nested(value[key], dumped)
