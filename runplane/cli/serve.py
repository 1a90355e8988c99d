"""``runplane serve``: the stack of ``runplane dev`` as a machine's service, its state kept in one
directory (SQLite and files), and ``runplane serve backup``: a copy of that state taken while it runs.

A stop (SIGTERM, Ctrl-C) stops serving and leaves the runs where they are: queued ones stay queued,
running ones keep running under their agents, which outlive the service and report when it is back.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import stat
import time
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer

from runplane.adapters.local.backup import BackupError, backup
from runplane.adapters.local.db import not_private
from runplane.cli.common import RETENTION, CliError, err, retention_settings
from runplane.cli.dev import dashboard_link, start
from runplane.domain.pools import load_pools

DEFAULT_STATE_DIR = "/var/lib/runplane"
DEFAULT_LISTEN = "127.0.0.1:8080"
TOKEN_ENV = "RUNPLANE_SERVE_TOKEN"  # noqa: S105 (a variable's name)
"""The variable an admin token to accept may be given in (out of sight of the process list)."""

serve_app = typer.Typer(invoke_without_command=True)  # its help is serve's docstring

STATE_DIR = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        help="the stack's directory (made 0700): its database state.db, its objects, its agents' work dirs; a new "
        "or empty directory, or one holding a stack's state",
    ),
]


def register(app: typer.Typer) -> None:
    app.add_typer(serve_app, name="serve")


@serve_app.callback()
def serve(
    ctx: typer.Context,
    state_dir: STATE_DIR = Path(DEFAULT_STATE_DIR),
    listen: Annotated[
        str,
        typer.Option(
            help="ADDR:PORT to serve the API on ([::1]:8080 for IPv6). An address other than loopback "
            "(0.0.0.0) needs TLS (--tls-cert/--tls-key), or --insecure-http; behind a reverse proxy with TLS "
            "on this machine, keep loopback",
        ),
    ] = DEFAULT_LISTEN,
    insecure_http: Annotated[
        bool,
        typer.Option(
            "--insecure-http",
            help="serve plain HTTP on an address other than loopback: tokens and data cross the network in clear",
        ),
    ] = False,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="PEM certificate (chain) to serve HTTPS with", show_default=False)
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert", show_default=False)
    ] = None,
    public_url: Annotated[
        str | None,
        typer.Option(
            "--public-url",
            help="the URL clients reach the API at (behind a reverse proxy: the proxy's), the start of the "
            "object URLs the stack signs; default http(s)://ADDR:PORT",
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="an admin API token to accept on the first start (kept as a hash, like every token); every user "
            f"of this machine sees it in the process list: prefer --token-file or ${TOKEN_ENV}",
            show_default=False,
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help=f"a file (0600) holding the admin API token to accept on the first start (or ${TOKEN_ENV})",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(help="most local workers per pool")] = None,
    pools_file: Annotated[str | None, typer.Option("--pools", help="pools YAML/JSON file")] = None,
    retention: RETENTION = None,
) -> None:
    """Serve the stack on this machine: API, dashboard, dispatcher, reaper and local agents on Docker,
    its state in --state-dir. The first start makes an admin token and prints it once (under systemd,
    into the journal: `runplane token create --direct --init` before it keeps it out), or registers
    the one given (--token-file, $RUNPLANE_SERVE_TOKEN, --token); a later start registers none.

    SIGTERM or Ctrl-C stops the service and leaves the runs going: queued runs stay queued, running
    runs keep running under their agents and report when the service is back.
    """
    if ctx.invoked_subcommand is not None:
        return
    import logging

    from runplane.devstack.stack import DevConfig, DevStack

    host, port = check_front(listen, tls_cert, tls_key, public_url, insecure_http)
    given = admin_token(token, token_file)
    if token is not None:
        err.print(
            "[yellow]warning:[/yellow] --token is in this process's command line, which every user of this machine "
            f"can read (ps, /proc): give it in a file (--token-file, 0600) or ${TOKEN_ENV} instead",
            highlight=False,
            soft_wrap=True,
        )
    config = DevConfig(
        port=port,
        host=host,
        serve=True,
        cloud="local",
        state_dir=state_dir.expanduser().absolute(),
        tls_cert=tls_cert,
        tls_key=tls_key,
        public_url=public_url or None,
        token=given,
        user="admin",  # the first admin's name, as install.sh's
        workers=workers,
        pools_file=pools_file,
        write_dev_file=False,
        settings=retention_settings(ctx, retention),
    )
    try:
        stack = DevStack(config)
    except ValueError as e:
        raise CliError(str(e)) from e
    check_state_dir(config.state_dir)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("runplane").setLevel(logging.INFO)

    start(stack, "the service")
    try:
        made = stack.token if given is None else None  # a token of the operator's is not shown
        err.print(_banner(stack.api_url, stack.public_url, made, config.state_dir), highlight=False, soft_wrap=True)
        warnings = [] if stack.settings is None else missing_images(stack.settings.pools)
        if tls_cert is None and not ipaddress.ip_address(_loopback(host)).is_loopback:
            warnings.append(f"plain HTTP on {host} (--insecure-http): tokens and data cross the network in clear")
        warnings += links_warning(host, stack.public_url)
        for warning in warnings:
            err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the stop short
        try:  # stderr may be a closed pipe (`runplane serve 2>&1 | head`): the stop happens all the same
            err.print("stopping: the runs and their agents go on", highlight=False)
        finally:
            stack.stop()
        err.print("stopped", highlight=False)


def _banner(api_url: str, public_url: str, new_token: str | None, state_dir: Path) -> str:
    lines = [
        f"runplane is serving\n  API    {api_url}\n  links  {public_url} (where the download links it signs "
        f"point: --public-url)\n  state  {state_dir}"
    ]
    if new_token:
        lines.append(
            f"  token  {new_token}\n"
            "         an admin's, shown only now (only its hash is kept): `runplane token create USER` makes "
            f"users' tokens\n  UI     {dashboard_link(api_url, new_token)}\n"
            f"Use it from this machine:\n  export RUNPLANE_API_URL={api_url} RUNPLANE_TOKEN={new_token}"
        )
    else:
        lines.append(
            f"  UI     {api_url}/ui\nUse it from this machine:\n  export RUNPLANE_API_URL={api_url} "
            f"RUNPLANE_TOKEN=<a token>\nAn admin token, if you have none: runplane token create --direct "
            f"--state-dir {state_dir} --scope admin admin"
        )
    if public_url != api_url:
        lines.append(f"from other machines: RUNPLANE_API_URL={public_url}")
    return "\n".join(lines)


def links_warning(host: str, public_url: str) -> list[str]:
    """A warning when the stack listens beyond loopback but signs its download links for a name of
    loopback (this machine's name may resolve so): other machines cannot follow them."""
    if ipaddress.ip_address(_loopback(host)).is_loopback:
        return []
    name = (urlsplit(public_url).hostname or "").rstrip(".").lower()
    try:
        loopback = ipaddress.ip_address(name).is_loopback
    except ValueError:
        loopback = name == "localhost" or name.startswith("localhost.") or name.endswith(".localhost")
    if not loopback:
        return []
    return [
        f"the download links are signed for {public_url}, which other machines cannot reach: give --public-url "
        "with the name they reach this machine at (https://gpu1.lab:8443)"
    ]


def missing_images(pools_text: str) -> list[str]:
    """A warning for each local pool whose default image the local Docker engine does not have (a
    run that names no image would fail with image_not_found); none when the engine cannot be asked.
    Nothing is pulled."""
    pools = [p for p in load_pools(pools_text).pools if p.backend == "local" and p.default_image]
    if not pools:
        return []
    import docker
    import docker.errors
    import requests

    try:
        client = docker.from_env(timeout=10)
    except docker.errors.DockerException:
        return []
    found = []
    try:
        for pool in pools:
            try:
                client.images.get(pool.default_image)
            except docker.errors.ImageNotFound:
                found.append(
                    f"pool {pool.name}: its default image {pool.default_image} is not in this machine's Docker "
                    "engine: runs that name no image fail until it is built or pulled (infra/onebox/README.md)"
                )
            except (docker.errors.DockerException, requests.RequestException):
                break
    finally:
        client.close()
    return found


def check_front(
    listen: str, tls_cert: Path | None, tls_key: Path | None, public_url: str | None, insecure_http: bool
) -> tuple[str, int]:
    """The address and port to serve on; CliError for options that cannot work together, and for
    plain HTTP on an address other than loopback without ``insecure_http``."""
    host, port = parse_listen(listen)
    if (tls_cert is None) != (tls_key is None):
        raise CliError("--tls-cert and --tls-key go together: give both or neither")
    if public_url is not None:
        check_public_url(public_url)
    for name, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not path.is_file():
            raise CliError(f"{name} {path}: no such file")
    if tls_cert is None and not insecure_http and not ipaddress.ip_address(_loopback(host)).is_loopback:
        raise CliError(
            f"--listen {listen}: plain HTTP on an address other machines reach sends tokens in clear; give "
            "--tls-cert and --tls-key, or listen on loopback behind a reverse proxy with TLS, or --insecure-http"
        )
    return host, port


def check_state_dir(state_dir: Path) -> None:
    """CliError for a state directory that is there and not this user's alone (``not_private``):
    whoever else may write in it could put links or a database of theirs there."""
    try:
        found = state_dir.stat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise CliError(f"--state-dir {state_dir}: {e.strerror}") from e
    why = not_private(found)
    if why is not None:
        raise CliError(f"--state-dir {state_dir} is refused: {why}")


def admin_token(token: str | None, token_file: Path | None) -> str | None:
    """The admin token to accept, from one of --token, --token-file or RUNPLANE_SERVE_TOKEN; None
    when none is given. Raises CliError for two of them, or a file that is not the operator's
    alone (readable or writable by group or others) or holds no token."""
    from_env = os.environ.get(TOKEN_ENV, "").strip() or None
    given = [name for name, value in (("--token", token), ("--token-file", token_file), (TOKEN_ENV, from_env)) if value]
    if len(given) > 1:
        raise CliError(f"give the admin token one way: {' and '.join(given)} are both given")
    if token_file is None:
        return token or from_env
    try:
        fd = os.open(token_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise CliError(f"--token-file {token_file}: {e.strerror}") from e
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CliError(f"--token-file {token_file}: not a regular file")
        if mode & 0o077:
            raise CliError(
                f"--token-file {token_file} is open to other users (mode {stat.S_IMODE(mode):04o}): chmod 600 it"
            )
        text = file.read(4096).decode(errors="replace").strip()
    if not text or any(c.isspace() for c in text):
        raise CliError(f"--token-file {token_file}: give one token on one line")
    return text


def parse_listen(listen: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``[IPv6]:PORT``) as (address, port). Raises CliError naming what is wrong."""
    address, sep, port_text = listen.strip().rpartition(":")
    if not sep or not address:
        raise CliError(f"--listen {listen!r}: give ADDR:PORT, e.g. 127.0.0.1:8080 or 0.0.0.0:8080")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if address != "localhost":
            raise CliError(f"--listen {listen!r}: {address!r} is not an IP address") from None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise CliError(f"--listen {listen!r}: the port must be a number from 1 to 65535")
    return address, int(port_text)


def _loopback(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def check_public_url(url: str) -> None:
    """Raise CliError unless ``url`` is an http(s) URL of a host, with no query or fragment (the
    start of every URL the stack signs)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise CliError(
            f"--public-url {url[:200]!r}: give the http(s) URL clients reach the API at, e.g. https://gpu1.lab"
        )


@serve_app.command("backup")
def backup_command(
    dest: Annotated[Path, typer.Argument(help="a new (or empty) directory outside the state directory")],
    state_dir: STATE_DIR = Path(DEFAULT_STATE_DIR),
) -> None:
    """Copy the service's state (database, objects and the secrets key file) into DEST while it runs:
    a consistent copy.

    The copy holds the key that opens the stack's secrets (DEST/secrets.key, mode 0600): keep it as
    private as the state directory itself. Without it a restored stack cannot open its secrets.

    Restore: stop the service, move its state directory aside, copy DEST in its place (keeping its
    owner and modes), start the service.
    """
    try:
        copied = backup(state_dir, dest)
    except BackupError as e:
        raise CliError(str(e)) from e
    err.print(
        f"copied the database ({copied.database_bytes} bytes), {copied.objects} objects "
        f"({copied.object_bytes} bytes){' and the secrets key file' if copied.key_file else ''} into {dest}",
        highlight=False,
    )
