"""``runplane token create|ls|revoke`` and ``runplane user show|set`` (administrators) and
``runplane whoami``."""

from __future__ import annotations

import contextlib
import enum
import getpass
import os
import sqlite3
import stat
from typing import Annotated

import typer
from rich.table import Column, Table
from rich.text import Text

from runplane.adapters.local.db import DB_FILE, state_path
from runplane.api.tenancy_models import TokenCreated, UserView
from runplane.cli.common import CliError, cell, client, dumps, err, out, print_json
from runplane.devstack.state_dir import check_not_foreign

JSON = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]
USER = Annotated[str, typer.Argument(metavar="USER", help="the user")]

token_app = typer.Typer(no_args_is_help=True, help="Make, list and revoke API tokens (administrators).")
user_app = typer.Typer(no_args_is_help=True, help="A user's groups and default group (administrators).")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
    app.add_typer(user_app, name="user")
    app.command()(whoami)


class Scope(enum.StrEnum):
    """The API's scopes, as choices of ``--scope`` (runplane.domain.tenancy.SCOPES; a unit test
    holds the two together)."""

    read = "runs:read"
    write = "runs:write"
    admin = "admin"


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(metavar="USER", help="the user the token acts for", show_default=False)],
    group: Annotated[list[str] | None, typer.Option("--group", "-g", help="a group of the user, repeatable")] = None,
    scope: Annotated[
        list[Scope] | None, typer.Option("--scope", "-s", help="repeatable; default runs:read and runs:write")
    ] = None,
    expires: Annotated[str | None, typer.Option(help="lifetime, e.g. 30d or 12h (default: never)")] = None,
    direct: Annotated[
        bool,
        typer.Option(
            "--direct",
            help="write to the stack's token store with your cloud credentials and RUNPLANE_* settings "
            "instead of the API: how a deployed stack gets its first admin token",
        ),
    ] = False,
    state_dir: Annotated[
        str | None,
        typer.Option(
            "--state-dir",
            metavar="DIR",
            help="write to the database of the stack on this machine whose state directory is DIR (runplane serve's "
            "--state-dir, runplane dev's ~/.runplane/dev/PORT), as its user or root; implies --direct",
        ),
    ] = None,
    init: Annotated[
        bool,
        typer.Option(
            "--init",
            help="with --state-dir: make the stack's database there if it has none (an install, before the "
            "service first starts); without it, a directory that holds no stack's database is refused",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the token's record (and secret) as JSON")] = False,
) -> None:
    """Make a token for USER; its secret is printed once and stored only as a hash."""
    scopes = [s.value for s in scope] if scope else None
    if init and state_dir is None:
        raise CliError("--init makes the database of a stack on this machine: give its --state-dir DIR")
    if direct or state_dir is not None:
        made = _direct_token(user, group or [], scopes, expires, state_dir, init=init)
    else:
        made = client(ctx).create_token(user, groups=group or [], scopes=scopes, expires_in=expires)
    if as_json:
        print_json(made)
        return
    out.print(made.token, markup=False, highlight=False)
    expiry = f"expires {made.expires_at}" if made.expires_at else "does not expire"
    groups = f", groups {', '.join(made.groups)}" if made.groups else ""
    err.print(
        f"{made.id}: {made.user}, scopes {', '.join(made.scopes)}{groups}; {expiry}. "
        "The secret above is shown only now.",
        style="dim",
        markup=False,
        highlight=False,
    )


def _direct_token(
    user: str, groups: list[str], scopes: list[str] | None, expires: str | None, state_dir: str | None, *, init: bool
) -> TokenCreated:
    # The stack (boto3 or the Azure SDKs) is imported only here: the CLI's other commands need
    # none of it, and an install without it still runs them.
    from pydantic import ValidationError

    from runplane.api.views import token_view
    from runplane.bootstrap import build_stack
    from runplane.domain.errors import RunplaneError
    from runplane.services.tenancy import create_token
    from runplane.settings import StackSettings

    environ = dict(os.environ)
    if state_dir is not None:
        environ |= {"RUNPLANE_CLOUD": "local", "RUNPLANE_STATE_DIR": state_dir}
    try:
        settings = StackSettings.from_env(environ)
        if settings.cloud == "local":
            _check_database(settings.state_dir, init=init)
        stack = build_stack(settings)
        made = create_token(
            stack.ports,
            user=user,
            groups=groups,
            scopes=scopes,
            expires_in=expires,
            created_by=f"{getpass.getuser()} (runplane token create --direct)",
        )
    except RunplaneError as e:
        raise CliError(e.message) from None
    except ValidationError as e:  # a bad RUNPLANE_* setting
        first = e.errors()[0]
        where = "RUNPLANE_" + "_".join(str(p) for p in first["loc"]).upper()
        raise CliError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
    except ValueError as e:  # a pools file that cannot be read
        raise CliError(str(e).splitlines()[0]) from None
    return TokenCreated(**token_view(made.token).model_dump(), token=made.secret)


def _check_database(state_dir: str, *, init: bool) -> None:
    """Raise CliError (one line) unless ``state_dir`` holds a runplane stack's database that this
    user may read and write (``init``: or none yet, nor the directory). Nothing is created: a token
    goes into the database of a stack, never into an empty one made here by a mistyped path."""
    root = state_path(state_dir)
    hint = "give the state directory of a stack: runplane serve's --state-dir (default /var/lib/runplane) or "
    hint += "runplane dev's ~/.runplane/dev/PORT"
    denied = f"cannot read and write {root}: run as the service's user or root"
    database = root / DB_FILE
    try:
        if not stat.S_ISDIR(root.stat().st_mode):
            raise CliError(f"{root} is not a directory: {hint}")
        if not os.access(root, os.R_OK | os.W_OK | os.X_OK):
            raise CliError(denied)
        if not database.exists() and init:
            try:
                check_not_foreign(root)  # a mistyped path (/etc) is neither written in nor made 0700
            except ValueError as e:
                raise CliError(str(e)) from None
            return
        if not database.is_file():
            raise CliError(f"{root} holds no runplane database ({DB_FILE}): {hint}")
        if not os.access(database, os.R_OK | os.W_OK):
            raise CliError(denied)
    except FileNotFoundError:
        if init:
            return
        raise CliError(f"{root} does not exist: {hint}") from None
    except PermissionError:
        raise CliError(denied) from None
    try:  # mode=rw: never created here
        with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=rw", uri=True)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        tables = {""}
    if "tokens" not in tables and (tables or not init):  # init: an empty database (a first start cut short) will do
        raise CliError(f"{database} is not a runplane stack's database: {hint}")


@token_app.command("ls")
def token_ls(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="only this user's tokens")] = None,
    as_json: JSON = False,
) -> None:
    """List tokens (never their secrets)."""
    tokens = client(ctx).tokens(user)
    if as_json:
        print_json({"tokens": dumps(tokens)})
        return
    table = Table(Column("id", no_wrap=True), "user", "groups", "scopes", "created", "expires", "by")
    for t in tokens:
        expires = t.expires_at[:19].replace("T", " ") if t.expires_at else "never"
        created = t.created_at[:19].replace("T", " ")
        table.add_row(
            *map(cell, (t.id, t.user, ",".join(t.groups), ",".join(t.scopes), created, expires, t.created_by))
        )
    out.print(table)


