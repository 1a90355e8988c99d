"""``runplane``: submit, watch, kill and fetch runs; ``runplane dev`` runs the local stack."""

from __future__ import annotations

import enum
import getpass
import json
import shlex
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Column, Table

from runplane.cli.client import ApiError, Client
from runplane.cli.common import CliError, err, out
from runplane.cli.dev import dev

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run containerized jobs on pools of workers (AWS Batch, Azure Batch, Kubernetes, Slurm, local).",
)
LAST_RUN = Path("~/.runplane/last_run").expanduser()
EXIT_BY_STATE = {"killed": 137, "timed_out": 124}


def _version(show: bool) -> None:
    if show:
        from runplane import __version__

        out.print(f"runplane {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Run containerized jobs on pools of workers (AWS Batch, Azure Batch, Kubernetes, Slurm, local)."""


def _client() -> Client:
    return Client.from_env()


def _remember(run_id: str) -> None:
    try:
        LAST_RUN.parent.mkdir(parents=True, exist_ok=True)
        LAST_RUN.write_text(run_id)
    except OSError:
        pass


def _run_id(run_id: str | None) -> str:
    if run_id:
        return run_id
    try:
        return LAST_RUN.read_text().strip()
    except OSError:
        raise CliError("no run id given and no previous run to default to") from None


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} must look like NAME=VALUE, got {item!r}")
        result[key] = value
    return result


def _id_column() -> Column:
    return Column("id", no_wrap=True, min_width=26)


def _print_json(data: Any) -> None:
    out.print_json(json.dumps(data))


def _state_line(run: dict[str, Any]) -> str:
    state = run["state"]
    if state == "queued":
        return f"queued: {run.get('waiting_reason') or 'waiting for a worker'}"
    if state in ("preparing", "running", "uploading"):
        return f"{state} on worker {run.get('worker_id')} (attempt {run.get('attempt')})"
    failure = run.get("failure") or {}
    if state == "succeeded":
        return "succeeded (exit 0)"
    return f"{state}: {failure.get('reason', '')} — {failure.get('message', '')}".rstrip(" —")


def command_line(words: list[str]) -> str:
    """The shell command for the words after ``--``: one word is a command line as it is
    (``runplane run -- 'make && ./train'``); several are quoted back as the user's shell split
    them, so that ``-- sh -c 'echo a b'`` runs ``sh -c 'echo a b'``, not ``sh -c echo a b``."""
    return words[0] if len(words) == 1 else shlex.join(words)


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="the command after --, run with sh -c (words keep quoting)")],
    image: Annotated[str | None, typer.Option(help="Docker image (default: the pool's)")] = None,
    cpus: Annotated[float | None, typer.Option(help="cpus, e.g. 0.5 or 4")] = None,
    gpus: Annotated[int | None, typer.Option(help="number of GPUs")] = None,
    memory: Annotated[str | None, typer.Option(help="memory, e.g. 512m or 8g")] = None,
    disk: Annotated[str | None, typer.Option(help="output disk, e.g. 10g")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="time limit, e.g. 90s, 2h")] = None,
    queue: Annotated[str | None, typer.Option(help="pool to run on (default: smallest that fits)")] = None,
    name: Annotated[str | None, typer.Option(help="a name for the run")] = None,
    tag: Annotated[str | None, typer.Option(help="only workers started with --tag TAG take it")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V, repeatable")] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="NAME=s3://… or run:<id>, repeatable")
    ] = None,
    network: Annotated[bool, typer.Option("--network", help="give the run a network")] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="retrying with the same key never makes two runs")] = None,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="stream logs and exit with the run's exit code")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the run as JSON")] = False,
) -> None:
    """Submit a run."""
    resources: dict[str, Any] = {
        k: v
        for k, v in {"cpus": cpus, "gpus": gpus, "memory": memory, "disk": disk, "time": time_limit}.items()
        if v is not None
    }
    body: dict[str, Any] = {"command": command_line(command)}
    for key, value in (("image", image), ("queue", queue), ("name", name), ("tag", tag)):
        if value is not None:
            body[key] = value
    if resources:
        body["resources"] = resources
    if env:
        body["env"] = _pairs(env, "--env")
    if inputs:
        body["inputs"] = _pairs(inputs, "--input")
    if network:
        body["network"] = True
    client = _client()
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    answer = client.request_with_status("POST", "/v1/runs", body, headers=headers)
    created = answer.body
    _remember(created["id"])
    # 200 instead of 201: the key named a run submitted before; this submit made nothing new
    found = answer.status == 200
    if found:
        line = f"already submitted as {created['id']} (same --idempotency-key): {_state_line(created)}"
        err.print(line, markup=False, highlight=False, soft_wrap=True)
    if not wait:
        if as_json:
            _print_json(created)
        else:
            out.print(created["id"])
            if not found:
                err.print(f"[dim]{_state_line(created)} — follow with: runplane logs -f {created['id']}[/dim]")
        return
    if not found:
        err.print(f"[bold]{created['id']}[/bold] submitted to pool {created['queue']}")
    final = _follow(client, created["id"], streams=("stdout", "stderr"), show_states=True)
    if as_json:
        _print_json(final)
    raise typer.Exit(_exit_code(final))


