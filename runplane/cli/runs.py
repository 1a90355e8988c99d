"""``runplane run``, ``status``, ``ls``, ``logs``, ``kill``, ``priority`` and ``download``: your runs."""

from __future__ import annotations

import enum
import json
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from runplane.api.models import LogPage, RunView
from runplane.cli.common import (
    CliError,
    ExitCode,
    cell,
    client,
    dumps,
    err,
    error_exit_code,
    id_column,
    out,
    print_json,
    say_error,
    when,
)
from runplane.client import ApiError, Client, Conflict, Run, RunState

JSON = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]
RUN_ID = Annotated[
    str | None, typer.Argument(metavar="RUN", help="run id (default: your last run)", show_default=False)
]
EXIT_BY_STATE = {"killed": ExitCode.KILLED, "timed_out": ExitCode.TIMED_OUT}
POLL = 0.3
"""Seconds between two reads of a log that has nothing new."""


class LiveState(enum.StrEnum):
    """The states of a run that has not ended: the ones ``kill --all`` looks in."""

    queued = "queued"
    preparing = "preparing"
    running = "running"
    uploading = "uploading"


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": False})(run)
    app.command()(status)
    app.command("ls")(list_runs)
    app.command()(logs)
    app.command()(kill)
    app.command()(priority)
    app.command()(download)


# --- the last run ------------------------------------------------------------------------------


def last_run_file() -> Path:
    return Path.home() / ".runplane" / "last_run"


def remember(run_id: str) -> None:
    """Note ``run_id`` as the run commands default to (best effort: a read-only home is fine)."""
    try:
        last_run_file().parent.mkdir(parents=True, exist_ok=True)
        last_run_file().write_text(run_id)
    except OSError:
        pass


def run_id_or_last(run_id: str | None) -> str:
    if run_id:
        return run_id
    try:
        last = last_run_file().read_text().strip()
    except OSError:
        last = ""
    if not last:
        raise CliError("no run id given and no previous run to default to")
    return last


# --- submitting and following ------------------------------------------------------------------


def command_line(words: list[str]) -> str:
    """The shell command for the words after ``--``: one word is a command line as it is
    (``runplane run -- 'make && ./train'``); several are quoted back as the user's shell split
    them, so that ``-- sh -c 'echo a b'`` runs ``sh -c 'echo a b'``, not ``sh -c echo a b``."""
    return words[0] if len(words) == 1 else shlex.join(words)


def pairs(values: list[str] | None, what: str) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} must look like NAME=VALUE, got {item!r}")
        result[key] = value
    return result


def run_ids(values: list[str] | None) -> list[str] | None:
    """The run ids of ``--after`` (repeatable, or comma-separated); None when none is given.
    The API checks each (yours, and not ended without success)."""
    ids = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    return ids or None


AFTER = Annotated[
    list[str] | None,
    typer.Option(
        "--after",
        help="a run of yours to wait for: it stays queued, holding no worker, until that run has succeeded "
        "(fails dependency_failed if it does not); repeatable or comma-separated",
        show_default=False,
    ),
]
AFTER_SWEEP = Annotated[
    str | None,
    typer.Option(help="a sweep of yours to wait for: until every member has succeeded", show_default=False),
]


def retry_rule(attempts: int | None, on: list[str] | None, memory_factor: float | None) -> dict[str, Any] | None:
    """The ``retry`` of a submit from ``--attempts``, ``--retry-on`` and ``--memory-factor`` (the
    API checks the reasons and the factor). Raises CliError for the last two without the first."""
    reasons = [r.strip() for item in on or [] for r in item.split(",") if r.strip()]
    if attempts is None:
        if reasons or memory_factor is not None:
            raise CliError("--retry-on and --memory-factor go with --attempts N")
        return None
    rule: dict[str, Any] = {"attempts": attempts, "on": reasons}
    if memory_factor is not None:
        rule["memory_factor"] = memory_factor
    return rule


def state_line(view: RunView) -> str:
    state = view.state
    if state == "queued":
        return f"queued: {view.waiting_reason or 'waiting for a worker'}"
    if state in ("preparing", "running", "uploading"):
        return f"{state} on worker {view.worker_id} (attempt {view.attempt})"
    if state == "succeeded":
        return "succeeded (exit 0)"
    if view.failure is None:
        return str(state)
    return f"{state}: {view.failure.reason} — {view.failure.message}".rstrip(" —")


