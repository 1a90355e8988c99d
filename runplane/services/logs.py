"""Where logs and outputs live in object storage, and reading them back.

Logs are written as chunks named by their byte offset, so they can be read while the run
is still going: ``runs/<id>/logs/<attempt>/<stream>/<offset:016d>``. One writer (the agent that
holds the attempt) uploads them in order, each starting where the one before ended.

A read costs what it returns, never what the stream holds: it fetches the chunk that starts at its
offset by name, then the next by name, and so on (at most ``MAX_CHUNKS_READ``), listing nothing. Only
an offset where no chunk starts (one inside a chunk, or the end) is looked up by listing: a few keys
of the decimal blocks around it (``_chunk_before``), at most ``PROBE`` keys per request and at most
10 requests per digit of the name, however many chunks the stream holds.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Literal

from runplane.domain.cursors import decode_cursor
from runplane.domain.errors import BadRequest, InvalidRequest, NotFound
from runplane.domain.runs import Run
from runplane.domain.states import RunState
from runplane.ports import ObjectInfo, ObjectStore

Stream = Literal["stdout", "stderr"]
MAX_READ = 512 * 1024
"""The most bytes of a log one read returns. As JSON a byte may take up to six characters (an
invalid one becomes \\ufffd), seven inside Lambda's response: 3.5 MB, under its 6 MB limit."""
MAX_CHUNK = MAX_READ
"""The largest chunk the agent writes: a page holds at least one whole chunk, so every next_offset a
read returns is where a chunk starts (found by its name). Older agents wrote larger ones: a page cuts
such a chunk, and the read after it looks the chunk up."""
MAX_CHUNKS_READ = 64
"""Chunks one read fetches at most: a read is at most this many GETs, however small the chunks are
(a run that prints a byte a second leaves a chunk a second)."""
PROBE = 10
"""Keys listed per request while looking up the chunk that holds an offset."""
_DIGITS = 16


def log_prefix(run_id: str, attempt: int, stream: str) -> str:
    return f"runs/{run_id}/logs/{attempt}/{stream}/"


def log_chunk_key(run_id: str, attempt: int, stream: str, offset: int) -> str:
    return f"{log_prefix(run_id, attempt, stream)}{offset:016d}"


def outputs_prefix(run_id: str, attempt: int) -> str:
    return f"runs/{run_id}/outputs/{attempt}/"


@dataclass(frozen=True)
class LogPage:
    data: str
    next_offset: int
    complete: bool


def read_logs(
    objects: ObjectStore,
    run: Run,
    stream: Stream,
    offset: int,
    max_bytes: int = MAX_READ,
    *,
    attempt: int | None = None,
) -> LogPage:
    """Bytes of ``stream`` of ``attempt`` (default: the latest) from ``offset`` on, at most
    ``max_bytes`` of them from at most ``MAX_CHUNKS_READ`` chunks; ``complete`` once that attempt is
    over and all is read. A page ends where a chunk starts unless its first chunk alone is larger."""
    over = attempt_over(run, attempt)
    attempt = run.attempt if attempt is None else attempt
    prefix = log_prefix(run.id, attempt, stream)
    if offset >= 10**_DIGITS:  # past any name, and any log
        return LogPage("", offset, over)
    start, data = offset, _chunk(objects, prefix + _name(offset))
    if data is None:
        holder = _chunk_before(objects, prefix, offset)
        if holder is not None and _start(prefix, holder) + holder.size > offset:
            start, data = _start(prefix, holder), _chunk(objects, holder.key)
    out = bytearray()
    position, fetched, at_end = offset, 1, not data
    while data:
        piece = data[position - start :]
        room = max_bytes - len(out)
        if len(piece) > room:
            if not out:  # a chunk larger than a page (an older agent's): cut it
                out += piece[:room]
                position += room
            break
        out += piece
        position += len(piece)
        if fetched >= MAX_CHUNKS_READ or len(out) >= max_bytes:
            break
        start, data = position, _chunk(objects, prefix + _name(position))
        fetched += 1
        at_end = not data
    return LogPage(out.decode("utf-8", errors="replace"), position, over and at_end)


def _name(offset: int) -> str:
    return f"{offset:0{_DIGITS}d}"


def _start(prefix: str, info: ObjectInfo) -> int:
    return int(info.key[len(prefix) :])


def _chunk(objects: ObjectStore, key: str) -> bytes | None:
    try:
        return objects.get_bytes(key)
    except NotFound:
        return None


