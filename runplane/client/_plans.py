"""``Plans``: the plans of runs and sweeps (submit, list, wait, logs, follow, download), on top of
``AdminPlans``. ``Client`` and ``AsyncClient`` each hold one and add the I/O (``_core``)."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from runplane.api.checkpoint_models import CheckpointPage
from runplane.api.models import LogPage, OutputFile, OutputPage, RunPage, RunView, SweepPage, SweepRetried, SweepView
from runplane.api.session_models import SessionAccess, SessionList, SessionView
from runplane.client._admin_plans import AdminPlans
from runplane.client._core import (
    Emit,
    Fetch,
    Pause,
    Plan,
    Progress,
    StateSeen,
    Step,
    collect,
    parse,
    quote_segment,
)
from runplane.client._files import dir_target, output_target, overwrites
from runplane.client._options import RunOptions, run_body
from runplane.client.errors import Conflict, WaitTimeout
from runplane.domain.checkpoints import PERMISSION_BITS
from runplane.domain.states import TERMINAL_STATES, RunState

MAX_RUNS_PAGE = 500
"""The most runs the API lists in one page."""
MAX_SWEEPS_PAGE = 100
MAX_CHECKPOINT_PAGE = 500
"""The most checkpoint files the API lists in one page."""
CHECKPOINT_READS = 3
LINE_HOLD = 64 * 1024
"""``follow`` holds back a partial line until it is this long, then hands it over as it is."""
LONGEST_WAIT = 20.0
"""The most seconds one read asks the API to wait for a change (the API's own cap)."""
TIMEOUT_MARGIN = 5.0
"""A waiting read asks for at most the client's timeout less this, so that its answer comes in time."""

UNWAITED_POLL = 0.5
"""``changed``: how often a stack that does not wait (an older one) is read."""

W = TypeVar("W", RunView, SweepView)


class Plans(AdminPlans):
    """A client's settings, its requests and every plan."""

    # runs

    def submit(self, command: str, options: RunOptions, idempotency_key: str | None) -> Plan[tuple[RunView, bool]]:
        """The run and whether it was made now (201) rather than found by its key (200)."""
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        response = yield from self.raw("POST", "/v1/runs", run_body(command, options), headers={"Idempotency-Key": key})
        return parse(RunView, response), response.status == 201

    def get(self, run_id: str) -> Plan[RunView]:
        return self._get(RunView, f"/v1/runs/{quote_segment(run_id)}")

    def changed(self, last: RunView, wait: float) -> Plan[RunView]:
        """The run of ``last`` read again, as soon as it differs from ``last`` or after ``wait``
        seconds (at most the API's cap, within the client's timeout)."""
        path = f"/v1/runs/{quote_segment(last.id)}"
        return self._watch(RunView, path, last, self._longest(wait), min(wait, UNWAITED_POLL))

    def _longest(self, left: float | None = None) -> float:
        """The longest a read may ask the API to wait: its cap, within the client's timeout and
        ``left`` (seconds left of a caller's own timeout)."""
        return max(0.0, min(LONGEST_WAIT, self.timeout - TIMEOUT_MARGIN, LONGEST_WAIT if left is None else left))

    def _watch(self, model: type[W], path: str, last: W, wait: float, poll: float) -> Plan[W]:
        """``path`` read again: as soon as it differs from ``last`` (the API holds the answer up to
        ``wait`` seconds), or as it is after that. A stack that does not wait (an older one, which
        ignores the parameters and sends no revision) is read every ``poll`` seconds: an answer
        that comes back unchanged sooner than that is followed by a pause, so that no read spins."""
        if not last.revision or wait <= 0:
            yield Pause(poll)
            return (yield from self._get(model, path))
        started = time.monotonic()
        view = yield from self._get(model, path, {"since": last.revision, "wait": round(wait, 3)})
        if view.revision in ("", last.revision) and time.monotonic() - started < min(wait, poll):
            yield Pause(poll)
        return view

    def kill(self, run_id: str) -> Plan[RunView]:
        return parse(RunView, (yield from self.raw("POST", f"/v1/runs/{quote_segment(run_id)}/kill")))

    def set_priority(self, run_id: str, priority: int) -> Plan[RunView]:
        body = {"priority": priority}
        return parse(RunView, (yield from self.raw("POST", f"/v1/runs/{quote_segment(run_id)}/priority", body)))

    def keep(self, run_id: str, keep: bool) -> Plan[RunView]:
        body = {"keep": keep}
        return parse(RunView, (yield from self.raw("POST", f"/v1/runs/{quote_segment(run_id)}/keep", body)))

    def runs_page(self, filters: Mapping[str, Any], limit: int | None, cursor: str | None) -> Plan[RunPage]:
        """One page of runs; ``filters``: ``state``, ``queue``, ``owner``, ``label`` (None: not
        filtered on)."""
        return self._get(RunPage, "/v1/runs", {**filters, "limit": limit, "cursor": cursor})

    def runs(self, filters: Mapping[str, Any], limit: int | None, page_size: int) -> Plan[None]:
        """Emits RunViews, newest first, page after page, at most ``limit`` of them. A filtered
        page may come back short, even empty, with a cursor: the listing goes on while the cursor
        does."""
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        page_size = min(page_size, MAX_RUNS_PAGE)
        cursor: str | None = None
        seen = 0
        while limit is None or seen < limit:
            want = page_size if limit is None else min(page_size, limit - seen)
            page = yield from self.runs_page(filters, want, cursor)
            for view in page.runs[:want]:
                yield Emit(view)
                seen += 1
            if not page.next_cursor or page.next_cursor == cursor:
                return
            cursor = page.next_cursor

    # sessions

    def open_session(self, run_id: str, kind: str, fields: Mapping[str, Any]) -> Plan[SessionAccess]:
        """A session into the run; ``fields``: SessionRequest's others (None: left out, the API's
        default). Not sent again after a failure that may have reached the API (a second session)."""
        command = fields.get("command")
        if isinstance(command, str | bytes):
            raise TypeError("command is a list of arguments (['sh', '-c', '...']), not one string")
        body = {"kind": str(kind), **{k: list(v) if k == "command" else v for k, v in fields.items() if v is not None}}
        return parse(SessionAccess, (yield from self.raw("POST", sessions_path(run_id), body)))

    def sessions(self, run_id: str) -> Plan[list[SessionView]]:
        return (yield from self._get(SessionList, sessions_path(run_id))).sessions

    def session_ticket(self, run_id: str, session_id: str) -> Plan[SessionAccess]:
        path = sessions_path(run_id, session_id) + "/ticket"
        return parse(SessionAccess, (yield from self.raw("POST", path)))

    def close_session(self, run_id: str, session_id: str) -> Plan[SessionView]:
        return parse(SessionView, (yield from self.raw("DELETE", sessions_path(run_id, session_id))))

    # sweeps

    def create_sweep(
        self,
        run: Mapping[str, Any],
        *,
        parameters: Mapping[str, Sequence[Any]] | None,
        count: int | None,
        max_parallel: int | None,
        name: str | None,
        idempotency_key: str | None,
    ) -> Plan[tuple[SweepView, bool]]:
        """The sweep and whether it was made now (201) rather than found by its key (200)."""
        body: dict[str, Any] = {"run": dict(run)}
        if parameters:
            body["parameters"] = {k: list(v) for k, v in parameters.items()}
        optional = {"count": count, "max_parallel": max_parallel, "name": name}
        body.update({k: v for k, v in optional.items() if v is not None})
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        response = yield from self.raw("POST", "/v1/sweeps", body, headers={"Idempotency-Key": key})
        return parse(SweepView, response), response.status == 201

    def sweep(self, sweep_id: str) -> Plan[SweepView]:
        return self._get(SweepView, f"/v1/sweeps/{quote_segment(sweep_id)}")

    def sweeps(self, owner: str | None, limit: int | None) -> Plan[None]:
        """Emits SweepViews, newest first, at most ``limit`` of them."""
        cursor: str | None = None
        seen = 0
        while limit is None or seen < limit:
            query = {"owner": owner, "limit": MAX_SWEEPS_PAGE, "cursor": cursor}
            page = yield from self._get(SweepPage, "/v1/sweeps", query)
            for view in page.sweeps:
                if limit is not None and seen >= limit:
                    return
                yield Emit(view)
                seen += 1
            if not page.next_cursor or not page.sweeps:
                return
            cursor = page.next_cursor

    def kill_sweep(self, sweep_id: str) -> Plan[SweepView]:
        return parse(SweepView, (yield from self.raw("POST", f"/v1/sweeps/{quote_segment(sweep_id)}/kill")))

    def retry_sweep(self, sweep_id: str) -> Plan[SweepRetried]:
        return parse(SweepRetried, (yield from self.raw("POST", f"/v1/sweeps/{quote_segment(sweep_id)}/retry")))

    def set_max_parallel(self, sweep_id: str, most: int | None) -> Plan[SweepView]:
        body = {"max_parallel": most}
        return parse(SweepView, (yield from self.raw("PATCH", f"/v1/sweeps/{quote_segment(sweep_id)}", body)))

    def members(self, sweep_id: str, state: RunState | str | None, page_size: int) -> Plan[None]:
        """Emits the RunViews of a sweep's members released so far, in index order."""
        cursor: str | None = None
        while True:
            query = {"sweep": sweep_id, "state": state, "limit": min(page_size, MAX_RUNS_PAGE), "cursor": cursor}
            page = yield from self._get(RunPage, "/v1/runs", query)
            for view in page.runs:
                yield Emit(view)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def wait_sweep(self, sweep_id: str, timeout: float | None, poll: float) -> Plan[SweepView]:
        """Read the sweep until it has finished, each read answered when it changes; emits each
        view read (for progress)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        view = yield from self.sweep(sweep_id)
        while True:
            yield Emit(view)
            if view.finished_at is not None:
                return view
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(0, "wait_timeout", f"sweep {sweep_id} has not finished after {timeout:g}s")
            path = f"/v1/sweeps/{quote_segment(sweep_id)}"
            view = yield from self._watch(
                SweepView, path, view, self._longest(left), poll if left is None else min(poll, left)
            )

    def logs(self, run_id: str, stream: str, offset: int, attempt: int | None = None) -> Plan[LogPage]:
        query = {"stream": stream, "offset": offset, "attempt": attempt}
        return self._get(LogPage, f"/v1/runs/{quote_segment(run_id)}/logs", query)

    def all_logs(self, run_id: str, stream: str, attempt: int | None = None) -> Plan[str]:
        """Everything ``stream`` (of ``attempt``; default the latest) holds so far."""
        parts, offset = [], 0
        while True:
            page = yield from self.logs(run_id, stream, offset, attempt)
            parts.append(page.data)
            if page.complete or page.next_offset == offset or not page.data:
                return "".join(parts)
            offset = page.next_offset

    def outputs(self, run_id: str, attempt: int | None = None) -> Plan[None]:
        """Emits every OutputFile of the run (of ``attempt``; default the latest), page after page."""
        cursor: str | None = None
        while True:
            query = {"cursor": cursor, "attempt": attempt}
            page = yield from self._get(OutputPage, f"/v1/runs/{quote_segment(run_id)}/outputs", query)
            for file in page.files:
                yield Emit(file)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def wait(self, run_id: str, timeout: float | None, poll: float, last: RunView | None = None) -> Plan[RunView]:
        """Read the run until it has ended, each read answered when it changes (from ``last``, the
        view already had). A state this release does not know (a newer one's) is not an end: it
        is warned of once, and named if the wait times out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        view = last if last is not None else (yield from self.get(run_id))
        warned = False
        while True:
            if view.state in TERMINAL_STATES:
                return view
            unknown = not isinstance(view.state, RunState)
            if unknown and not warned:
                warned = True
                warnings.warn(_unknown_state(view), RuntimeWarning, stacklevel=2)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                state = f"{str(view.state)!r} ({_unknown_state(view)})" if unknown else str(view.state)
                raise WaitTimeout(0, "wait_timeout", f"run {run_id} is still {state} after {timeout:g}s")
            path = f"/v1/runs/{quote_segment(run_id)}"
            view = yield from self._watch(
                RunView, path, view, self._longest(left), poll if left is None else min(poll, left)
            )

    def follow(self, run_id: str, streams: tuple[str, ...], poll: float) -> Plan[RunView]:
        """Emits ``StateSeen`` when the run's state (or why it waits) changes and ``(stream,
        text)`` as the streams grow: whole lines while the run goes, the rest once it has ended
        and every stream has been read to its end; returns the final view."""
        if not streams or any(s not in ("stdout", "stderr") for s in streams):
            raise ValueError("streams must name stdout and/or stderr")
        readers = {s: _StreamReader() for s in streams}
        last: tuple[Any, ...] | None = None
        attempt: int | None = None
        path = f"/v1/runs/{quote_segment(run_id)}"
        view = yield from self.get(run_id)
        while True:
            if _seen(view) != last:
                last = _seen(view)
                yield Emit(StateSeen(view))
            if attempt is not None and view.attempt != attempt:
                for stream, reader in readers.items():  # the end of the attempt that is over, then the next one's
                    yield from self._read_on(run_id, stream, reader, attempt, ended=True)
                    yield from _emit(stream, reader.restart())
            attempt = view.attempt
            for stream, reader in readers.items():  # this attempt's own logs, whatever came since the read
                yield from self._read_on(run_id, stream, reader, attempt, ended=view.state in TERMINAL_STATES)
            if all(r.complete for r in readers.values()):
                if view.state not in TERMINAL_STATES:  # complete: it ended, or goes again, since the read
                    view = yield from self.get(run_id)
                    if _seen(view) != last:
                        last = _seen(view)
                        yield Emit(StateSeen(view))
                if view.state in TERMINAL_STATES and view.attempt == attempt:
                    return view
            # a queued run writes no logs: its next read waits for it to change; a going one's
            # waits ``poll`` at most, so that its logs are read that often
            wait = self._longest() if view.state == RunState.QUEUED else poll
            view = yield from self._watch(RunView, path, view, wait, poll)

    def _read_on(self, run_id: str, stream: str, reader: _StreamReader, attempt: int, ended: bool) -> Plan[None]:
        """Read ``stream`` of ``attempt`` as far as it goes now. Before its first attempt a run has
        no logs: none are read (a read of the latest could meet the first attempt's, which are
        read from their start once the run shows it), and the stream is complete if it ``ended``."""
        if attempt == 0:
            reader.complete = ended
            return
        while not reader.complete:
            page = yield from self.logs(run_id, stream, reader.offset, attempt)
            yield from _emit(stream, reader.add(page))
            if not page.data:
                return

    def download(self, run_id: str, dest: Path | str, force: bool, progress: Progress | None) -> Plan[list[Path]]:
        """Every output file under ``dest``. Checks all of them before writing any: a path that
        leaves ``dest`` or an existing file of another size (unless ``force``, or under ``live/``:
        ``overwrites``) raises DownloadFailed and nothing is written."""
        root = Path(dest).resolve()
        files: list[OutputFile] = yield from collect(self.outputs(run_id))
        targets = [output_target(root, f, overwrites(f, force)) for f in files]
        total = sum(f.size for f in files)
        done = 0

        def advance(n: int, _: int | None) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total)

        for file, target in zip(files, targets, strict=True):
            yield Fetch(file.url, target, overwrites(file, force), advance)
        return targets

    def checkpoint(self, run_id: str) -> Plan[CheckpointPage]:
        """The run's newest checkpoint (else the one it starts from) whole: its files of every page in
        one CheckpointPage (``next_cursor`` None). A newer checkpoint that replaces it between two
        pages (409) starts the listing again, up to ``CHECKPOINT_READS`` times in all."""
        path = f"/v1/runs/{quote_segment(run_id)}/checkpoint"
        for tried in range(1, CHECKPOINT_READS + 1):
            first = yield from self._get(CheckpointPage, path, {"limit": MAX_CHECKPOINT_PAGE})
            files, cursor = list(first.files), first.next_cursor
            try:
                while cursor:
                    page = yield from self._get(CheckpointPage, path, {"limit": MAX_CHECKPOINT_PAGE, "cursor": cursor})
                    files += page.files
                    cursor = page.next_cursor
            except Conflict:
                if tried == CHECKPOINT_READS:
                    raise
                continue
            return first.model_copy(update={"files": files, "next_cursor": None})
        raise AssertionError("unreachable")

    def download_checkpoint(
        self, run_id: str, dest: Path | str, force: bool, progress: Progress | None
    ) -> Plan[list[Path]]:
        """Every file and directory of the run's checkpoint (``checkpoint``) under ``dest``, each file
        with its permission bits. Checks all of them before writing any, as ``download`` does (a path
        that leaves ``dest``, an existing file of another size unless ``force``: DownloadFailed)."""
        root = Path(dest).resolve()
        page: CheckpointPage = yield from self.checkpoint(run_id)
        dirs = [dir_target(root, d) for d in page.dirs]
        targets = [output_target(root, f, force) for f in page.files]
        total, done = sum(f.size for f in page.files), 0

        def advance(n: int, _: int | None) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total)

        for directory in dirs:
            directory.mkdir(parents=True, exist_ok=True)
        for file, target in zip(page.files, targets, strict=True):
            yield Fetch(file.url, target, force, advance)
            target.chmod(file.mode & PERMISSION_BITS)
        return targets


