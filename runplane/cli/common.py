"""What every command module shares: the two consoles, the exit codes, the error a command raises
for a one-line message, JSON and table output, and the API client of the current invocation."""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Column
from rich.text import Text

from runplane.api.models import RunView
from runplane.client import (
    ApiError,
    BadRequest,
    Client,
    DownloadFailed,
    InvalidRequest,
    QuotaExceeded,
    load_profile,
)
from runplane.domain.retention import read_retention
from runplane.settings import problems

out = Console()
err = Console(stderr=True, soft_wrap=True)
"""stderr: each hint, state and error is one line however long, never wrapped at the width of a
terminal or at 80 columns in a pipe (a run id stays on the line of the command it goes with)."""

WIDE = 100_000
"""The width of stdout when it is not a terminal: a pipe or a file gets every table row on one
line, never cut or wrapped at 80 columns."""


class ExitCode(enum.IntEnum):
    """How ``runplane`` exits (README.md lists these; ``runplane --help`` too)."""

    OK = 0
    UNEXPECTED = 1
    """runplane itself failed unexpectedly (a bug: RUNPLANE_DEBUG=1 shows the traceback)."""
    USAGE = 2
    """A bad flag or value, checked here or answered 400/422 by the API; no run id and no last run."""
    REFUSED = 3
    """The API refused the request: 401, 403, 404, 409, 413, 429, a quota."""
    UNREACHABLE = 4
    """The API could not be reached or failed (network, timeout, 5xx after retries)."""
    RUN_FAILED = 5
    """Under --wait: the run failed without an exit code of its own, or despite exit 0."""
    TIMED_OUT = 124
    KILLED = 137


class CliError(Exception):
    """An error said in one line on stderr; the process exits with ``exit_code`` (a usage error
    unless told otherwise)."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


EXIT_BY_STATE = {"killed": ExitCode.KILLED, "timed_out": ExitCode.TIMED_OUT}


def exit_code(view: RunView) -> int:
    """What ``run --wait`` exits with for a run that ended as ``view`` says (README.md's table)."""
    if view.state == "succeeded":
        return ExitCode.OK
    if view.state in EXIT_BY_STATE:
        return EXIT_BY_STATE[view.state]
    if view.exit_code is not None and view.exit_code & 0xFF:
        return view.exit_code & 0xFF
    return ExitCode.RUN_FAILED  # no exit code of its own (image_not_found, …) or exit 0 (upload_failed)


@dataclass(frozen=True)
class Options:
    """The global options of one invocation (``ctx.obj``)."""

    profile: str | None = None


def error_exit_code(e: ApiError) -> ExitCode:
    """The exit code for an error of the API or of reaching it (README.md's table)."""
    if isinstance(e, QuotaExceeded):
        return ExitCode.REFUSED
    if isinstance(e, BadRequest | InvalidRequest):
        return ExitCode.USAGE
    if isinstance(e, DownloadFailed) and e.code == "exists":  # refused here: --force or another DEST
        return ExitCode.USAGE
    if isinstance(e, DownloadFailed) and e.code == "unsafe_path":  # an output path that leaves DEST
        return ExitCode.REFUSED
    if 400 <= e.status < 500:
        return ExitCode.REFUSED
    return ExitCode.UNREACHABLE  # no answer, a 5xx after retries, an answer that is not the API's


def client(ctx: typer.Context) -> Client:
    """The API client of this invocation. ``--profile NAME`` takes that profile's URL and token
    over RUNPLANE_API_URL/RUNPLANE_TOKEN (the flag is the more specific choice); otherwise the SDK
    resolves them: the environment, RUNPLANE_PROFILE or the default profile, a running
    ``runplane dev``."""
    options = ctx.find_object(Options) or Options()
    try:
        if options.profile is None:
            return Client()
        profile = load_profile(options.profile)  # ValueError when there is no such profile
        if profile is None:
            return Client(profile=options.profile)
        return Client(profile.url, profile.token, profile=options.profile)
    except ValueError as e:  # a bad URL, profile name or config file
        raise CliError(one_line(str(e))) from None


def configure_output() -> None:
    """Size stdout for where it goes: the terminal's width on a terminal, unlimited elsewhere."""
    out.width = None if out.is_terminal else WIDE  # type: ignore[assignment]  # None: measure the terminal


def one_line(message: str) -> str:
    """``message`` on a single line (errors are always one line)."""
    return " ".join(message.split())


def say_error(message: str) -> None:
    err.print(f"error: {one_line(message)}", markup=False, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """``data`` as JSON on stdout: plain (no colours, no wrapping), one document."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    print(json.dumps(data, indent=2), flush=True)


def dumps(models: list[Any]) -> list[Any]:
    return [m.model_dump(mode="json") for m in models]


def cell(value: object) -> Text:
    """A table cell that shows ``value`` as it is (never read as rich markup)."""
    if value is None:
        return Text("")
    if isinstance(value, datetime):
        return Text(when(value))
    return Text(str(value))


def when(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def when_utc(moment: datetime) -> str:
    """A retention date as ``runplane`` says it: ``YYYY-MM-DD HH:MM UTC``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def deleted_by_retention(view: RunView, what: str) -> str | None:
    """``outputs deleted by retention on DATE`` (``what``: outputs or logs) for a run whose retention
    deleted them, for a listing that comes back empty; None when it did not."""
    if view.retention is None or what not in view.retention.deleted:
        return None
    at = view.retention.outputs_until if what == "outputs" else view.retention.logs_until
    return f"{view.id}: {what} deleted by retention" + ("" if at is None else f" on {when_utc(at)}")


def id_column(title: str = "id") -> Column:
    return Column(title, no_wrap=True, min_width=26)


@contextlib.contextmanager
def transfer_bar(description: str) -> Iterator[Callable[[int, int | None], None]]:
    """A transfer's bar on stderr (bytes, speed), gone once it ends: yields the ``progress=``
    callback the SDK's uploads and downloads take. For a terminal only: callers check ``err.is_terminal``."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=err, transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


RETENTION = Annotated[
    str | None,
    typer.Option(
        "--retention",
        envvar="RUNPLANE_RETENTION",
        show_envvar=True,
        metavar="JSON",
        help='how long what runs leave is kept, e.g. \'{"outputs": "30d", "logs": "30d", "runs": "180d", '
        '"uploads": "14d"}\' (docs/retention.md; a pool\'s retention goes over it); default: kept for good',
        show_default=False,
    ),
]


def retention_settings(ctx: typer.Context | None, text: str | None) -> dict[str, str]:
    """The stack settings of ``--retention`` (none when not given), the option of ``ctx``'s command.
    Raises CliError, one line naming what is wrong and where it came from: ``--retention``, or
    ``RUNPLANE_RETENTION`` when the option took it from the environment (as ``ctx`` says)."""
    if not text or not text.strip():
        return {}
    try:
        read_retention(text)
    except ValidationError as e:
        source = ctx.get_parameter_source("retention") if ctx is not None else None
        where = "RUNPLANE_RETENTION" if source is not None and source.name == "ENVIRONMENT" else "--retention"
        raise CliError(f"{where}: {problems(e)}") from None
    return {"retention": text}
