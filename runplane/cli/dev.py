"""``runplane dev``: the whole stack on this machine."""

from __future__ import annotations

import enum
import re
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import quote

import typer

from runplane.cli.common import RETENTION, CliError, err, retention_settings
from runplane.cli.runs import follow
from runplane.client import Client

if TYPE_CHECKING:
    from runplane.devstack.stack import DevStack

DEFAULT_STATE_DIR = Path("~/.runplane/dev")


class Cloud(enum.StrEnum):
    local = "local"
    aws = "aws"
    azure = "azure"


def dev(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="port of the local API")] = 8080,
    token: Annotated[str | None, typer.Option(help="admin API token to accept (default: a new random one)")] = None,
    workers: Annotated[int | None, typer.Option(help="most local workers per pool")] = None,
    pools_file: Annotated[str | None, typer.Option("--pools", help="pools YAML/JSON file")] = None,
    demo: Annotated[bool, typer.Option(help="submit one demo run once the stack is up")] = False,
    cloud: Annotated[
        Cloud | None,
        typer.Option(
            help="whose functions and stores: local (one SQLite database and a directory of objects in the "
            "state dir, kept across restarts), aws (moto's server) or azure (Azurite, the Azure Functions app); "
            "default local, aws with --aws-endpoint, azure with --azure-connection",
            show_default=False,
        ),
    ] = None,
    azure_connection: Annotated[
        str | None,
        typer.Option(
            "--azure-connection",
            envvar="RUNPLANE_AZURE_CONNECTION",
            show_envvar=True,
            help="the connection string of an Azure storage account (or an Azurite) to use instead of "
            "starting Azurite; implies --cloud azure. The environment variable keeps an account key out "
            "of the process list",
            show_default=False,
        ),
    ] = None,
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir",
            help="where stacks keep their state: this one's is STATE_DIR/PORT (runs, logs, outputs, tokens, "
            "quotas, sweeps on the local cloud; agents' records on every cloud)",
        ),
    ] = DEFAULT_STATE_DIR,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="start empty: remove what the stack kept in STATE_DIR/PORT first")
    ] = False,
    aws_endpoint: Annotated[
        str | None,
        typer.Option(
            "--aws-endpoint",
            help="an endpoint serving DynamoDB, SQS and S3 (a moto server, LocalStack) to use instead of "
            "starting moto; implies --cloud aws",
            show_default=False,
        ),
    ] = None,
    retention: RETENTION = None,
) -> None:
    """Run the whole stack on this machine (its stores in SQLite, or moto or Azurite; API,
    dispatcher, local agents on Docker).

    Its state is kept in STATE_DIR/PORT: started again, it has every run, log, output, token,
    quota and sweep of before (--fresh starts empty). Ctrl-C (or SIGTERM) stops it: running runs
    are killed and recorded so, queued ones stay queued for the next start, and no agent or run
    container is left behind.
    """
    import logging

    from runplane.devstack.stack import DevConfig, DevStack

    config = DevConfig(
        port=port,
        token=token,
        workers=workers,
        pools_file=pools_file,
        cloud=_cloud(cloud, azure_connection, aws_endpoint),
        aws_endpoint_url=aws_endpoint,
        azure_connection_string=azure_connection,
        state_dir=state_dir.expanduser(),
        fresh=fresh,
        settings=retention_settings(ctx, retention),
    )
    try:
        stack = DevStack(config)  # options that cannot go together fail here, before anything starts
    except ValueError as e:
        raise CliError(str(e)) from e
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("runplane").setLevel(logging.INFO)

    start(stack, "the local stack")
    kept = "kept when it stops; --fresh starts empty"
    if stack.services.startswith("moto"):
        kept = "agents' records; moto keeps the runs in memory: they go when it stops"
    emptied = ""
    if fresh:  # said, as it cannot be undone: what it held is gone
        gone = "the runs, logs, outputs, tokens, quotas and sweeps it held are gone"
        emptied = f"  fresh  emptied first: {gone}{'' if token else '; the admin token above is a new one'}\n"
    err.print(
        f"[green]runplane local stack is up[/green]\n  API    {stack.api_url}\n"
        f"  token  {stack.token} (an admin's: `runplane token create USER` makes users' tokens)\n"
        f"  UI     {dashboard_link(stack.api_url, stack.token)}\n"
        f"  {stack.services:<6} {without_secrets(stack.endpoint)}\n"
        f"  state  {stack.state_dir} ({kept})\n{emptied}"
        f"Use it from another shell (the CLI finds this stack by itself):\n"
        f"  runplane run --wait -- 'echo hello; echo 42 > answer'\n"
        f"or export RUNPLANE_API_URL={stack.api_url} RUNPLANE_TOKEN={stack.token}\n"
        f"Ctrl-C stops it (and kills the running runs; queued ones run at the next start).",
        highlight=False,
        soft_wrap=True,
    )
    try:
        if demo:
            _demo(Client(stack.api_url, stack.token))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        # Stopping takes a few seconds and must not be cut short half-way (agents and containers
        # would be left): a second Ctrl-C or SIGTERM only says that it is under way.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _still_stopping)
        err.print("stopping: killing the running runs (queued ones stay queued), then the agents…", highlight=False)
        stack.stop()
        err.print("stopped", highlight=False)


