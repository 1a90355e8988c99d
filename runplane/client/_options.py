"""A run's options as the SDK takes them, defined once and tied to ``RunSpec``.

``RunOptions`` names each field of ``RunSpec`` a caller gives besides the command, plus the fields
of ``Resources`` as shortcuts (``cpus``, ``gpus``, ``memory``, ``disk``, ``time``). ``run_body``
takes every field of the model as it is; ``RunOptions`` types them for editors, and a unit test
holds its keys and their types to the two models, so a field added to ``RunSpec`` is one line here
and nowhere else in the SDK. ``run_body`` is the one place that turns them into the JSON of
``POST /v1/runs`` (and of a sweep's template). The API checks every value against the model; this module checks only
that each option is one ``RunSpec`` has, so a typo is a TypeError, as for any keyword argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from pydantic import BaseModel

from runplane.domain.asks import Resources, RetryRule
from runplane.domain.checkpoints import CheckpointRule
from runplane.domain.runs import RunSpec


class RunOptions(TypedDict, total=False):
    """The keyword arguments of ``submit`` and ``submit_sweep`` that make the run (see
    ``Client.submit``); None, or a field's default, leaves the field to the API's default."""

    image: str | None
    resources: Resources | Mapping[str, Any] | None
    cpus: float | None
    gpus: int | None
    memory: str | int | None
    disk: str | int | None
    time: str | float | None
    queue: str | Sequence[str] | None  # a pool, or the pools in order: the first, then those it falls back to
    name: str | None
    env: Mapping[str, str] | None
    inputs: Mapping[str, str] | None
    network: bool
    tag: str | None
    group: str | None
    priority: int | None
    retry: RetryRule | Mapping[str, Any] | None
    after: Sequence[Any] | None  # runs (``Run`` objects or run ids) it waits for
    after_sweep: Any  # a sweep (a ``Sweep`` object or a sweep id) it waits for
    labels: Mapping[str, str] | None
    secrets: Mapping[str, str] | None  # ENV: a secret's reference ("name" or "group/name"), never a value
    image_pull_secret: str | None
    workdir: str | None  # the container's working directory, e.g. "/inputs/code"; default: its output directory
    interactive: bool  # its command's input comes from whoever attaches (``Run.attach``); not in a sweep
    tty: bool  # with interactive: the command has a terminal
    checkpoint: CheckpointRule | Mapping[str, Any] | None  # e.g. {"interval": "10m", "exit_code": 85}
    from_checkpoint: str | None  # a run of yours whose newest checkpoint this run starts from
    fallback: Sequence[str] | None  # the pools it falls back to after queue, in order
    fallback_after: str | float | None  # e.g. "20m": how long it waits on a pool before it moves on
    fallback_after_preemptions: int | None  # preemptions on a pool before it moves on


SHORTCUTS = tuple(Resources.model_fields)
"""The options that set one field of ``resources`` each."""
OPTIONS = frozenset(RunSpec.model_fields).difference({"command"}).union(SHORTCUTS)
"""What ``run_body`` takes: every field of ``RunSpec`` but the command, and the shortcuts (the
keys of ``RunOptions``, which a unit test holds to these, types included)."""


def id_of(item: Any) -> str:
    """A run's or sweep's id: given as text, or as the object the SDK returned (``.id``)."""
    return item if isinstance(item, str) else str(item.id)


def _ids(items: Any) -> list[str]:
    if isinstance(items, str):
        raise TypeError("after takes a list of runs or run ids")
    return [id_of(item) for item in items]


def _wire(value: Any) -> Any:
    """A value as JSON holds it: a model as the fields it was given, a mapping as a dict, a list
    or tuple as a list."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list | tuple):
        return list(value)
    return value


_CONVERT: dict[str, Callable[[Any], Any]] = {"after": _ids, "after_sweep": id_of}
"""The options whose value is not the field's own: objects the SDK returned, given for their ids."""


def _unset(name: str, value: Any) -> bool:
    """Whether ``value`` leaves field ``name`` at its default: then it is not sent, so that a
    newer SDK still talks to an API that predates a field nobody set."""
    if value is None:
        return True
    default = RunSpec.model_fields[name].get_default(call_default_factory=True)
    return type(value) is type(default) and value == default


def run_body(command: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The body of ``POST /v1/runs`` for ``command`` and ``options`` (a ``RunOptions``): only
    what was given; the shortcuts override ``resources``. Raises TypeError for an option that is
    not one."""
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {unknown}")
    resources = dict(_wire(options.get("resources")) or {})
    resources.update({k: options[k] for k in SHORTCUTS if options.get(k) is not None})
    body: dict[str, Any] = {"command": command}
    for name, value in options.items():
        if name in SHORTCUTS or name == "resources" or value is None:
            continue
        wire = _CONVERT.get(name, _wire)(value)
        if not _unset(name, wire):
            body[name] = wire
    if resources:
        body["resources"] = resources
    return body