def exit_code(view: RunView) -> int:
    """What ``run --wait`` exits with for a run that ended as ``view`` says (README.md's table)."""
    if view.state == "succeeded":
        return ExitCode.OK
    if view.state in EXIT_BY_STATE:
        return EXIT_BY_STATE[view.state]
    if view.exit_code is not None and view.exit_code & 0xFF:
        return view.exit_code & 0xFF
    return ExitCode.RUN_FAILED  # no exit code of its own (image_not_found, …) or exit 0 (upload_failed)


def follow(run: Run, streams: tuple[str, ...], *, show_states: bool, logs_to_stderr: bool = False) -> Run:
    """Write ``run``'s logs as they arrive (stdout to stdout and stderr to stderr, or both to
    stderr) and, with ``show_states``, each change of its state as a line on stderr, until it has
    ended and its logs are complete; ``run``, at its final state."""
    shown = ""

    def on_state(current: Run) -> None:
        nonlocal shown
        line = state_line(current.view)
        if show_states and line != shown:
            err.print(Text.assemble(("● ", "cyan"), line), highlight=False, soft_wrap=True)
            shown = line

    writers = {"stdout": sys.stdout, "stderr": sys.stderr}
    for stream, text in run.follow_chunks(streams, on_state=on_state, poll=POLL):
        writer = sys.stderr if logs_to_stderr else writers[stream]
        writer.write(text)
        writer.flush()
    return run  # follow_chunks has read it at its end (and reported that state)


