"""``runplane run``, ``status``, ``ls``, ``kill``, ``priority`` and ``keep``: your runs (``logs`` and
``download`` are registered here from their own modules)."""

from __future__ import annotations

import enum
import json
import shlex
import sys
from typing import Annotated, Any, cast

import typer
from rich.table import Table
from rich.text import Text

from runplane.api.models import RetentionView, RunView
from runplane.cli.common import (
    CliError,
    ExitCode,
    cell,
    client,
    dumps,
    err,
    error_exit_code,
    exit_code,
    id_column,
    out,
    print_json,
    say_error,
    when,
    when_utc,
)
from runplane.cli.download import download
from runplane.cli.flag_errors import said_by_flags
from runplane.cli.last_run import RUN_ID, named_by_id, remember, run_id_or_last
from runplane.cli.logs import POLL, logs
from runplane.cli.run_facts import checkpoint_text, fallback_text, pieces_text
from runplane.cli.run_options import command_line, run_flags
from runplane.cli.sessions import attach_run
from runplane.cli.uploads import UPLOAD, send
from runplane.client import ApiError, Client, Conflict, Run, RunOptions, RunState

JSON = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]


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
    app.command()(keep)
    app.command()(download)


# --- submitting and following ------------------------------------------------------------------


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


@run_flags()
def run(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(help="the command after --, run with sh -c (words keep quoting)")],
    *,
    options: RunOptions,
    upload: UPLOAD = None,
    idempotency_key: Annotated[str | None, typer.Option(help="retrying with the same key never makes two runs")] = None,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="stream logs and exit with the run's exit code")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the run as JSON (with --wait: the final run; logs go to stderr)")
    ] = False,
) -> None:
    """Submit a run; with --wait, follow it to its end and exit as it did. With -i (-it: and a
    terminal), wait for it to start, attach to its command, and exit as the run ended."""
    api = client(ctx)
    options = _interactive_options(options, command)
    options = send(api, upload, options)
    with said_by_flags():
        submitted = api.submit(command_line(command), idempotency_key=idempotency_key, **options)
    remember(submitted.id)
    if options.get("interactive"):
        raise typer.Exit(_attached(api, submitted))
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


def _interactive_options(options: RunOptions, command: list[str]) -> RunOptions:
    """``options`` as an interactive run is submitted: -t only where stdin and stdout are a terminal
    (else a warning, and none). Raises CliError for what reads as ``-i NAME=SOURCE`` (``--input``'s
    short flag before -i was --interactive)."""
    if options.get("interactive") and "--" in command[1:]:
        raise CliError("-i is --interactive (as docker run -i); an input is --input NAME=SOURCE")
    if options.get("tty") and not (sys.stdin.isatty() and sys.stdout.isatty()):
        err.print("warning: stdin or stdout is not a terminal; going on without one", markup=False, highlight=False)
        options = cast(RunOptions, {k: v for k, v in options.items() if k != "tty"})
    return options


def _attached(api: Client, run: Run) -> int:
    """``run -i``: wait for ``run`` to start (its states on stderr), attach to its command, and
    exit as the run ended (as --wait does); 0 when left with ``~.``, the run going on."""
    err.print(Text.assemble((run.id, "bold"), f" submitted to pool {run.queue}"), highlight=False)
    shown = ""
    try:
        while run.state != RunState.RUNNING and not run.done:
            line = state_line(run.view)
            if line != shown:
                err.print(Text.assemble(("● ", "cyan"), line), highlight=False, soft_wrap=True)
                shown = line
            run.refresh(wait=5)
    except KeyboardInterrupt:
        err.print(f"stopped waiting for {run.id}; runplane attach {run.id} joins it", markup=False, highlight=False)
        return 130
    joined = False
    if not run.done:
        try:
            status, ended = attach_run(api, run.id)
            joined = True
        except Conflict:  # 409: no longer running (it ended as it was read), or attached already
            if run.refresh().state == RunState.RUNNING:
                raise
    if joined:
        if not ended:
            return status
        run.wait()
    else:  # over before it could be joined: what it wrote, never shown, is in its logs
        follow(run, ("stdout", "stderr"), show_states=False)
    if run.state != RunState.SUCCEEDED:
        err.print(Text.assemble(("● ", "cyan"), state_line(run.view)), highlight=False, soft_wrap=True)
    return exit_code(run.view)


# --- looking at runs ---------------------------------------------------------------------------


def status(ctx: typer.Context, run_id: RUN_ID = None, as_json: JSON = False) -> None:
    """Show a run: state, reason, times, usage and its timeline."""
    rid = run_id_or_last(run_id)
    with named_by_id(rid):
        view = client(ctx).get(rid).view
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
        ("labels", ", ".join(f"{k}={v}" for k, v in view.spec.labels.items()) or None),
        ("retry", view.spec.retry and _rule_text(view.spec.retry.model_dump())),
        ("waiting_on", ", ".join(view.waiting_on) or None),
        ("worker_id", view.worker_id),
        ("exit_code", view.exit_code),
        ("created_at", view.created_at.isoformat()),
        ("started_at", view.started_at and view.started_at.isoformat()),
        ("finished_at", view.finished_at and view.finished_at.isoformat()),
        ("waiting", view.waiting_reason),
        ("failure", view.failure and f"{view.failure.reason}: {view.failure.message}"),
        ("retention", kept_until(view)),
        ("fallback", fallback_text(view)),
        ("checkpoint", checkpoint_text(view)),
        ("pieces", pieces_text(view)),
    ]
    usage = {k: v for k, v in view.usage.model_dump(mode="json").items() if v not in (None, {}, [])}
    rows += [("usage", json.dumps(usage) if usage else None), ("command", view.spec.command)]
    for key, value in rows:
        if value is not None:
            table.add_row(Text(key, style="bold"), cell(value))
    out.print(table)
    for event in view.events:
        out.print(Text.assemble("  ", (event.at.isoformat(), "dim"), " ", event.message), highlight=False)


