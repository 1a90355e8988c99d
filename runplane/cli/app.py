"""``runplane``: submit, watch, kill and fetch runs; ``runplane dev`` runs the local stack.

Every command lives in a module of its group (runs, sessions, sweeps, tokens, quotas, secrets, usage, fleet, profiles,
dev, serve); this one holds the app, its global options, and the one place where errors become a line on
stderr and an exit code (``common.ExitCode``, README.md's table). The entry point (runplane.cli.main)
loads it for every command but ``--version``.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

try:  # typer 0.29 and later carry their own copy of click, whose exceptions are the ones raised
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # earlier typer runs on click itself
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[assignment]

from runplane.cli import fleet, profiles, quotas, runs, secrets, serve, sessions, sweeps, tokens, usage
from runplane.cli.common import CliError, ExitCode, Options, configure_output, error_exit_code, say_error
from runplane.cli.dev import dev
from runplane.client import ApiError
from runplane.extras import cli_requirement

EPILOG = (
    "Exit codes: 0 success; 1 runplane itself failed unexpectedly; 2 a usage error (a bad flag or value, "
    "checked here or answered 400/422 by the API; no run id and no last run); 3 the API refused the "
    "request (401, 403, 404, 409, 413, 429, a quota); 4 the API could not be reached or failed "
    "(network, timeout, 5xx after retries). Under run --wait: the run's own exit code when it failed "
    "with one; 5 when it failed without one (image_not_found, worker_lost, ...) or despite exit 0 "
    "(upload_failed); 124 timed out; 137 killed."
)

app = typer.Typer(
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run containerized jobs on pools of workers (AWS Batch, Azure Batch, Kubernetes, Slurm, local).",
    epilog=EPILOG,
)


def _version(show: bool) -> None:
    if show:
        from runplane import __version__

        print(f"runplane {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="use this profile's URL and token (runplane login saves them; RUNPLANE_PROFILE also names one)",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Run containerized jobs on pools of workers (AWS Batch, Azure Batch, Kubernetes, Slurm, local)."""
    configure_output()
    ctx.obj = Options(profile=profile)


runs.register(app)
sessions.register(app)
sweeps.register(app)
fleet.register(app)
tokens.register(app)
quotas.register(app)
secrets.register(app)
usage.register(app)
profiles.register(app)
app.command()(dev)
serve.register(app)


def run_cli(args: list[str] | None = None) -> int:
    """Run ``runplane`` with ``args`` (default: the process's) and return its exit code. Every
    failure is one line on stderr starting ``error: ``, never a traceback (RUNPLANE_DEBUG=1 shows
    one for an unexpected error)."""
    try:
        result = app(args=args, prog_name="runplane", standalone_mode=False)
    except NoArgsIsHelpError:  # the help has been printed
        return ExitCode.USAGE
    except UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else "runplane"
        say_error(f"{e.format_message()} ({where} --help)")
        return ExitCode.USAGE
    except ClickException as e:
        say_error(e.format_message())
        return e.exit_code
    except typer.Abort:
        say_error("aborted")
        return 130
    except ApiError as e:
        say_error(e.message)
        return error_exit_code(e)
    except CliError as e:
        say_error(str(e))
        return e.exit_code
    except Exception as e:
        if os.environ.get("RUNPLANE_DEBUG"):
            raise
        say_error(f"runplane failed unexpectedly: {type(e).__name__}: {e} (RUNPLANE_DEBUG=1 shows the traceback)")
        return ExitCode.UNEXPECTED
    return result if isinstance(result, int) else ExitCode.OK


def exit_without_extras() -> None:
    """Exit 2 with one line naming the extras to install when the command needs some that are not
    installed (``pip install runplane`` is the client alone; runplane.extras)."""
    line = cli_requirement(sys.argv[1:], os.environ)
    if line:
        say_error(line)
        sys.exit(ExitCode.USAGE)