def _unknown_state(view: RunView) -> str:
    return (
        f"run {view.id} is in state {str(view.state)!r}, which this release of runplane does not know: "
        "waiting for one it knows (upgrade runplane to read it)"
    )


def _seen(view: RunView) -> tuple[Any, ...]:
    """What ``follow`` reports a change of."""
    return (view.state, view.waiting_reason, view.attempt, view.kill_requested)


def _emit(stream: str, text: str) -> Generator[Step, Any, None]:
    if text:
        yield Emit((stream, text))


class _StreamReader:
    """One log stream as ``follow`` reads it: where it is, and the partial line it holds back."""

    def __init__(self) -> None:
        self.offset = 0
        self.complete = False
        self._held = ""

    def add(self, page: LogPage) -> str:
        """The text to hand over after ``page``: up to its last line end while more may come
        (everything once the stream is complete, or once the held part is long)."""
        self.offset, self.complete = page.next_offset, page.complete
        text = self._held + page.data
        if self.complete or len(text) >= LINE_HOLD:
            self._held = ""
            return text
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1
        self._held = text[cut:]
        return text[:cut]

    def restart(self) -> str:
        """Start over at offset 0 (the run's next attempt); what was held is handed over."""
        held, self._held, self.offset, self.complete = self._held, "", 0, False
        return held


def sessions_path(run_id: str, session_id: str | None = None) -> str:
    """Where a run's sessions are; ``session_id``: that one."""
    path = f"/v1/runs/{quote_segment(run_id)}/sessions"
    return path if session_id is None else f"{path}/{quote_segment(session_id)}"
