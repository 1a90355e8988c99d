"""The run that run commands default to: the last one ``runplane run`` submitted here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from runplane.cli.common import CliError, ExitCode
from runplane.client import NotFound

RUN_ID = Annotated[
    str | None, typer.Argument(metavar="RUN", help="run id (default: your last run)", show_default=False)
]


RUN_ID_SHAPE = re.compile(r"r-[0-9a-f]{24}")
"""What the API names a run (runplane.services.runs.run_id_for)."""


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


@contextmanager
def named_by_id(run_id: str) -> Iterator[None]:
    """A run not found under ``run_id`` when that is not the shape of a run id (a name, say) is said
    with a hint: runs are named by id."""
    try:
        yield
    except NotFound as e:
        if RUN_ID_SHAPE.fullmatch(run_id):
            raise
        hint = f"{e.message} (runs are named by id: r-...; runplane ls lists yours)"
        raise CliError(hint, ExitCode.REFUSED) from None
