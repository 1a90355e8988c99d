"""``--upload DIR[:NAME]`` of ``runplane run`` and ``runplane sweep run``: each directory packed and
sent (a progress bar on a terminal; nothing sent when the stack holds the same content already),
then named as the run's input NAME, read-only at ``/inputs/NAME``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from runplane.cli.common import CliError, err, transfer_bar
from runplane.client import Client, PackError, RunOptions, Upload
from runplane.client._uploads import with_uploads
from runplane.domain.runs import INPUT_NAME_PATTERN

UPLOAD = Annotated[
    list[str] | None,
    typer.Option(
        "--upload",
        "-u",
        metavar="DIR[:NAME]",
        help="a local directory the run reads at /inputs/NAME (NAME: the directory's name unless given); "
        "what its .gitignore and .runplaneignore name is left out; sent once per content; repeatable",
        show_default=False,
    ),
]


def upload_arg(value: str) -> tuple[str, Path]:
    """The input name and directory of ``DIR[:NAME]`` (a last ``:`` part that is not a name is
    part of the directory)."""
    head, sep, tail = value.rpartition(":")
    if sep and head and _is_name(tail):
        return tail, Path(head)
    path = Path(value)
    name = path.expanduser().resolve().name
    if not _is_name(name):
        raise CliError(f"--upload {value}: {name!r} cannot name an input; give one: --upload {value}:NAME")
    return name, path


def _is_name(text: str) -> bool:
    return re.fullmatch(INPUT_NAME_PATTERN, text) is not None


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def send(api: Client, values: list[str] | None, options: RunOptions, quiet: bool = False) -> RunOptions:
    """``options`` with each ``--upload`` sent and named among its inputs; says on stderr what
    was sent ("uploaded code (2.1 MB)") or was there already ("code: already uploaded")."""
    if not values:
        return options
    wanted = [upload_arg(v) for v in values]
    names = [n for n, _ in wanted]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CliError(f"--upload names {', '.join(twice)} twice: give each upload its own :NAME")
    sources: dict[str, str] = {}
    for name, directory in wanted:
        done = _upload(api, name, directory, quiet)
        sources[name] = done.source
        if not quiet:
            line = f"uploaded {name} ({megabytes(done.size)})" if done.sent else f"{name}: already uploaded"
            err.print(line, markup=False, highlight=False)
    try:
        return with_uploads(options, sources)
    except ValueError as e:
        raise CliError(str(e)) from None


def _upload(api: Client, name: str, directory: Path, quiet: bool) -> Upload:
    try:
        if quiet or not err.is_terminal:
            return api.upload(directory)
        with transfer_bar(f"uploading {name}") as progress:
            return api.upload(directory, progress=progress)
    except PackError as e:
        raise CliError(f"--upload {directory}: {e}") from None
