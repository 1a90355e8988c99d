"""``runplane dev``: the whole stack on this machine."""

from __future__ import annotations

import enum
import signal
import time
from typing import Annotated

import typer

from runplane.cli.client import Client
from runplane.cli.common import CliError, err


class Cloud(enum.StrEnum):
    aws = "aws"
    azure = "azure"


def dev(
    port: Annotated[int, typer.Option(help="port of the local API")] = 8080,
    token: Annotated[str | None, typer.Option(help="admin API token to accept (default: a new random one)")] = None,
    workers: Annotated[int | None, typer.Option(help="most local workers per pool")] = None,
    pools_file: Annotated[str | None, typer.Option("--pools", help="pools YAML/JSON file")] = None,
    demo: Annotated[bool, typer.Option(help="submit one demo run once the stack is up")] = False,
    cloud: Annotated[
        Cloud,
        typer.Option(
            help="whose functions and stores: aws (moto's server) or azure (Azurite, the Azure Functions app)",
        ),
    ] = Cloud.aws,
) -> None:
    """Run the whole stack on this machine (moto or Azurite, API, dispatcher, local agents on Docker)."""
    import logging

    from runplane.devstack.stack import DevConfig, DevStack

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("runplane").setLevel(logging.INFO)
    stack = DevStack(DevConfig(port=port, token=token, workers=workers, pools_file=pools_file, cloud=cloud.value))
    try:
        stack.start()
    except OSError as e:
        raise CliError(f"cannot start the local stack: {e}") from e
    except ValueError as e:
        raise CliError(str(e)) from e
    err.print(
        f"[green]runplane local stack is up[/green]\n  API    {stack.api_url}\n"
        f"  token  {stack.token} (an admin's: `runplane token create USER` makes users' tokens)\n"
        f"  {stack.services:<6} {stack.endpoint}\n"
        f"Use it from another shell (the CLI finds this stack by itself):\n"
        f"  runplane run --wait -- 'echo hello; echo 42 > answer'\n"
        f"or export RUNPLANE_API_URL={stack.api_url} RUNPLANE_TOKEN={stack.token}\n"
        f"Ctrl-C stops it.",
        highlight=False,
        soft_wrap=True,
    )

    def on_term(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM (a service manager, `kill`) stops it like Ctrl-C

    signal.signal(signal.SIGTERM, on_term)
    try:
        if demo:
            _demo(Client(stack.api_url, stack.token))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        err.print("stopping…")
    finally:
        stack.stop()


def _demo(client: Client) -> None:
    from runplane.cli.main import _follow

    run = client.request("POST", "/v1/runs", {"command": "echo hello from runplane; echo 42 > answer", "name": "demo"})
    err.print(f"[bold]demo run {run['id']}[/bold]")
    final = _follow(client, run["id"], streams=("stdout", "stderr"), show_states=True)
    files = client.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    err.print(f"demo run {final['state']}; outputs: {', '.join(f['path'] for f in files) or 'none'}")