@token_app.command("revoke")
def token_revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(metavar="TOKEN", help="the token's id (tok-...), from runplane token ls")],
    as_json: Annotated[bool, typer.Option("--json", help='print {"id": ..., "revoked": true}')] = False,
) -> None:
    """Revoke a token: every API instance refuses it within seconds. The only admin token that has
    not expired is kept (make another admin token first)."""
    client(ctx).revoke_token(token_id)
    if as_json:
        print_json({"id": token_id, "revoked": True})
        return
    err.print(Text(f"{token_id}: revoked"), highlight=False)


def _print_user(found: UserView, as_json: bool) -> None:
    if as_json:
        print_json(found)
        return
    groups = ", ".join(found.groups) or "none"
    out.print(
        f"{found.user}: groups {groups}; default group {found.default_group or 'none'}", markup=False, highlight=False
    )


@user_app.command("show")
def user_show(ctx: typer.Context, user: USER, as_json: JSON = False) -> None:
    """A user's groups (those of their tokens now) and default group."""
    _print_user(client(ctx).user(user), as_json)


@user_app.command("set")
def user_set(
    ctx: typer.Context,
    user: USER,
    default_group: Annotated[
        str | None,
        typer.Option(help="charge the user's runs and sweeps that name no group to this one of their groups"),
    ] = None,
    no_default_group: Annotated[
        bool, typer.Option("--no-default-group", help="no default: a user in several groups names one per run")
    ] = False,
    as_json: JSON = False,
) -> None:
    """Set a user's default group (a user in several groups otherwise names one with each run)."""
    if (default_group is None) == (not no_default_group):
        raise CliError("give --default-group GROUP or --no-default-group")
    _print_user(client(ctx).set_default_group(user, default_group), as_json)


def whoami(ctx: typer.Context, as_json: JSON = False) -> None:
    """Who your token acts for: user, groups and scopes."""
    me = client(ctx).me()
    if as_json:
        print_json(me)
        return
    groups = f" (groups: {', '.join(me.groups)})" if me.groups else ""
    if me.default_group:
        groups += f" (default group: {me.default_group})"
    out.print(f"{me.user}{groups}; scopes: {', '.join(me.scopes) or 'none'}", markup=False, highlight=False)