def _exit_code(run: dict[str, Any]) -> int:
    if run["state"] == "succeeded":
        return 0
    if run.get("exit_code") not in (None, 0) and run["state"] == "failed":
        return int(run["exit_code"]) & 0xFF or 1
    return EXIT_BY_STATE.get(run["state"], 1)


def _follow(client: Client, run_id: str, streams: tuple[str, ...], show_states: bool) -> dict[str, Any]:
    """Print new log bytes until the run ends and its logs are complete; return the final run."""
    offsets = dict.fromkeys(streams, 0)
    complete = dict.fromkeys(streams, False)
    last_line = ""
    writers = {"stdout": sys.stdout, "stderr": sys.stderr}
    run: dict[str, Any] = {}
    while True:
        run = client.request("GET", f"/v1/runs/{run_id}")
        line = _state_line(run)
        if show_states and line != last_line:
            err.print(f"[cyan]●[/cyan] {line}", highlight=False)
            last_line = line
        for stream in streams:
            if complete[stream]:
                continue
            page = client.request("GET", f"/v1/runs/{run_id}/logs", query={"stream": stream, "offset": offsets[stream]})
            if page["data"]:
                writers[stream].write(page["data"])
                writers[stream].flush()
            offsets[stream] = page["next_offset"]
            complete[stream] = page["complete"]
        if all(complete.values()):
            # the logs are complete only once the run has ended; read that final state
            final: dict[str, Any] = client.request("GET", f"/v1/runs/{run_id}")
            line = _state_line(final)
            if show_states and line != last_line:
                err.print(f"[cyan]●[/cyan] {line}", highlight=False)
            return final
        time.sleep(0.3)


