"""``runplane logs``: a run's stdout or stderr, all of it or as it comes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Annotated

import typer

from runplane.api.models import LogPage
from runplane.cli.common import client, deleted_by_retention, err, print_json
from runplane.cli.last_run import RUN_ID, named_by_id, run_id_or_last
from runplane.client import Client

POLL = 0.3
"""Seconds between two reads of a log that has nothing new."""
WAIT = 20.0
"""The longest one read of a run waits for it to change (the API's cap)."""


def logs(
    ctx: typer.Context,
    run_id: RUN_ID = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the run ends")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="the stderr stream instead of stdout")] = False,
    tail: Annotated[int | None, typer.Option(min=0, help="only the last N lines (then follow, with -f)")] = None,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="an earlier attempt's logs (default: the latest)", show_default=False)
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="print {data, next_offset, complete} (with -f: one such line per read)"),
    ] = False,
) -> None:
    """Print a run's stdout (or stderr)."""
    rid = run_id_or_last(run_id)
    with named_by_id(rid):
        _print_logs(client(ctx), rid, follow=follow, stderr=stderr, tail=tail, attempt=attempt, as_json=as_json)


def _print_logs(
    api: Client, rid: str, *, follow: bool, stderr: bool, tail: int | None, attempt: int | None, as_json: bool
) -> None:
    stream = "stderr" if stderr else "stdout"
    whole = tail is not None or as_json  # needs all of it before printing any; else page by page
    parts, offset, complete = [], 0, False
    for page in _pages_so_far(api, rid, stream, attempt):
        offset, complete = page.next_offset, page.complete
        if whole:
            parts.append(page.data)
        else:
            _write_log(page.data, offset, complete, as_json=False)
    if whole:
        data = "".join(parts) if tail is None else last_lines("".join(parts), tail)
        if as_json and not follow:
            print_json({"data": data, "next_offset": offset, "complete": complete})
            return
        _write_log(data, offset, complete, as_json)
    if offset == 0 and complete and not as_json and (gone := deleted_by_retention(api.get(rid).view, "logs")):
        err.print(gone, markup=False, highlight=False)  # nothing printed: say why, not silence
        return
    # following the latest attempt: read the attempt going now by its number, so that a retry
    # never reads the next attempt's logs from this one's offset; once it is over, the next one
    pinned = attempt
    current = api.get(rid) if follow and not complete else None
    while current is not None and not complete:
        if pinned is None:  # the latest attempt: which one is it?
            if not current.view.attempt:  # none yet: the next read answers when the run changes
                if current.done:
                    break
                current.refresh(wait=WAIT)
                continue
            pinned = current.view.attempt
        page = api.logs(rid, stream, offset, attempt=pinned)
        offset, complete = page.next_offset, page.complete
        if complete and attempt is None:
            current.refresh()
            if not current.done:  # over, and the run goes again: wait for its next attempt
                complete = False
                if current.view.attempt > pinned:
                    pinned, offset = current.view.attempt, 0
                page = page.model_copy(update={"complete": False})
        if page.data or page.complete:
            _write_log(page.data, page.next_offset, page.complete, as_json)
        else:  # nothing new: read again after POLL, or as soon as the run changes (ends)
            current.refresh(wait=POLL)


def _pages_so_far(api: Client, run_id: str, stream: str, attempt: int | None = None) -> Iterator[LogPage]:
    """The pages of ``stream`` (of ``attempt``; default the latest) from its start up to what it holds now."""
    offset = 0
    while True:
        page = api.logs(run_id, stream, offset, attempt=attempt)
        yield page
        if page.complete or not page.data or page.next_offset == offset:
            return
        offset = page.next_offset


def _write_log(data: str, next_offset: int, complete: bool, as_json: bool) -> None:
    if as_json:
        line = json.dumps({"data": data, "next_offset": next_offset, "complete": complete})
        sys.stdout.write(line + "\n")
    else:
        sys.stdout.write(data)
    sys.stdout.flush()


def last_lines(text: str, count: int) -> str:
    """The last ``count`` lines of ``text`` (a last line without its newline counts)."""
    end = len(text) - 1 if text.endswith("\n") else len(text)
    for _ in range(count):
        end = text.rfind("\n", 0, end)
        if end == -1:
            return text
    return text[end + 1 :] if count else ""
