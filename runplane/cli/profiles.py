"""``runplane login`` and ``runplane profiles``: named API URLs and tokens in the config file."""

from __future__ import annotations

import getpass
import os
import sys
from typing import Annotated

import typer
from rich.table import Table

from runplane.cli.common import CliError, Options, cell, err, one_line, out, print_json
from runplane.client import Client, load_profile, save_profile
from runplane.client.config import DEFAULT_PROFILE, list_profiles


def register(app: typer.Typer) -> None:
    app.command()(login)
    app.command()(profiles)


def login(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(metavar="URL", help="the API's URL, e.g. https://runplane.example.com")],
    token: Annotated[
        str | None,
        typer.Option(help="the API token (default: $RUNPLANE_TOKEN, else read from stdin without echo)"),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile", "-p", help="save as this profile (default: runplane --profile, $RUNPLANE_PROFILE, default)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the profile saved and who it acts for")] = False,
) -> None:
    """Check a token against the API and save URL and token as a profile (file mode 0600)."""
    options = ctx.find_object(Options) or Options()
    name = profile or options.profile or os.environ.get("RUNPLANE_PROFILE") or DEFAULT_PROFILE
    secret = token or os.environ.get("RUNPLANE_TOKEN") or _read_token()
    try:
        api = Client(url, secret)
    except ValueError as e:  # a URL that is not http(s), a token no header can carry
        raise CliError(one_line(str(e))) from None
    with api:
        me = api.me()  # a token the API refuses is never saved
    try:
        path = save_profile(name, api.url, secret)
    except ValueError as e:
        raise CliError(one_line(str(e))) from None
    if as_json:
        print_json({"profile": name, "url": api.url, "config": str(path), "me": me.model_dump(mode="json")})
        return
    groups = f" (groups: {', '.join(me.groups)})" if me.groups else ""
    err.print(
        f"logged in to {api.url} as {me.user}{groups}; saved as profile {name!r} in {path}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _read_token() -> str:
    """The token from the terminal without echo, or the first line of stdin when it is not one."""
    secret = (getpass.getpass("token: ") if sys.stdin.isatty() else sys.stdin.readline()).strip()
    if not secret:
        raise CliError("no token: give --token, set RUNPLANE_TOKEN, or type it when asked")
    return secret


def profiles(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help='print [{"name", "url", "current"}, ...]')] = False,
) -> None:
    """List the saved profiles: name and URL (never their tokens); * marks the one in use."""
    options = ctx.find_object(Options) or Options()
    try:
        saved = list_profiles()
    except ValueError as e:  # a config file that cannot be read
        raise CliError(one_line(str(e))) from None
    try:
        current = load_profile(options.profile)
    except ValueError:  # the profile asked for is not there: none is in use
        current = None
    rows = [{"name": p.name, "url": p.url, "current": current is not None and p.name == current.name} for p in saved]
    if as_json:
        print_json(rows)
        return
    if not rows:
        err.print("no profiles yet: runplane login URL makes one", markup=False, highlight=False)
        return
    table = Table("", "name", "url")
    for row in rows:
        table.add_row(*map(cell, ("*" if row["current"] else "", row["name"], row["url"])))
    out.print(table)
