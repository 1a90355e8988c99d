"""How big a run's record may grow, so that every write a run needs (a kill, its final state) fits
the smallest store's item: DynamoDB holds 400 KB an item, Table storage 1 MiB an entity (of which
``adapters.azure.tables`` uses 480,000 characters of ASCII JSON).

A run's record is its spec (bounded at submit: ``MAX_SPEC_BYTES``), its timeline (the first event
and the latest ones, ``MAX_RUN_EVENTS`` in all, each message clipped to ``MAX_MESSAGE_CHARS``), the
runs that wait for it (``MAX_DEPENDENTS``) and fields of fixed size; ``largest_run_bytes`` adds them
up. Sizes are measured as compact JSON with every non-ASCII character escaped: never less than the
UTF-8 bytes DynamoDB counts, and exactly what Table storage holds.

A write that replaces a full timeline is counted by moto's DynamoDB (where ``runplane dev`` keeps
its tables) with the old timeline and the new one both in the item, so the bound leaves room for a
second timeline: ``largest_run_bytes() + largest_timeline_bytes()`` is under DynamoDB's item too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runplane.domain.errors import PayloadTooLarge
from runplane.domain.runs import MAX_DEPENDENTS, MAX_INPUTS, MAX_UPSTREAMS, SWEEP_PREFIX, Event, Failure, RunSpec
from runplane.domain.sweeps import MAX_SWEEP, SweepSpec, render

MAX_SPEC_BYTES = 96 * 1024
"""The largest run spec (command, environment, inputs, ...) as JSON: under a quarter of DynamoDB's
item, so that the largest record with a second full timeline fits it (moto's sizing of a write)."""
MAX_RUN_EVENTS = 100
"""A run's timeline keeps its first event (its submission) and the latest ones, this many in all."""
MAX_MESSAGE_CHARS = 1000
"""The longest message (an event's, a failure's, a waiting or kill reason) a run's record keeps, as
escaped JSON; a longer one is cut and ends with an ellipsis."""
STORE_ITEM_BYTES = 400 * 1024
"""DynamoDB's item limit, the smallest of the stores'."""
_ID_CHARS = 64
_ELLIPSIS = "\u2026"


def json_size(data: Any) -> int:
    """The characters of ``data`` as compact JSON with non-ASCII characters escaped."""
    return len(json.dumps(data, ensure_ascii=True, separators=(",", ":")))


def spec_size(spec: RunSpec) -> int:
    return json_size(spec.model_dump(mode="json"))


def check_spec(spec: RunSpec, what: str = "the run's spec") -> None:
    """Raise PayloadTooLarge when ``spec`` is larger than ``MAX_SPEC_BYTES``."""
    size = spec_size(spec)
    if size > MAX_SPEC_BYTES:
        raise PayloadTooLarge(
            f"{what} is {size} bytes as JSON (non-ASCII characters count as their \\u escapes); "
            f"at most {MAX_SPEC_BYTES}: a shorter command, environment or inputs"
        )


def largest_member(sweep: SweepSpec) -> RunSpec:
    """The largest run spec a member of ``sweep`` can have: its template with each parameter at
    its longest value and the longest name a member gets."""
    longest = {name: max((render(v) for v in values), key=json_size) for name, values in sweep.parameters.items()}
    base = sweep.name or sweep.run.name or "s-" + "0" * 24
    name = f"{base}[{MAX_SWEEP}]"[:200]
    return sweep.run.model_copy(update={"env": {**sweep.run.env, **longest}, "name": name})


def clip(text: str, most: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as it is when it takes at most ``most`` characters as escaped JSON, else its
    longest start that does with an ellipsis after it."""
    if len(text) * 12 <= most:  # no character takes more than 12 (a surrogate pair's escapes)
        return text
    room = most - json_size(_ELLIPSIS) + 2
    used, cut = 0, 0
    for end, char in enumerate(text):
        used += json_size(char) - 2
        if used <= room:
            cut = end + 1
        elif used > most:
            return text[:cut] + _ELLIPSIS
    return text


def add_event(events: list[Event], event: Event) -> list[Event]:
    """``events`` with ``event`` added, as a run's record keeps them (``bound_events``)."""
    return bound_events([*events, event])


def bound_events(events: list[Event]) -> list[Event]:
    """``events`` as a run's record keeps them: the first, then the latest, ``MAX_RUN_EVENTS`` in
    all, each message clipped."""
    kept = events if len(events) <= MAX_RUN_EVENTS else [events[0], *events[-(MAX_RUN_EVENTS - 1) :]]
    return [e if clip(e.message) == e.message else e.model_copy(update={"message": clip(e.message)}) for e in kept]


def bound_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` to a run's record with its messages clipped and a timeline bounded."""
    bounded = dict(changes)
    for name in ("waiting_reason", "kill_reason"):
        if isinstance(bounded.get(name), str):
            bounded[name] = clip(bounded[name])
    failure = bounded.get("failure")
    if isinstance(failure, Failure) and clip(failure.message) != failure.message:
        bounded["failure"] = failure.model_copy(update={"message": clip(failure.message)})
    events = bounded.get("events")
    if isinstance(events, list) and all(isinstance(e, Event) for e in events):
        bounded["events"] = bound_events(events)
    return bounded


def largest_timeline_bytes() -> int:
    """An upper bound of a run's timeline as JSON: ``MAX_RUN_EVENTS`` events of the longest messages."""
    event = json_size({"at": 1e10, "state": "preparing", "message": ""}) + MAX_MESSAGE_CHARS + 1
    return MAX_RUN_EVENTS * event


def largest_run_bytes() -> int:
    """An upper bound of a run's record as JSON: a spec of ``MAX_SPEC_BYTES``, a full timeline of
    the longest messages, the most runs waiting for it and waited for, and the rest of its fields
    at their longest (ids of 64 characters, 32 groups, a failure and the reasons). A write that
    replaces the full timeline may be counted with ``largest_timeline_bytes()`` more (moto)."""
    waited = MAX_UPSTREAMS + MAX_INPUTS + 1  # after, run: inputs, after_sweep
    listed_id = len(SWEEP_PREFIX) + _ID_CHARS + 3
    fields = 4096  # names, numbers, states, usage and timings, ids of the run, owner, worker, sweep
    groups = 32 * (48 + 3) + 48
    messages = 3 * (MAX_MESSAGE_CHARS + 32)  # failure, waiting_reason, kill_reason
    return (
        MAX_SPEC_BYTES + largest_timeline_bytes() + (MAX_DEPENDENTS + waited) * listed_id + groups + messages + fields
    )