def run(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(help="the command after --, run with sh -c (words keep quoting)")],
    image: Annotated[str | None, typer.Option(help="Docker image (default: the pool's)")] = None,
    cpus: Annotated[float | None, typer.Option(help="cpus, e.g. 0.5 or 4")] = None,
    gpus: Annotated[int | None, typer.Option(help="number of GPUs")] = None,
    memory: Annotated[str | None, typer.Option(help="memory, e.g. 512m or 8g")] = None,
    disk: Annotated[str | None, typer.Option(help="output disk, e.g. 10g")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="time limit, e.g. 90s, 2h")] = None,
    queue: Annotated[str | None, typer.Option(help="pool to run on (default: smallest that fits)")] = None,
    name: Annotated[str | None, typer.Option(help="a name for the run")] = None,
    tag: Annotated[str | None, typer.Option(help="only workers started with --tag TAG take it")] = None,
    group: Annotated[
        str | None, typer.Option(help="the group of yours it is charged to (default: your only group, if one)")
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=100,
            help="0..100 (default 50): starts before waiting runs of lower priority; "
            "above the pool's max_user_priority only for admins",
            show_default=False,
        ),
    ] = None,
    attempts: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=10,
            help="retry: the most times it goes, 1..10 (a lost worker is always retried within these)",
            show_default=False,
        ),
    ] = None,
    retry_on: Annotated[
        list[str] | None,
        typer.Option(
            "--retry-on",
            help="retry: a failure reason that runs it again (nonzero_exit, out_of_memory, …); repeatable or "
            "comma-separated; needs --attempts",
            show_default=False,
        ),
    ] = None,
    memory_factor: Annotated[
        float | None,
        typer.Option(
            help="retry: an out_of_memory attempt goes again with its memory times this; needs --attempts",
            show_default=False,
        ),
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V, repeatable")] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="NAME=s3://… or run:<id>, repeatable")
    ] = None,
    network: Annotated[bool, typer.Option("--network", help="give the run a network")] = False,
    after: AFTER = None,
    after_sweep: AFTER_SWEEP = None,
    idempotency_key: Annotated[str | None, typer.Option(help="retrying with the same key never makes two runs")] = None,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="stream logs and exit with the run's exit code")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the run as JSON (with --wait: the final run; logs go to stderr)")
    ] = False,
) -> None:
    """Submit a run; with --wait, follow it to its end and exit as it did."""
    environment, named_inputs = pairs(env, "--env"), pairs(inputs, "--input")
    retry = retry_rule(attempts, retry_on, memory_factor)
    submitted = client(ctx).submit(
        command_line(command),
        image=image,
        cpus=cpus,
        gpus=gpus,
        memory=memory,
        disk=disk,
        time=time_limit,
        queue=queue,
        name=name,
        tag=tag,
        group=group,
        priority=priority,
        retry=retry,
        env=environment or None,
        inputs=named_inputs or None,
        network=network,
        after=run_ids(after),
        after_sweep=after_sweep,
        idempotency_key=idempotency_key,
    )
    remember(submitted.id)
    if not submitted.created:  # the key named a run submitted before: this submit made nothing new
        line = f"already submitted as {submitted.id} (same --idempotency-key): {state_line(submitted.view)}"
        err.print(line, markup=False, highlight=False, soft_wrap=True)
    if not wait:
        if as_json:
            print_json(submitted.view)
            return
        out.print(submitted.id, highlight=False)
        if submitted.created:
            hint = f"{state_line(submitted.view)} — follow with: runplane logs -f {submitted.id}"
            err.print(hint, style="dim", markup=False, highlight=False)
        return
    if submitted.created:
        err.print(Text.assemble((submitted.id, "bold"), f" submitted to pool {submitted.queue}"), highlight=False)
    try:
        final = follow(submitted, ("stdout", "stderr"), show_states=True, logs_to_stderr=as_json)
    except KeyboardInterrupt:
        hint = f"stopped following {submitted.id}; it goes on (runplane kill {submitted.id} stops it)"
        err.print(hint, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    if as_json:
        print_json(final.view)
    raise typer.Exit(exit_code(final.view))


# --- looking at runs ---------------------------------------------------------------------------


def status(ctx: typer.Context, run_id: RUN_ID = None, as_json: JSON = False) -> None:
    """Show a run: state, reason, times, usage and its timeline."""
    view = client(ctx).get(run_id_or_last(run_id)).view
    if as_json:
        print_json(view)
        return
    table = Table.grid(padding=(0, 2))
    rows: list[tuple[str, object]] = [
        ("id", view.id),
        ("name", view.name),
        ("state", view.state),
        ("queue", view.queue),
        ("group", view.group),
        ("priority", view.priority),
        ("attempt", f"{view.attempt} of {view.max_attempts}" if view.attempt else None),
        ("retry", view.spec.retry and _rule_text(view.spec.retry.model_dump())),
        ("waiting_on", ", ".join(view.waiting_on) or None),
        ("worker_id", view.worker_id),
        ("exit_code", view.exit_code),
        ("created_at", view.created_at.isoformat()),
        ("started_at", view.started_at and view.started_at.isoformat()),
        ("finished_at", view.finished_at and view.finished_at.isoformat()),
        ("waiting", view.waiting_reason),
        ("failure", view.failure and f"{view.failure.reason}: {view.failure.message}"),
    ]
    usage = {k: v for k, v in view.usage.model_dump(mode="json").items() if v not in (None, {}, [])}
    rows += [("usage", json.dumps(usage) if usage else None), ("command", view.spec.command)]
    for key, value in rows:
        if value is not None:
            table.add_row(Text(key, style="bold"), cell(value))
    out.print(table)
    for event in view.events:
        out.print(Text.assemble("  ", (event.at.isoformat(), "dim"), " ", event.message), highlight=False)


def _rule_text(rule: dict[str, Any]) -> str:
    text = f"up to {rule['attempts']} attempts on {', '.join(rule['on']) or 'a lost worker only'}"
    return text + (f"; out_of_memory grows memory x{rule['memory_factor']:g}" if rule.get("memory_factor") else "")


def list_runs(
    ctx: typer.Context,
    state: Annotated[RunState | None, typer.Option(help="only runs in this state")] = None,
    queue: Annotated[str | None, typer.Option(help="only runs of this pool")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 20,
    cursor: Annotated[str | None, typer.Option(help="continue from a previous page")] = None,
    as_json: JSON = False,
) -> None:
    """List your runs, newest first."""
    page = client(ctx).runs_page(state=state, queue=queue, owner=None, limit=limit, cursor=cursor)
    if as_json:
        print_json(page)
        return
    table = Table(id_column(), "name", "state", "queue", "created", "exit", "reason")
    for r in page.runs:
        reason = r.failure.reason if r.failure else r.waiting_reason
        table.add_row(*map(cell, (r.id, r.name, r.state, r.queue, when(r.created_at), r.exit_code, reason)))
    out.print(table)
    if page.next_cursor:
        err.print(f"more: runplane ls --cursor {page.next_cursor}", style="dim", markup=False, highlight=False)


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
    api = client(ctx)
    rid = run_id_or_last(run_id)
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
    # following the latest attempt: read the attempt going now by its number, so that a retry
    # never reads the next attempt's logs from this one's offset; once it is over, the next one
    pinned = attempt
    while follow and not complete:
        if pinned is None:  # the latest attempt: which one is it?
            current = api.get(rid)
            if not current.view.attempt:  # none yet
                if current.done:
                    break
                time.sleep(POLL)
                continue
            pinned = current.view.attempt
        page = api.logs(rid, stream, offset, attempt=pinned)
        offset, complete = page.next_offset, page.complete
        if complete and attempt is None:
            current = api.get(rid)
            if not current.done:  # over, and the run goes again: wait for its next attempt
                complete = False
                if current.view.attempt > pinned:
                    pinned, offset = current.view.attempt, 0
                page = page.model_copy(update={"complete": False})
        if page.data or page.complete:
            _write_log(page.data, page.next_offset, page.complete, as_json)
        else:
            time.sleep(POLL)


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


# --- acting on runs ----------------------------------------------------------------------------


def kill(
    ctx: typer.Context,
    run_ids: Annotated[
        list[str] | None, typer.Argument(metavar="RUN", help="run ids (default: your last run)", show_default=False)
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="every run of yours that has not ended")] = False,
    state: Annotated[LiveState | None, typer.Option(help="with --all: only runs in this state")] = None,
    as_json: Annotated[bool, typer.Option("--json", help='print {"runs": [...]}, the runs as they are now')] = False,
) -> None:
    """Kill runs: their containers are stopped within seconds; partial outputs are still uploaded."""
    if every and run_ids:
        raise CliError("give run ids or --all, not both")
    if state is not None and not every:
        raise CliError("--state goes with --all")
    api = client(ctx)
    failed = ExitCode.OK
    if every:
        killed = _kill_all(api, [state] if state else list(LiveState))
        stopping = sum(1 for v in killed if v.state != "killed")
        summary = f"{len(killed)} run{'' if len(killed) == 1 else 's'} killed"
        err.print(summary + (f" ({stopping} still stopping)" if stopping else ""), highlight=False)
    else:
        killed = []
        for rid in run_ids or [run_id_or_last(None)]:
            try:
                view = api.kill(rid).view
            except ApiError as e:  # said, and the others are still killed; the exit code tells
                say_error(e.message)  # the API's message names the run
                failed = error_exit_code(e)
                continue
            killed.append(view)
            err.print(f"{view.id}: {'killed' if view.state == 'killed' else 'kill requested'}", highlight=False)
    if as_json:
        print_json({"runs": dumps(killed)})
    if failed:
        raise typer.Exit(failed)


def priority(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="run id")],
    value: Annotated[int, typer.Argument(metavar="N", min=0, max=100, help="the new priority, 0..100")],
    as_json: Annotated[bool, typer.Option("--json", help="print the run as it is now")] = False,
) -> None:
    """Change a queued run's priority: it moves in its pool's line at once (a user may go up to
    the pool's max_user_priority; an admin, to 100)."""
    view = client(ctx).set_priority(run_id, value).view
    if as_json:
        print_json(view)
        return
    err.print(f"{view.id}: priority {view.priority}", markup=False, highlight=False)


