"""A submit's refusals in the words of the command line: the API names a run's fields
(``checkpoint.grace: Input should be less than or equal to 3600``); ``runplane run`` and ``runplane
sweep run`` say the flags that gave them, and a duration's bounds as durations
(``--checkpoint-grace: at most 1h``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from runplane.client import BadRequest, Conflict, InvalidRequest
from runplane.domain.units import format_duration

FLAG_OF = {
    "queue": "--queue",
    "fallback": "--queue",
    "fallback_after": "--fallback-after",
    "fallback_after_preemptions": "--fallback-after-preemptions",
    "from_checkpoint": "--from-checkpoint",
    "checkpoint.interval": "--checkpoint",
    "checkpoint.signal": "--checkpoint-signal",
    "checkpoint.grace": "--checkpoint-grace",
    "checkpoint.exit_code": "--checkpoint-exit-code",
    "checkpoint.max_pieces": "--max-pieces",
    "resources.cpus": "--cpus",
    "resources.gpus": "--gpus",
    "resources.memory": "--memory",
    "resources.disk": "--disk",
    "resources.time": "--time",
}
"""The flag of each field of a submit (its place in the API's message) whose flag is not its name
with ``--`` and dashes."""

DURATIONS = frozenset({"--checkpoint", "--checkpoint-grace", "--fallback-after", "--time"})
"""The flags that take a duration: their bounds come from the API in seconds."""

_IN_TEXT = {
    "fallback_after_preemptions": "--fallback-after-preemptions",
    "fallback_after": "--fallback-after",
    "from_checkpoint": "--from-checkpoint",
    "max_pieces": "--max-pieces",
    "exit_code": "--checkpoint-exit-code",
    **{field: flag for field, flag in FLAG_OF.items() if "." in field},
}
"""The fields a message may name in its text (a rule of several fields: "max_pieces ... give
exit_code too"), longest first where one is the start of another."""
_NAMES = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(_IN_TEXT, key=len, reverse=True))) + r")(?![\w-])")
_BOUND = re.compile(r"^Input should be (greater|less) than or equal to (\d+(?:\.\d+)?)$")


def _flag(place: str) -> str | None:
    """The flag of a field's place, as the API says it (``checkpoint.grace``; a sweep's
    ``run.checkpoint.grace``)."""
    for field in sorted(FLAG_OF, key=len, reverse=True):
        if place == field or place.endswith("." + field):
            return FLAG_OF[field]
    return None


def _part(text: str) -> str:
    place, sep, said = text.partition(": ")
    if sep and place == "body":  # a rule of the whole request: its own text names the field
        return _part(said)
    flag = _flag(place) if sep else None
    if flag is None:
        return _NAMES.sub(lambda m: _IN_TEXT[m.group(1)], text)
    if bound := _BOUND.match(said):
        value = float(bound.group(2))
        said = f"{'at least' if bound.group(1) == 'greater' else 'at most'} "
        said += format_duration(value) if flag in DURATIONS else f"{value:g}"
    return f"{flag}: {_NAMES.sub(lambda m: _IN_TEXT[m.group(1)], said)}"


def flagged(message: str) -> str:
    """``message``, a submit's refusal, with each field it names said as its flag."""
    return "; ".join(_part(part) for part in message.split("; "))


@contextlib.contextmanager
def said_by_flags() -> Iterator[None]:
    """A submit whose refusal (400, 409, 422) is raised again saying the flags (``flagged``)."""
    try:
        yield
    except (BadRequest, Conflict, InvalidRequest) as e:
        raise type(e)(e.status, e.code, flagged(e.message)) from None