@app.command()
def status(
    run_id: Annotated[str | None, typer.Argument(help="run id (default: your last run)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show a run: state, reason, times, usage and its timeline."""
    run = _client().request("GET", f"/v1/runs/{_run_id(run_id)}")
    if as_json:
        _print_json(run)
        return
    table = Table.grid(padding=(0, 2))
    for key in (
        "id",
        "name",
        "state",
        "queue",
        "attempt",
        "worker_id",
        "exit_code",
        "created_at",
        "started_at",
        "finished_at",
    ):
        if run.get(key) is not None:
            table.add_row(f"[bold]{key}[/bold]", str(run[key]))
    if run.get("waiting_reason"):
        table.add_row("[bold]waiting[/bold]", run["waiting_reason"])
    if run.get("failure"):
        table.add_row("[bold]failure[/bold]", f"{run['failure']['reason']}: {run['failure']['message']}")
    usage = {k: v for k, v in run.get("usage", {}).items() if v not in (None, {}, [])}
    if usage:
        table.add_row("[bold]usage[/bold]", json.dumps(usage))
    table.add_row("[bold]command[/bold]", run["spec"]["command"])
    out.print(table)
    for event in run.get("events", []):
        out.print(f"  [dim]{event['at']}[/dim] {event['message']}", highlight=False)


@app.command("ls")
def list_runs(
    state: Annotated[str | None, typer.Option(help="only runs in this state")] = None,
    queue: Annotated[str | None, typer.Option(help="only runs of this pool")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 20,
    cursor: Annotated[str | None, typer.Option(help="continue from a previous page")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List your runs, newest first."""
    page = _client().request(
        "GET", "/v1/runs", query={"state": state, "queue": queue, "limit": limit, "cursor": cursor}
    )
    if as_json:
        _print_json(page)
        return
    table = Table(_id_column(), "name", "state", "queue", "created", "exit", "reason")
    for r in page["runs"]:
        table.add_row(
            r["id"],
            r.get("name") or "",
            r["state"],
            r["queue"],
            r["created_at"][:19].replace("T", " "),
            "" if r.get("exit_code") is None else str(r["exit_code"]),
            (r.get("failure") or {}).get("reason", "") or (r.get("waiting_reason") or ""),
        )
    out.print(table)
    if page.get("next_cursor"):
        err.print(f"[dim]more: runplane ls --cursor {page['next_cursor']}[/dim]")


@app.command()
def logs(
    run_id: Annotated[str | None, typer.Argument(help="run id (default: your last run)")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the run ends")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="the stderr stream instead of stdout")] = False,
) -> None:
    """Print a run's stdout (or stderr)."""
    client = _client()
    rid = _run_id(run_id)
    stream = "stderr" if stderr else "stdout"
    if follow:
        _follow(client, rid, streams=(stream,), show_states=False)
        return
    offset = 0
    while True:
        page = client.request("GET", f"/v1/runs/{rid}/logs", query={"stream": stream, "offset": offset})
        sys.stdout.write(page["data"])
        if page["next_offset"] == offset:
            break
        offset = page["next_offset"]
    sys.stdout.flush()


@app.command()
def kill(run_id: Annotated[str | None, typer.Argument(help="run id (default: your last run)")] = None) -> None:
    """Kill a run: its container is stopped within seconds; partial outputs are still uploaded."""
    run = _client().request("POST", f"/v1/runs/{_run_id(run_id)}/kill")
    err.print(f"{run['id']}: {'killed' if run['state'] == 'killed' else 'kill requested'}")


@app.command()
def download(
    run_id: Annotated[str | None, typer.Argument(help="run id (default: your last run)")] = None,
    dest: Annotated[Path, typer.Argument(help="directory to write the outputs into")] = Path(),
    force: Annotated[bool, typer.Option("--force", help="overwrite files that differ")] = False,
) -> None:
    """Download a run's output files."""
    client = _client()
    rid = _run_id(run_id)
    listing = client.request("GET", f"/v1/runs/{rid}/outputs")
    if not listing["files"]:
        err.print(f"{rid}: no output files" + ("" if listing.get("complete") else " yet (the run has not finished)"))
        return
    root = dest.resolve()
    for f in _all_files(client, rid, listing):
        target = (root / f["path"]).resolve()
        if not target.is_relative_to(root):
            raise CliError(f"refusing output path {f['path']!r}: it leaves {root}")
        if target.exists() and not force and target.stat().st_size != f["size"]:
            raise CliError(f"{target} exists and differs; use --force to overwrite")
        client.download(f["url"], target)
        out.print(str(target), highlight=False)


def _all_files(client: Client, run_id: str, first: dict[str, Any]) -> Any:
    """Every output file, page after page (the API lists them a page at a time)."""
    page = first
    while True:
        yield from page["files"]
        if not page.get("next_cursor"):
            return
        page = client.request("GET", f"/v1/runs/{run_id}/outputs", query={"cursor": page["next_cursor"]})


@app.command()
def workers(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List workers with their state and last heartbeat."""
    data = _client().request("GET", "/v1/workers")
    if as_json:
        _print_json(data)
        return
    table = Table(_id_column(), "pool", "status", "slots free", "runs", "done", "heartbeat")
    for w in data["workers"]:
        table.add_row(
            w["id"],
            w["pool"],
            w["status"],
            f"{w['free_slots']}/{w['slots']}",
            ",".join(w["runs"]),
            str(w["runs_done"]),
            w["heartbeat_at"],
        )
    out.print(table)


@app.command()
def pools(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List pools: shape, backlog, workers, launches and the last launch error."""
    data = _client().request("GET", "/v1/pools")
    if as_json:
        _print_json(data)
        return
    table = Table("name", "backend", "shape", "workers (starting/idle/busy)", "min-max", "backlog", "launches (failed)")
    problems = []
    for p in data["pools"]:
        s = p["shape"]
        shape = f"{s['cpus']:g} cpu, {s['gpus']} gpu, {s['memory'] // 2**20} MiB"
        w = p["workers"]
        launches = p.get("launches") or {}
        table.add_row(
            p["name"] + (" (disabled)" if p.get("disabled") else ""),
            p["backend"],
            shape,
            f"{w['starting']}/{w['idle']}/{w['busy']}",
            f"{p['min_workers']}-{p['max_workers']}",
            str(p["backlog"]),
            f"{launches.get('launched', 0)} ({launches.get('failed', 0)})",
        )
        if p.get("disabled"):
            problems.append(f"{p['name']}: disabled: {p['disabled']}")
        elif p.get("last_error"):
            problems.append(f"{p['name']}: last launch error at {p['last_error_at']}: {p['last_error']}")
    out.print(table)
    for line in problems:
        out.print(line, markup=False, highlight=False)


token_app = typer.Typer(no_args_is_help=True, help="Make, list and revoke API tokens (administrators).")
app.add_typer(token_app, name="token")


class Scope(enum.StrEnum):
    """The API's scopes (runplane.domain.models.SCOPES; a unit test holds the two together: the
    CLI does not import the domain, to start fast)."""

    read = "runs:read"
    write = "runs:write"
    admin = "admin"


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Argument(help="the user the token acts for")],
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
    as_json: Annotated[bool, typer.Option("--json", help="print the token's record as JSON")] = False,
) -> None:
    """Make a token for USER; its secret is printed once and stored only as a hash."""
    scopes = [s.value for s in scope] if scope else None
    if direct:
        made = _direct_token(user, group or [], scopes, expires)
    else:
        body: dict[str, Any] = {"user": user, "groups": group or []}
        if scopes is not None:
            body["scopes"] = scopes
        if expires is not None:
            body["expires_in"] = expires
        made = _client().request("POST", "/v1/tokens", body)
    if as_json:
        _print_json(made)
        return
    out.print(made["token"], highlight=False)
    expiry = f"expires {made['expires_at']}" if made.get("expires_at") else "does not expire"
    err.print(
        f"[dim]{made['id']}: {made['user']}, scopes {', '.join(made['scopes'])}"
        + (f", groups {', '.join(made['groups'])}" if made["groups"] else "")
        + f"; {expiry}. The secret above is shown only now.[/dim]",
        highlight=False,
    )


def _direct_token(user: str, groups: list[str], scopes: list[str] | None, expires: str | None) -> dict[str, Any]:
    from pydantic import ValidationError

    from runplane.api.models import TokenCreated
    from runplane.api.views import token_view
    from runplane.bootstrap import build_stack
    from runplane.domain.errors import RunplaneError
    from runplane.services.tenancy import create_token

    try:
        stack = build_stack()
        made = create_token(
            stack.tokens,
            user=user,
            groups=groups,
            scopes=scopes,
            expires_in=expires,
            created_by=f"{getpass.getuser()} (runplane token create --direct)",
            now=time.time(),
        )
    except RunplaneError as e:
        raise CliError(e.message) from None
    except ValidationError as e:  # a bad RUNPLANE_* setting
        first = e.errors()[0]
        where = "RUNPLANE_" + "_".join(str(p) for p in first["loc"]).upper()
        raise CliError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
    except ValueError as e:  # a pools file that cannot be read
        raise CliError(str(e).splitlines()[0]) from None
    created = TokenCreated(**token_view(made.token).model_dump(), token=made.secret)
    return created.model_dump(mode="json")


@token_app.command("ls")
def token_ls(
    user: Annotated[str | None, typer.Option(help="only this user's tokens")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List tokens (never their secrets)."""
    data = _client().request("GET", "/v1/tokens", query={"user": user})
    if as_json:
        _print_json(data)
        return
    table = Table(Column("id", no_wrap=True), "user", "groups", "scopes", "created", "expires", "by")
    for t in data["tokens"]:
        table.add_row(
            t["id"],
            t["user"],
            ",".join(t["groups"]),
            ",".join(t["scopes"]),
            t["created_at"][:19].replace("T", " "),
            (t["expires_at"] or "never")[:19].replace("T", " "),
            t.get("created_by") or "",
        )
    out.print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="the token's id (tok-...), from runplane token ls")],
) -> None:
    """Revoke a token: every API instance refuses it within seconds."""
    _client().request("DELETE", f"/v1/tokens/{urllib.parse.quote(token_id, safe='')}")
    err.print(f"{token_id}: revoked")


@app.command()
def whoami(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Who your token acts for: user, groups and scopes."""
    me = _client().request("GET", "/v1/me")
    if as_json:
        _print_json(me)
        return
    groups = f" (groups: {', '.join(me['groups'])})" if me["groups"] else ""
    out.print(f"{me['user']}{groups}; scopes: {', '.join(me['scopes']) or 'none'}", highlight=False)


app.command()(dev)


def main() -> None:
    try:
        app()
    except ApiError as e:
        err.print(f"error: {e.message}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(1)
    except CliError as e:
        err.print(f"error: {e}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(2)
