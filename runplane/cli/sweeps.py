"""``runplane sweep run|status|ls|kill|retry``: many runs from one command, and their progress."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from runplane.api.models import SweepView
from runplane.cli.common import CliError, ExitCode, cell, client, err, id_column, out, print_json, when
from runplane.cli.flag_errors import said_by_flags
from runplane.cli.run_options import command_line, run_flags
from runplane.cli.uploads import UPLOAD, send
from runplane.client import RunOptions, RunState, Sweep

app = typer.Typer(no_args_is_help=True, help="Sweeps: one run per point of a parameter grid.")
JSON = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]
SWEEP_ID = Annotated[str, typer.Argument(metavar="SWEEP", help="sweep id")]
POLL = 1.0
ORDER = ["succeeded", "failed", "timed_out", "killed", "running", "uploading", "preparing", "queued"]
COLOURS = {"succeeded": "green", "failed": "red", "timed_out": "red", "killed": "yellow", "running": "cyan"}
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
MAX_RANGE = 10_000


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="sweep")


def parse_param(text: str) -> tuple[str, list[str]]:
    """``NAME=v1,v2`` or ``NAME=A..B`` (the integers A to B) -> (NAME, values as typed). Raises
    CliError for anything else."""
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise CliError(f"--param must look like NAME=V1,V2 or NAME=A..B, got {text!r}")
    found = _RANGE.fullmatch(spec)
    if found:
        low, high = int(found.group(1)), int(found.group(2))
        if high < low or high - low >= MAX_RANGE:
            raise CliError(f"--param {name}: the range {spec} must go up and hold at most {MAX_RANGE} values")
        return name, [str(v) for v in range(low, high + 1)]
    values = spec.split(",")
    if any(not v for v in values):
        raise CliError(f"--param {name}: an empty value in {spec!r}")
    return name, values


@run_flags(leave_out=frozenset({"name", "interactive", "tty"}))  # --name names the sweep; no interactive sweeps
def run(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(help="the command after --, run with sh -c")],
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="NAME=V1,V2 or NAME=A..B (integers): a grid axis, given to each run as $NAME; repeatable",
        ),
    ] = None,
    count: Annotated[int | None, typer.Option(min=1, help="runs per grid point (or in all, with no --param)")] = None,
    max_parallel: Annotated[int | None, typer.Option(min=1, help="at most this many runs out at once")] = None,
    name: Annotated[str | None, typer.Option(help="a name for the sweep")] = None,
    *,
    options: RunOptions,
    upload: UPLOAD = None,
    idempotency_key: Annotated[str | None, typer.Option(help="retrying with the same key never makes two")] = None,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="show progress until it has finished")] = False,
    as_json: JSON = False,
) -> None:
    """Make a sweep: one run of COMMAND per combination of --param values (times --count). Each
    run gets its values as environment variables, and RUNPLANE_SWEEP_ID and RUNPLANE_SWEEP_INDEX;
    the run options (--image, --memory, --attempts, ...) apply to each run."""
    parameters = dict(parse_param(p) for p in param or [])
    if len(parameters) != len(param or []):
        raise CliError("each --param NAME may be given once")
    api = client(ctx)
    options = send(api, upload, options)
    with said_by_flags():
        made = api.submit_sweep(
            command_line(command),
            parameters=parameters or None,
            count=count,
            max_parallel=max_parallel,
            sweep_name=name,
            idempotency_key=idempotency_key,
            **options,
        )
    if not made.created:
        err.print(f"already made as {made.id} (same --idempotency-key)", markup=False, highlight=False)
    if not wait:
        if as_json:
            print_json(made.view)
            return
        out.print(made.id, highlight=False)
        hint = f"{made.view.size} runs in pool {made.view.queue} — follow with: runplane sweep status {made.id}"
        err.print(hint, style="dim", markup=False, highlight=False)
        return
    final = _follow(made)
    if as_json:
        print_json(final.view)
    raise typer.Exit(_exit_code(final.view))


def _exit_code(view: SweepView) -> int:
    if view.finished_at is None:
        return ExitCode.OK
    return ExitCode.OK if view.counts.get(RunState.SUCCEEDED, 0) == view.size else ExitCode.RUN_FAILED


def summary(view: SweepView) -> str:
    """One line: the members by state (and, for the ones not released, how many wait)."""
    parts = [f"{view.counts.get(RunState(s), 0)} {s}" for s in ORDER if view.counts.get(RunState(s))]
    line = f"{view.id}: " + ", ".join(parts) + f" of {view.size}"
    if view.waiting:
        line += f" ({view.waiting} not released yet)"
    if view.waiting_for:
        line += f"; {view.waiting_for}"
    if view.failures:
        line += "; failures: " + ", ".join(f"{r.value} {n}" for r, n in sorted(view.failures.items()))
    return line


def _follow(sweep: Sweep) -> Sweep:
    """Show a bar per state until the sweep has finished (on a terminal), else a line whenever
    the counts change. Ctrl-C stops following; the sweep goes on."""
    try:
        if not err.is_terminal:
            shown = ""

            def line(current: Sweep) -> None:
                nonlocal shown
                text = summary(current.view)
                if text != shown:
                    err.print(text, markup=False, highlight=False, soft_wrap=True)
                    shown = text

            line(sweep)
            return sweep.wait(poll=POLL, on_progress=line)
        with Progress(
            TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(), console=err, transient=False
        ) as progress:
            tasks = {
                state: progress.add_task(Text(state, style=COLOURS.get(state, "")).markup, total=sweep.view.size)
                for state in ORDER
            }

            def bars(current: Sweep) -> None:
                for state, task in tasks.items():
                    progress.update(task, completed=current.view.counts.get(RunState(state), 0))

            bars(sweep)
            return sweep.wait(poll=POLL, on_progress=bars)
    except KeyboardInterrupt:
        err.print(f"stopped following {sweep.id}; it goes on (runplane sweep kill {sweep.id} stops it)")
        raise typer.Exit(130) from None


def status(
    ctx: typer.Context,
    sweep_id: SWEEP_ID,
    once: Annotated[bool, typer.Option("--once", help="print the counts once, do not follow")] = False,
    as_json: JSON = False,
) -> None:
    """Show a sweep's members by state and its failures by reason; on a terminal, live until it
    has finished (--once: just now)."""
    found = client(ctx).sweep(sweep_id)
    if as_json:
        print_json(found.view)
        return
    if once or found.done or not err.is_terminal:
        out.print(summary(found.view), markup=False, highlight=False, soft_wrap=True)
        return
    final = _follow(found)
    out.print(summary(final.view), markup=False, highlight=False, soft_wrap=True)


def list_sweeps(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 20,
    as_json: JSON = False,
) -> None:
    """List your sweeps, newest first."""
    found = [s.view for s in client(ctx).sweeps(limit=limit)]
    if as_json:
        print_json({"sweeps": [v.model_dump(mode="json") for v in found]})
        return
    table = Table(id_column(), "name", "size", "succeeded", "failed", "open", "created", "finished")
    for v in found:
        failed = sum(v.counts.get(RunState(s), 0) for s in ("failed", "timed_out", "killed"))
        good = v.counts.get(RunState.SUCCEEDED, 0)
        row = (v.id, v.name, v.size, good, failed, v.size - good - failed, when(v.created_at), when(v.finished_at))
        table.add_row(*map(cell, row))
    out.print(table)


def kill(ctx: typer.Context, sweep_id: SWEEP_ID, as_json: JSON = False) -> None:
    """End every unfinished run of a sweep."""
    found = client(ctx).kill_sweep(sweep_id)
    if as_json:
        print_json(found.view)
        return
    out.print(summary(found.view), markup=False, highlight=False, soft_wrap=True)


def retry(ctx: typer.Context, sweep_id: SWEEP_ID, as_json: JSON = False) -> None:
    """Run again the members whose latest try failed, was killed or timed out."""
    found, again = client(ctx).retry_sweep(sweep_id)
    if as_json:
        print_json({**found.view.model_dump(mode="json"), "retried": again})
        return
    if not again:
        err.print(f"{sweep_id}: no member failed, was killed or timed out", markup=False, highlight=False)
    else:
        err.print(f"{again} members run again", markup=False, highlight=False)
    out.print(summary(found.view), markup=False, highlight=False, soft_wrap=True)


app.command(context_settings={"allow_interspersed_args": False})(run)
app.command()(status)
app.command("ls")(list_sweeps)
app.command()(kill)
app.command()(retry)
