"""Where logs and outputs live in object storage, and reading them back.

Logs are written as chunks named by their byte offset, so they can be read while the run
is still going: ``runs/<id>/logs/<attempt>/<stream>/<offset:016d>``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Literal

from runplane.domain.cursors import decode_cursor
from runplane.domain.errors import BadRequest
from runplane.domain.models import Run, RunState
from runplane.ports import ObjectStore

Stream = Literal["stdout", "stderr"]
MAX_READ = 512 * 1024
"""The most bytes of a log one read returns. As JSON a byte may take up to six characters (an
invalid one becomes \\ufffd), seven inside Lambda's response: 3.5 MB, under its 6 MB limit."""


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
    """Bytes of ``stream`` of ``attempt`` (default: the latest) from ``offset`` on; ``complete``
    once that attempt is over and all is read."""
    over = attempt_over(run, attempt)
    attempt = run.attempt if attempt is None else attempt
    prefix = log_prefix(run.id, attempt, stream)
    chunks = [(int(o.key[len(prefix) :]), o) for o in objects.list(prefix) if o.key[len(prefix) :].isdigit()]
    total = max((start + o.size for start, o in chunks), default=0)
    out = bytearray()
    position = offset
    for start, info in chunks:
        end = start + info.size
        if end <= position or start > position:
            continue
        data = objects.get_bytes(info.key)
        piece = data[position - start :]
        piece = piece[: max_bytes - len(out)]
        out += piece
        position += len(piece)
        if len(out) >= max_bytes:
            break
    complete = over and position >= total
    return LogPage(out.decode("utf-8", errors="replace"), position, complete)


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
