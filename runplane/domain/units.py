"""Parsing of human sizes ("512m", "2g") and durations ("90s", "1h30m")."""

from __future__ import annotations

import math
import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", re.IGNORECASE)
_DURATION_FACTORS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_SIZE = 1024**5
"""The largest size anything may be given (1 PiB): beyond any machine, and storable everywhere."""
MAX_DURATION = 366 * 86400.0
"""The longest duration any setting may be given (a year); a run's time is capped lower."""


def parse_bytes(value: str | int | float) -> int:
    """Return a byte count from an int or a string such as "512m", "2g", "1.5GiB".

    Units are binary (k = 1024). Raises ValueError with a readable message.
    """
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '512m'")
    if isinstance(value, int | float):
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError("a size must be a finite, non-negative number of bytes")
        return _bounded_size(value)
    match = _SIZE.match(value)
    if not match:
        raise ValueError(f"cannot read size {value!r}: use bytes or a number with k, m, g or t (e.g. '512m')")
    number, unit, _ = match.groups()
    return _bounded_size(float(number) * _SIZE_FACTORS[unit.lower()])


def _bounded_size(value: float) -> int:
    if value > MAX_SIZE:  # compares an int of any size exactly
        raise ValueError(f"a size cannot exceed {format_bytes(MAX_SIZE)}")
    return int(value)


def parse_duration(value: str | int | float) -> float:
    """Return seconds from a number or a string such as "90s", "30m", "1h30m", "2d"."""
    if isinstance(value, bool):
        raise ValueError("a duration must be seconds or a string like '90s' or '1h'")
    if isinstance(value, int | float):
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError("a duration must be a finite, non-negative number of seconds")
        if value > MAX_DURATION:  # before float(): an int may be too large for one
            raise ValueError(f"a duration cannot exceed {MAX_DURATION // 86400:g} days")
        return _bounded_duration(float(value))
    text = value.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return _bounded_duration(float(text))
    parts = _DURATION_PART.findall(text)
    if not parts or _DURATION_PART.sub("", text).strip():
        raise ValueError(f"cannot read duration {value!r}: use seconds or e.g. '90s', '30m', '1h30m', '2d'")
    return _bounded_duration(sum(float(n) * _DURATION_FACTORS[u.lower()] for n, u in parts))


def _bounded_duration(value: float) -> float:
    if not math.isfinite(value) or value > MAX_DURATION:
        raise ValueError(f"a duration cannot exceed {MAX_DURATION // 86400:g} days")
    return value


def format_bytes(value: int) -> str:
    """Short human form: 536870912 -> '512m'."""
    for unit, factor in (("p", 1024**5), ("t", 1024**4), ("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if value >= factor and value % factor == 0:
            return f"{value // factor}{unit}"
        if value >= factor * 10:
            return f"{value / factor:.1f}{unit}"
    return str(value)


_IEC = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
"""The units sizes are said in: powers of 1024, labelled so (as the dashboard says them)."""


def format_size(size: int) -> str:
    """``3.1 MiB``: a size in powers of 1024, labelled so."""
    for unit, factor in _IEC:
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} byte{'s' if size != 1 else ''}"


def format_progress(done: int, total: int) -> str:
    """How much of ``total`` bytes is done, both in the unit of the total: '1.2 of 4.5 GiB'."""
    for unit, factor in _IEC:
        if total >= factor:
            return f"{done / factor:.1f} of {total / factor:.1f} {unit}"
    return f"{done} of {total} bytes"


def format_duration(seconds: float) -> str:
    """Short human form: 5400 -> '1h30m'."""
    seconds = round(seconds)
    out = []
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= factor:
            out.append(f"{seconds // factor}{unit}")
            seconds %= factor
    if seconds or not out:
        out.append(f"{seconds}s")
    return "".join(out)
