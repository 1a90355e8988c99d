"""``runplane secret set|ls|rm``: values a run needs but no one may read back (API keys, registry
logins). A run names them (``runplane run --secret ENV=NAME``); no command, and no route of the
API, ever shows a value again, to anyone.

``set`` reads the value from ``--from-file`` (the file's bytes as they are), from stdin when it is
piped (one trailing newline taken off, as ``echo x |`` and ``printf 'x\\n' |`` add one), or from
the terminal, asked twice without echo. An empty value is refused.
"""

from __future__ import annotations

import getpass
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from runplane.api.tenancy_models import SecretView
from runplane.cli.common import CliError, cell, client, dumps, err, out, print_json, when

JSON = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]
NAME = Annotated[
    str,
    typer.Argument(metavar="NAME", help="the secret's name: lower-case letters, digits, '_', '.', '-'"),
]
GROUP = Annotated[
    str | None,
    typer.Option(
        "--group",
        "-g",
        help="the group's secret, not yours (administrators): runs of the group's members name it GROUP/NAME",
        show_default=False,
    ),
]

secret_app = typer.Typer(
    no_args_is_help=True,
    help="Secrets runs use by name (runplane run --secret ENV=NAME): set, list, remove. No one reads a value back.",
)


def register(app: typer.Typer) -> None:
    app.add_typer(secret_app, name="secret")


def strip_newline(text: str) -> str:
    """``text`` less one trailing line end (``\\n`` or ``\\r\\n``): what ``echo`` and a heredoc add."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text.removesuffix("\n")


def _read_file(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise CliError(f"{path} is not UTF-8 text: a secret is text (base64 a binary key first)") from None


def _read_terminal(name: str) -> str:
    value = getpass.getpass(f"value of {name} (not shown): ")
    if value and getpass.getpass("again: ") != value:
        raise CliError("the two values differ: nothing was set")
    return value


def read_value(name: str, from_file: str | None) -> str:
    """The value to set: ``from_file``'s text, stdin's less one trailing newline, or typed twice at
    the terminal. Raises CliError (one line, never the value) for an empty one."""
    if from_file is not None:
        value, where = _read_file(from_file), from_file
    elif sys.stdin is not None and sys.stdin.isatty():
        value, where = _read_terminal(name), "the terminal"
    else:
        try:
            value, where = strip_newline(sys.stdin.read() if sys.stdin is not None else ""), "stdin"
        except UnicodeDecodeError:
            raise CliError("stdin is not UTF-8 text: a secret is text (base64 a binary key first)") from None
    if not value:
        raise CliError(f"the value from {where} is empty: nothing was set")
    return value


@secret_app.command("set")
def secret_set(
    ctx: typer.Context,
    name: NAME,
    group: GROUP = None,
    from_file: Annotated[
        str | None,
        typer.Option(
            "--from-file",
            "-f",
            metavar="FILE",
            help="the value is FILE's text, as it is (else stdin less one trailing newline, or typed at the terminal)",
            show_default=False,
        ),
    ] = None,
    as_json: JSON = False,
) -> None:
    """Set secret NAME (yours, or --group's) to a value read from stdin, a file or the terminal;
    runs that start afterwards get it. The value is never shown again."""
    value = read_value(name, from_file)
    view = client(ctx).set_secret(name, value, group=group)
    if as_json:
        print_json(view)
        return
    err.print(Text(f"{view.ref}: set ({view.size} bytes); a run uses it with --secret ENV={view.ref}"), highlight=False)


def updated(view: SecretView) -> str:
    return when(datetime.fromtimestamp(view.updated_at, UTC))


@secret_app.command("ls")
def secret_ls(ctx: typer.Context, group: GROUP = None, as_json: JSON = False) -> None:
    """The secrets you may use, yours and your groups' (--group: that group's, administrators):
    names, sizes and who set them when, never values."""
    found = client(ctx).secrets(group=group)
    if as_json:
        print_json({"secrets": dumps(found)})
        return
    if not found:
        err.print("no secrets", highlight=False)
        return
    table = Table("ref", "scope", "size", "updated", "by")
    for s in found:
        table.add_row(*map(cell, (s.ref, f"{s.scope} {s.owner}", s.size, updated(s), s.updated_by)))
    out.print(table)


@secret_app.command("rm")
def secret_rm(ctx: typer.Context, name: NAME, group: GROUP = None, as_json: JSON = False) -> None:
    """Remove secret NAME (yours, or --group's): runs that start afterwards and name it fail
    secret_unavailable; runs already going keep the value they were given."""
    client(ctx).delete_secret(name, group=group)
    ref = f"{group}/{name}" if group else name
    if as_json:
        print_json({"ref": ref, "deleted": True})
        return
    err.print(Text(f"{ref}: removed"), highlight=False)