def _probe(objects: ObjectStore, prefix: str, part: str) -> tuple[list[ObjectInfo], bool]:
    """The first ``PROBE`` chunks whose names start with ``part``, and whether there are more."""
    found, more = objects.list_page(prefix + part, None, PROBE)
    return [o for o in found if o.key[len(prefix) :].isdigit() and len(o.key) - len(prefix) == _DIGITS], bool(more)


def _chunk_before(objects: ObjectStore, prefix: str, offset: int) -> ObjectInfo | None:
    """The chunk that starts last at or before ``offset``, or None. Names are fixed-width decimal,
    so the chunks of a decimal block of offsets share a name's prefix: from the smallest block
    around ``offset`` outwards, a block is listed, and when it holds more than one probe shows (all
    before ``offset``), its parts below ``offset``'s are searched from the nearest down."""
    digits = _name(offset)
    for level in range(1, _DIGITS + 1):
        block = digits[: _DIGITS - level]
        found, more = _probe(objects, prefix, block)
        before = [o for o in found if _start(prefix, o) <= offset]
        if not more or len(before) < len(found):
            if before:
                return before[-1]
            continue
        for digit in range(int(digits[_DIGITS - level]) - 1, -1, -1):
            last = _last_chunk(objects, prefix, block + str(digit))
            if last is not None:
                return last
        return before[-1] if before else None
    return None


def _last_chunk(objects: ObjectStore, prefix: str, part: str) -> ObjectInfo | None:
    """The last chunk whose name starts with ``part``: its parts are searched from the top down."""
    found, more = _probe(objects, prefix, part)
    if not more:
        return found[-1] if found else None
    for digit in range(9, -1, -1):
        last = _last_chunk(objects, prefix, part + str(digit))
        if last is not None:
            return last
    return None


def asked_attempt(run: Run, attempt: int | None) -> int | None:
    """The attempt a reader asks for (None: the run's latest). Raises InvalidRequest for one the
    run has not had."""
    if attempt is None:
        return None
    if run.attempt < 1:
        raise InvalidRequest(f"run {run.id} has not had an attempt yet")
    if not 1 <= attempt <= run.attempt:
        raise InvalidRequest(f"query parameter attempt must be between 1 and {run.attempt}")
    return attempt


def attempt_over(run: Run, attempt: int | None) -> bool:
    """Whether ``attempt`` of ``run`` (None: its latest, which a later claim may follow) is over:
    the run ended, a later attempt began, or the run waits for its next one."""
    if run.state.terminal:
        return True
    if attempt is None:
        return False
    return attempt < run.attempt or run.state == RunState.QUEUED


@dataclass(frozen=True)
class OutputsPage:
    files: list[dict[str, Any]]
    next_cursor: str | None


MAX_OUTPUTS_PAGE = 500
"""Output files listed at most in one answer: paths and URLs of 1 KiB names stay under 5 MB."""


def _store_cursor(cursor: str, attempt: int) -> str:
    """The object store's cursor an outputs ``next_cursor`` of ``attempt`` holds. Raises BadRequest,
    also for a cursor of another attempt (the run went again between two pages)."""
    try:
        data = decode_cursor(cursor, most=4096)
        inner, made_for = data["c"], data.get("a", attempt)
        if set(data) - {"c", "a"} or not isinstance(inner, str) or not inner or not inner.isprintable():
            raise ValueError
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as e:
        raise BadRequest("cursor is not valid; pass the next_cursor of a previous page") from e
    if made_for != attempt:
        raise BadRequest(
            f"cursor is of attempt {made_for}'s outputs, not attempt {attempt}'s: list again from the start"
        )
    return inner


def read_outputs(
    objects: ObjectStore, run: Run, cursor: str | None, limit: int, *, attempt: int | None = None
) -> OutputsPage:
    """A page of the output files of ``attempt`` (default: the run's latest) with download URLs,
    in path order, from where ``cursor`` (a ``next_cursor``) left off. Raises BadRequest for a
    cursor this listing did not make."""
    attempt = run.attempt if attempt is None else attempt
    prefix = outputs_prefix(run.id, attempt)
    start = _store_cursor(cursor, attempt) if cursor else None
    found, after = objects.list_page(prefix, start, min(limit, MAX_OUTPUTS_PAGE))
    files = [{"path": o.key[len(prefix) :], "size": o.size, "url": objects.url(o.key)} for o in found]
    next_cursor = base64.urlsafe_b64encode(json.dumps({"c": after, "a": attempt}).encode()).decode() if after else None
    return OutputsPage(files, next_cursor)
