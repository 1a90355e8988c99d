"""What every record shares: the schema version, the patterns of names and ids, the checks of
text a user gives, and the readers and request schemas of sizes and durations."""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

from pydantic import BeforeValidator, WithJsonSchema

from runplane.domain.units import parse_bytes, parse_duration

MAX_RUN_TIME = 30 * 86400.0
"""The longest time limit a run may ask for (30 days)."""

SCHEMA_VERSION = 1

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,47}$"
RUN_ID_PATTERN = r"[A-Za-z0-9-]{1,64}"
"""What a run id may look like (made ones are ``r-`` and 24 hex digits); anything else is no run."""

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Characters a command or an environment value may not hold: C0 controls but tab, newline and
# carriage return, DEL, and lone surrogates (JSON can spell them; nothing can store them). A NUL
# cannot even reach exec(); the rest only hide what runs.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
# Variables that change how the dynamic loader or the C library behaves (what glibc strips for
# setuid programs): a run sets them in its image or its command, never through the API.
_LOADER_PREFIXES = ("LD_", "DYLD_")
_LOADER_NAMES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
    }
)


# Characters that change how text is shown without being seen: every format character (Unicode
# category Cf: the bidirectional marks, embeddings, overrides and isolates, the invisible spaces and
# joiners, the tag characters of hidden-text smuggling, the soft hyphen), the line and paragraph
# separators (a shell runs them as ordinary characters; a screen breaks the line) and the fillers that
# draw as blank. A name or a command holding one can read differently on a screen from what is stored
# and run ("Trojan Source"). Commands keep the two joiners (U+200C, U+200D): scripts such as Persian
# and emoji sequences need them.
_BLANK_FILLERS = frozenset("\u115f\u1160\u3164\uffa0")
_JOINERS = frozenset("\u200c\u200d")


def hidden_character(text: str, *, in_command: bool = False) -> str | None:
    """The first character of ``text`` that changes how it is shown without being seen (a format
    character, a line or paragraph separator, a blank filler; a command may hold the two joiners),
    as ``\\uNNNN`` (``\\UNNNNNNNN`` past the first plane), or None."""
    if text.isascii():
        return None
    for c in text:
        if c.isascii() or (in_command and c in _JOINERS):
            continue
        if unicodedata.category(c) in ("Cf", "Zl", "Zp") or c in _BLANK_FILLERS:
            code = ord(c)
            return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return None


def _anycase(word: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


ENV_NAME_PATTERN = (
    "^(?!"
    + "|".join([_anycase(p) for p in ("RUNPLANE_", *_LOADER_PREFIXES)])
    + "".join(f"|{_anycase(n)}$" for n in sorted(_LOADER_NAMES))
    + ")[A-Za-z_][A-Za-z0-9_]{0,127}$"
)
"""What ``check_env_name`` allows, as a JSON Schema pattern."""

NO_CONTROL_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
"""Text ``control_character`` finds nothing in, as a JSON Schema pattern (a lone surrogate, which it
also finds, is no character a pattern can name: JSON text carries none that decodes)."""


def _escape(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


@functools.cache
def shown_pattern(*, command: bool = False) -> str:
    """Text ``hidden_character`` and ``control_character`` find nothing in, as a JSON Schema pattern
    (Python's regular expressions, as the server's checks): for a ``command``, tab, newline, carriage
    return and the two joiners allowed and at least one character that is not a space; else one line.
    Built on first use (it reads the Unicode database)."""
    hidden = [
        c
        for c in range(0x80, 0x110000)
        if (unicodedata.category(chr(c)) in ("Cf", "Zl", "Zp") or chr(c) in _BLANK_FILLERS)
        and not (command and chr(c) in _JOINERS)
    ]
    ranges: list[list[int]] = []
    for c in hidden:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    out = "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in ranges)
    controls = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f" if command else r"\x00-\x1f\x7f"
    start = r"^(?=[\s\S]*\S)" if command else "^"
    return f"{start}[^{controls}{out}]*$"


def shown_text(*, command: bool = False) -> Any:
    """A field's ``json_schema_extra`` that gives it ``shown_pattern``, built when the schema is."""

    def extra(schema: dict[str, Any]) -> None:
        schema["pattern"] = shown_pattern(command=command)

    return extra


def control_character(text: str) -> str | None:
    """The first control character (other than tab, newline, carriage return) or lone surrogate
    in ``text``, as ``\\xNN`` or ``\\uNNNN``, or None."""
    match = _CONTROL.search(text)
    if match is None:
        return None
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


WHOLE = BeforeValidator(_whole)
"""Beside a strict ``int`` field (``Annotated[int, WHOLE]``, ``Field(strict=True)``): a JSON number
with no fraction (``71.0``, an integer to JSON Schema) is that integer; text, booleans and
fractions stay refused."""


def check_env_name(key: str) -> None:
    """Raise ValueError when ``key`` may not be a run's environment variable: not a valid name,
    the reserved RUNPLANE_ prefix, or a variable that changes the dynamic loader."""
    if not _ENV_KEY.fullmatch(key):
        raise ValueError(f"environment variable name {key[:80]!r} is not valid")
    if key.upper().startswith("RUNPLANE_"):
        raise ValueError(f"environment variable {key!r}: the RUNPLANE_ prefix is reserved")
    if key.upper().startswith(_LOADER_PREFIXES) or key.upper() in _LOADER_NAMES:
        raise ValueError(f"environment variable {key!r} changes the dynamic loader; set it in the image or the command")


def read_size(value: Any) -> Any:
    return parse_bytes(value) if isinstance(value, str | int | float) else value


def read_duration(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str | int | float) else value


SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*[kKmMgGtTpP]?[iI]?[bB]?\s*$"
"""The strings ``parse_bytes`` reads ("512m", "2g", "1.5GiB"), as a JSON Schema pattern."""
DURATION_PATTERN = r"^\s*(\d+(\.\d+)?|(\d+(\.\d+)?\s*([mM][sS]|[sSmMhHdD])\s*)+)\s*$"
"""The strings ``parse_duration`` reads ("90s", "1h30m", "2d", "3600"), as a JSON Schema pattern."""


def size_or_text(least: int, most: int, examples: list[Any]) -> WithJsonSchema:
    """The request schema of a size a ``read_size`` validator reads: bytes (a fraction is dropped) or
    a string with a binary unit; ``least`` and ``most`` bound the bytes either way."""
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": least, "maximum": most},
                {"type": "string", "pattern": SIZE_PATTERN, "description": "k, m, g, t, p: powers of 1024"},
                {"type": "null"},
            ],
            "examples": examples,
        },
        mode="validation",
    )


def duration_or_text(least: float, most: float, examples: list[Any], *, exclusive: bool = False) -> WithJsonSchema:
    """The request schema of a duration a ``read_duration`` validator reads: seconds or a string such
    as "90s" or "1h30m" (ms, s, m, h, d); ``least`` and ``most`` bound the seconds either way."""
    low = {"exclusiveMinimum": least} if exclusive else {"minimum": least}
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", **low, "maximum": most},
                {"type": "string", "pattern": DURATION_PATTERN, "description": "units ms, s, m, h, d"},
                {"type": "null"},
            ],
            "examples": examples,
        },
        mode="validation",
    )