def _retention_parts(kept: RetentionView, dated: str) -> list[str]:
    """What becomes of each of a run's outputs, logs and record: ``dated`` (a format of ``what`` and
    ``day``) for a date, else deleted (on its date, when known) or kept for good."""
    parts = []
    for what, at in (("outputs", kept.outputs_until), ("logs", kept.logs_until), ("record", kept.record_until)):
        if what in kept.deleted:
            parts.append(f"{what} deleted" + ("" if at is None else f" on {when_utc(at)}"))
        elif at is None:
            parts.append(f"{what} kept for good")
        else:
            parts.append(dated.format(what=what, day=when_utc(at)))
    return parts


def already_deleted(kept: RetentionView) -> str | None:
    """``outputs already deleted`` (logs likewise) for a run whose parts retention deleted before it
    was kept; None when nothing is."""
    gone = [what for what in ("outputs", "logs") if what in kept.deleted]
    return f"{' and '.join(gone)} already deleted" if gone else None


def kept_until(view: RunView) -> str | None:
    """The status line of how long the run's outputs, logs and record are kept (None: it has not ended
    and is not kept, or the stack does not say)."""
    if view.retention is None:
        return None
    if view.retention.kept:
        gone = already_deleted(view.retention)
        return f"kept (runplane keep --off {view.id} lets it go" + (f"; {gone})" if gone else ")")
    parts = _retention_parts(view.retention, "{what} until {day}")
    if all(p.endswith("kept for good") for p in parts):
        return "kept for good"
    return ", ".join(parts)


def _rule_text(rule: dict[str, Any]) -> str:
    text = f"up to {rule['attempts']} attempts on {', '.join(rule['on']) or 'a lost worker only'}"
    return text + (f"; out_of_memory grows memory x{rule['memory_factor']:g}" if rule.get("memory_factor") else "")


def list_runs(
    ctx: typer.Context,
    state: Annotated[RunState | None, typer.Option(help="only runs in this state")] = None,
    queue: Annotated[str | None, typer.Option(help="only runs of this pool")] = None,
    label: Annotated[
        str | None,
        typer.Option(help="only runs with this label, KEY=VALUE (a page may be short: --cursor goes on)"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 20,
    cursor: Annotated[str | None, typer.Option(help="continue from a previous page")] = None,
    user: Annotated[
        str | None, typer.Option("--user", metavar="USER", help="another user's runs (administrators)")
    ] = None,
    as_json: JSON = False,
) -> None:
    """List your runs (an administrator: --user's), newest first."""
    page = client(ctx).runs_page(state=state, queue=queue, owner=user, label=label, limit=limit, cursor=cursor)
    if as_json:
        print_json(page)
        return
    if not page.runs and not page.next_cursor:
        err.print("no runs", style="dim", highlight=False)
        return
    table = Table(id_column(), "name", "state", "queue", "created", "exit", "reason")
    for r in page.runs:
        reason = r.failure.reason if r.failure else r.waiting_reason
        table.add_row(*map(cell, (r.id, r.name, r.state, r.queue, when(r.created_at), r.exit_code, reason)))
    out.print(table)
    if page.next_cursor:
        filters = [*(["--user", user] if user else []), *(["--label", label] if label else [])]
        again = shlex.join(["runplane", "ls", *filters, "--cursor", page.next_cursor])
        err.print(f"more: {again}", style="dim", markup=False, highlight=False)


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


def keep(
    ctx: typer.Context,
    run_id: RUN_ID = None,
    off: Annotated[bool, typer.Option("--off", help="let it go: its pool's retention applies again")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the run as it is now")] = False,
) -> None:
    """Keep a run: its pool's retention deletes none of its outputs, logs or record until you let it
    go (--off). A run that has not ended may be kept."""
    rid = run_id_or_last(run_id)
    with named_by_id(rid):
        view = client(ctx).keep(rid, not off).view
    if as_json:
        print_json(view)
        return
    err.print(keep_line(view), markup=False, highlight=False, soft_wrap=True)


def keep_line(view: RunView) -> str:
    """What ``runplane keep`` says of the run it kept or let go."""
    if view.retention is not None and view.retention.kept:
        hint = f"runplane keep --off {view.id}"
        staying = [w for w in ("outputs", "logs", "record") if w not in view.retention.deleted]
        gone = already_deleted(view.retention)
        kept = " and ".join([", ".join(staying[:-1]), staying[-1]] if len(staying) > 2 else staying)
        stay = "stays" if len(staying) == 1 else "stay"
        return f"kept: run {view.id} (its {kept} {stay} until you let it go: {hint}" + (f"; {gone})" if gone else ")")
    if view.retention is None:
        return f"let go: run {view.id} (its pool's retention applies once it ends)"
    parts = _retention_parts(view.retention, "{what} deleted on {day}")
    if all(p.endswith("for good") for p in parts):
        return f"let go: run {view.id} (its pool keeps runs for good)"
    return f"let go: run {view.id}: " + ", ".join(parts)


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