def _kill_all(api: Client, states: list[LiveState]) -> list[RunView]:
    """Kill every run of the caller's in ``states``; the runs killed (a run that ended meanwhile
    is left out)."""
    found = {r.id: r for s in states for r in api.runs(state=s)}
    killed = []
    for listed in found.values():
        try:
            killed.append(listed.kill().view)
        except Conflict:  # it ended between the listing and the kill
            continue
    return killed


def download(
    ctx: typer.Context,
    run_id: RUN_ID = None,
    dest: Annotated[Path, typer.Argument(metavar="DEST", help="directory to write the outputs into")] = Path(),
    force: Annotated[bool, typer.Option("--force", help="overwrite files that differ")] = False,
    as_json: Annotated[bool, typer.Option("--json", help='print {"files": [...]}, the files written')] = False,
    sweep: Annotated[
        str | None,
        typer.Option("--sweep", help="a sweep's outputs instead: member N's in DEST/N", show_default=False),
    ] = None,
) -> None:
    """Download a run's output files (a progress bar on a terminal; the paths written on stdout)."""
    if sweep is not None:
        if run_id is not None and dest != Path():
            raise CliError("give a run or --sweep SWEEP, not both (runplane download --sweep SWEEP DEST)")
        if run_id is not None:  # the one argument is DEST
            dest = Path(run_id)
        from runplane.cli.sweeps import download_sweep

        files = download_sweep(client(ctx), sweep, dest, force)
        if as_json:
            print_json({"files": [str(p) for p in files]})
            return
        for path in files:
            out.print(str(path), markup=False, highlight=False, soft_wrap=True)
        return
    found = client(ctx).get(run_id_or_last(run_id))
    if err.is_terminal and not as_json:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=err,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as progress:
            task = progress.add_task(f"{found.id} outputs", total=None)
            written = found.download(
                dest, force=force, progress=lambda done, total: progress.update(task, completed=done, total=total)
            )
    else:
        written = found.download(dest, force=force)
    if as_json:
        print_json({"files": [str(p) for p in written]})
        return
    if not written:
        err.print(f"{found.id}: no output files" + ("" if found.done else " yet (the run has not finished)"))
    for path in written:
        out.print(str(path), markup=False, highlight=False, soft_wrap=True)
