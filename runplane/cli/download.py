"""``runplane download``: a run's (or a sweep's) output files, or a run's checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from runplane.cli.common import CliError, client, deleted_by_retention, err, out, print_json, transfer_bar
from runplane.cli.last_run import RUN_ID, named_by_id, run_id_or_last
from runplane.client import Client, Run

Progress = Callable[[int, int | None], None]
"""A transfer's ``progress=`` callback (``transfer_bar``'s)."""


def download(
    ctx: typer.Context,
    run_id: RUN_ID = None,
    dest: Annotated[Path, typer.Argument(metavar="DEST", help="directory to write the outputs into")] = Path(),
    force: Annotated[
        bool, typer.Option("--force", help="overwrite files that differ (live/ files are written over always)")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help='print {"files": [...]}, the files written')] = False,
    sweep: Annotated[
        str | None,
        typer.Option("--sweep", help="a sweep's outputs instead: member N's in DEST/N", show_default=False),
    ] = None,
    checkpoint: Annotated[
        bool,
        typer.Option(
            "--checkpoint",
            help="the run's newest checkpoint instead (its files and directories, with their permissions)",
        ),
    ] = False,
) -> None:
    """Download a run's output files, or its checkpoint (a progress bar on a terminal; the paths
    written on stdout)."""
    if checkpoint and sweep is not None:
        raise CliError("--checkpoint is a run's: give a run, not --sweep")
    if checkpoint:
        download_checkpoint(ctx, run_id, dest, force, as_json)
        return
    if sweep is not None:
        if run_id is not None and dest != Path():
            raise CliError("give a run or --sweep SWEEP, not both (runplane download --sweep SWEEP DEST)")
        if run_id is not None:  # the one argument is DEST
            dest = Path(run_id)
        said(download_sweep(client(ctx), sweep, dest, force), as_json)
        return
    found, written = transferred(
        ctx, run_id, as_json, "outputs", lambda run, progress: run.download(dest, force=force, progress=progress)
    )
    note: str | None = None
    if not written:
        gone = deleted_by_retention(found.view, "outputs")
        note = gone or f"{found.id}: no output files" + ("" if found.done else " yet (the run has not finished)")
    elif not found.done:  # a run that goes: its live/ files as last uploaded
        note = f"{found.id} is still {found.view.state}: these are its outputs so far"
    said(written, as_json, note)


def download_checkpoint(ctx: typer.Context, run_id: str | None, dest: Path, force: bool, as_json: bool) -> None:
    found, written = transferred(
        ctx,
        run_id,
        as_json,
        "checkpoint",
        lambda run, progress: run.download_checkpoint(dest, force=force, progress=progress),
    )
    said(written, as_json, None if written else f"{found.id}: its checkpoint holds no files")


def transferred(
    ctx: typer.Context,
    run_id: str | None,
    as_json: bool,
    what: str,
    fetch: Callable[[Run, Progress | None], list[Path]],
) -> tuple[Run, list[Path]]:
    """The run ``run_id`` names (the last one when None) and the files ``fetch`` wrote of it: with a
    transfer bar of its ``what`` on a terminal (not for ``--json``)."""
    rid = run_id_or_last(run_id)
    with named_by_id(rid):
        found = client(ctx).get(rid)
        if err.is_terminal and not as_json:
            with transfer_bar(f"{found.id} {what}") as progress:
                return found, fetch(found, progress)
        return found, fetch(found, None)


def said(files: list[Path], as_json: bool, note: str | None = None) -> None:
    """The files written: ``{"files": [...]}`` for ``--json``, else ``note`` (if any) on stderr and
    their paths on stdout, one a line."""
    if as_json:
        print_json({"files": [str(p) for p in files]})
        return
    if note is not None:
        err.print(note, markup=False, highlight=False)
    for path in files:
        out.print(str(path), markup=False, highlight=False, soft_wrap=True)


def download_sweep(api: Client, sweep_id: str, dest: Path, force: bool) -> list[Path]:
    """Every released member's outputs (its latest try), member N's under ``dest/N``."""
    written: list[Path] = []
    for member in api.members(sweep_id):
        written.extend(member.download(dest / str(member.view.sweep_index), force=force))
    return written