def start(stack: DevStack, what: str) -> None:
    """Start ``stack`` so that SIGTERM and SIGINT stop it like Ctrl-C (KeyboardInterrupt); what it
    cannot start with is one line (CliError) naming ``what``."""

    def on_term(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM (a service manager, `kill`) stops it like Ctrl-C

    signal.signal(signal.SIGTERM, on_term)
    # SIGINT too, explicitly: a process started in the background of a script inherits SIGINT
    # ignored, and Python then leaves it so; `kill -INT` must stop the stack all the same
    signal.signal(signal.SIGINT, on_term)
    try:
        stack.start()
    except OSError as e:
        raise CliError(f"cannot start {what}: {e}") from e
    except ValueError as e:
        raise CliError(str(e)) from e


def dashboard_link(api_url: str, token: str) -> str:
    """The dashboard's address that signs in with ``token``: it rides in the fragment, which the
    browser never sends to a server (the page keeps it for the tab and takes it out of the bar)."""
    return f"{api_url}/ui#token={quote(token, safe='')}"


def _still_stopping(_signum: int, _frame: object) -> None:
    err.print("still stopping (a few seconds more)…", highlight=False)


def _cloud(cloud: Cloud | None, azure_connection: str | None, aws_endpoint: str | None) -> str:
    """The cloud the options name. Raises CliError when they contradict each other."""
    if azure_connection is not None and not azure_connection.strip():
        raise CliError("--azure-connection is empty")
    if aws_endpoint is not None and not aws_endpoint.strip():
        raise CliError("--aws-endpoint is empty")
    if azure_connection and aws_endpoint:
        raise CliError("--azure-connection and --aws-endpoint name stores of two clouds: give one")
    if azure_connection:
        if cloud not in (None, Cloud.azure):
            raise CliError("--azure-connection is for --cloud azure (it implies it: leave --cloud out)")
        return Cloud.azure.value
    if aws_endpoint:
        if cloud not in (None, Cloud.aws):
            raise CliError("--aws-endpoint is for --cloud aws (it implies it: leave --cloud out)")
        return Cloud.aws.value
    return (cloud or Cloud.local).value


_SECRET = re.compile(r"(?i)\b(AccountKey|SharedAccessSignature|SharedAccessKey)=[^;]*")


def without_secrets(endpoint: str) -> str:
    """``endpoint`` fit to print: a connection string's key or signature starred out."""
    return _SECRET.sub(lambda m: f"{m.group(1)}=***", endpoint)


def _demo(client: Client) -> None:
    run = client.submit("echo hello from runplane; echo 42 > answer", name="demo")
    err.print(f"[bold]demo run {run.id}[/bold]")
    follow(run, ("stdout", "stderr"), show_states=True)
    files = ", ".join(output.path for output in run.outputs())
    err.print(f"demo run {run.state}; outputs: {files or 'none'}", highlight=False)
