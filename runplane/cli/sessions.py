"""``runplane exec``, ``shell`` and ``port-forward``: sessions into a live run of yours
(docs/sessions.md). Each opens a session through the API and dials its relay; ``exec`` exits as
the command did, 255 when the session ended before it."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from runplane.cli.common import CliError, ExitCode, client, err, exit_code, out, say_error
from runplane.cli.last_run import RUN_ID, named_by_id, run_id_or_last
from runplane.client import ApiError, Client, WaitTimeout
from runplane.client._forward import Forward, loopback_listener
from runplane.client._terminal import Detached, forwarded_signals, raw_mode, terminal_size
from runplane.client.sessions import (
    LOST,
    Access,
    Feeder,
    Link,
    SessionLost,
    meet,
    open_link,
    over_unless_running,
    pump_exec,
    usable_term,
)

RUN = Annotated[str, typer.Argument(metavar="RUN", help="the run's id (it must be running)", show_default=False)]
PORTS = re.compile(r"(?:(\d{1,5}):)?(\d{1,5})")
BROKEN_PIPE = 141
ENDED_WAIT = 10.0
REPLAY_POLL = 0.3
"""How long port-forward waits for a run whose session said it ended to show its final state."""


def register(app: typer.Typer) -> None:
    app.command("exec", context_settings={"allow_interspersed_args": False})(exec_command)
    app.command()(shell)
    app.command("port-forward")(port_forward)
    app.command()(attach)


def exec_command(
    ctx: typer.Context,
    run_id: RUN,
    command: Annotated[list[str], typer.Argument(metavar="-- CMD...", help="the command and its arguments")],
    interactive: Annotated[bool, typer.Option("--interactive", "-i", help="send stdin to the command")] = False,
    tty: Annotated[bool, typer.Option("--tty", "-t", help="give the command a terminal (stdin must be one)")] = False,
) -> None:
    """Run a command in a running run's container, as the run's user; exit as it did."""
    raise typer.Exit(_interact(client(ctx), run_id, "exec", command_words(command), interactive, tty))


def command_words(words: list[str]) -> list[str]:
    """The command after ``RUN --``: the ``--`` after the run's id reaches the command's words (an
    argument ends the options), so the first one is taken off."""
    return words[1:] if words[:1] == ["--"] else words


def shell(ctx: typer.Context, run_id: RUN) -> None:
    """A shell in a running run's container (bash if the image has it, else sh)."""
    raise typer.Exit(_interact(client(ctx), run_id, "shell", None, True, True))


def port_forward(
    ctx: typer.Context,
    run_id: RUN,
    ports: Annotated[
        str,
        typer.Argument(
            metavar="[LOCAL:]REMOTE",
            help="forward 127.0.0.1:LOCAL here (0 or none: any free port) to 127.0.0.1:REMOTE inside the run",
        ),
    ],
) -> None:
    """Forward a local port to a port inside a running run (its own 127.0.0.1, network or not)."""
    local, remote = parse_ports(ports)
    raise typer.Exit(_forward(client(ctx), run_id, local, remote))


def parse_ports(text: str) -> tuple[int, int]:
    """``[LOCAL:]REMOTE`` as (local, remote); LOCAL defaults to 0 (any free port)."""
    match = PORTS.fullmatch(text.strip())
    if match is None:
        raise CliError(f"{text!r} is not [LOCAL:]REMOTE (ports, e.g. 18000:8000 or 8000)")
    local, remote = int(match.group(1) or 0), int(match.group(2))
    if not 1 <= remote <= 65535 or local > 65535:
        raise CliError(f"{text!r}: REMOTE is a port 1-65535, LOCAL 0-65535")
    return local, remote


def _open(api: Client, run_id: str, kind: str, **fields: Any) -> Access:
    with named_by_id(run_id):
        return Access.read(api.open_session(run_id, kind, **fields))


def _interact(api: Client, run_id: str, kind: str, command: list[str] | None, stdin: bool, tty: bool) -> int:
    if kind == "exec" and not command:
        raise CliError("no command given: runplane exec RUN -- CMD...")
    terminal = tty and os.isatty(0) and os.isatty(1)
    if tty and not terminal:
        err.print("warning: stdin or stdout is not a terminal; going on without one", markup=False, highlight=False)
    size = terminal_size(0) if terminal else None
    rows, cols = size if size is not None else (None, None)
    term = usable_term(os.environ.get("TERM")) if terminal else None
    fields = {"command": command, "tty": terminal, "stdin": stdin, "term": term, "rows": rows, "cols": cols}
    access = _open(api, run_id, kind, **fields)
    return _drive(api, run_id, access, stdin=stdin, terminal=terminal, size=size)


@dataclass
class Ended:
    """How a session the user drove ended: ``lost`` (the session ended before its command did),
    ``left`` (``~.`` typed); ``met``: whether the worker joined it (else nothing of the command was
    shown)."""

    lost: SessionLost | None = None
    left: bool = False
    met: bool = False


def run_over(api: Client, run_id: str) -> Callable[[], str | None]:
    """For ``meet``: how run ``run_id`` ended (``failed``, ...) once it is no longer running."""
    return over_unless_running(lambda: api.get(run_id).state)


def renewal(api: Client, run_id: str, access: Access) -> Callable[[], Access]:
    """A fresh ticket for the session of ``access``: its link dials again with it after a drop."""
    return lambda: Access.read(api.session_ticket(run_id, access.session_id))


def abandon(api: Client, run_id: str, session_id: str) -> None:
    """Close a session that was never joined or was left (best effort: it holds one of the run's
    slots until it expires otherwise, and its worker waits for this side to dial again)."""
    with contextlib.suppress(ApiError, OSError):
        api.close_session(run_id, session_id)


def _drive(
    api: Client,
    run_id: str,
    access: Access,
    *,
    stdin: bool,
    terminal: bool,
    size: tuple[int, int] | None,
    ended: Ended | None = None,
    greeting: str | None = None,
) -> int:
    """Join the session of ``access`` (of run ``run_id``) and move the user's input and the
    command's output until its EXIT: its exit status; LOST when the session ended first or ``~.``
    was typed (``ended`` says which, and nothing is said: else the reason is said on stderr). A
    session that could not be joined is closed; waiting to join it ends when the run does.
    ``greeting`` is said on stderr once the worker joined."""
    control_r, control_w = os.pipe()
    link: Link | None = None
    feeder: Feeder | None = None
    met = left = False
    try:
        with forwarded_signals(control_w, terminal=terminal):
            link = open_link(access, renew=renewal(api, run_id, access))
            hello = meet(link, size, run_over=run_over(api, run_id))
            if hello.get("input") == "ended":  # an attach: the command had the end of its input
                err.print("the command's input has ended: only its output comes", markup=False, highlight=False)
            met = True
            if ended is not None:
                ended.met = True
            if greeting is not None:
                err.print(greeting, style="cyan", markup=False, highlight=False)
            reasons: list[str] = []  # said once the terminal is itself again
            with raw_mode(0) if terminal else contextlib.nullcontext():
                feeder = Feeder(link, 0 if stdin else None, control_r, lambda: terminal_size(0), terminal).start()
                status = pump_exec(link, _write, reasons.append)
            for reason in reasons:
                say_error(reason)
            return status
    except SessionLost as e:
        left = feeder is not None and feeder.detached  # ~. typed: left on purpose
        lost = feeder.error if feeder is not None and feeder.error else e
        if ended is not None:
            ended.lost, ended.left = lost, left
        elif not left:  # an exec's command is killed when it is left
            say_error(str(lost))
        return LOST
    except Detached as e:  # a second ^C, SIGTERM or SIGHUP
        left = True
        if ended is not None:
            ended.left = True
        return e.status
    except BrokenPipeError:
        return BROKEN_PIPE
    finally:
        if feeder is not None:
            feeder.stop()
        if not met or left:  # closed first: else its worker would wait for this side to dial again
            abandon(api, run_id, access.session_id)
        if link is not None:
            link.close()
        os.close(control_r)
        os.close(control_w)


def attach(ctx: typer.Context, run_id: RUN_ID = None) -> None:
    """Attach to an interactive run's command (runplane run -i): your input goes to it, its output
    comes here; exit as it did. With a terminal, ~. leaves it running (attach again later)."""
    api, rid = client(ctx), run_id_or_last(run_id)
    status, ended = attach_run(api, rid)
    if ended and status != ExitCode.OK:  # killed (no input for too long, say), or its command failed
        with contextlib.suppress(ApiError, WaitTimeout):
            view = api.get(rid).wait(timeout=ENDED_WAIT).view
            if view.failure is not None:
                say_error(f"run {rid} {view.state}: {view.failure.message}")
            if status == LOST:  # the session ended with the run: exit as the run did (run --wait)
                status = exit_code(view)
    raise typer.Exit(status)


def attach_run(api: Client, run_id: str) -> tuple[int, bool]:
    """Attach to interactive run ``run_id`` (with the local terminal if the run has a terminal and
    this is one): the exit status, and whether the run's command ended (its EXIT came, or the
    session ended with the run: its final state tells the rest; when it ended before the worker
    joined, the run's logs are written out, as they were never shown). Leaving with ``~.``: 0, the
    run goes on; a session lost otherwise: LOST, said on stderr."""
    local = os.isatty(0) and os.isatty(1)
    size = terminal_size(0) if local else None
    rows, cols = size if size is not None else (None, None)
    term = usable_term(os.environ.get("TERM")) if local else None
    with named_by_id(run_id):
        answer = api.open_session(run_id, "attach", term=term, rows=rows, cols=cols)
    ended, terminal = Ended(), answer.tty and local
    # a shell's prompt is not yet a whole line of the run's log: the replay may lack it until Enter
    greeting = "● attached (~. leaves; press Enter if no prompt shows)" if terminal else None
    status = _drive(
        api, run_id, Access.read(answer), stdin=True, terminal=terminal, size=size, ended=ended, greeting=greeting
    )
    if ended.left:
        sys.stderr.write("\r\n")  # off the line the command left the cursor on
        sys.stderr.flush()
        err.print(f"left {run_id}; it goes on (runplane attach {run_id} to return)", markup=False, highlight=False)
        return (ExitCode.OK if status == LOST else status), False
    if ended.lost is None:
        return status, True
    if ended.lost.reason == "run_ended":
        if not ended.met:
            _replay(api, run_id)
        return LOST, True
    say_error(str(ended.lost))
    return LOST, False


def _replay(api: Client, run_id: str) -> None:
    """Write the logs of run ``run_id`` (ended, or ending) out: its output, never shown live."""
    with contextlib.suppress(ApiError):
        for stream, text in api.get(run_id).follow_chunks(("stdout", "stderr"), poll=REPLAY_POLL):
            writer = sys.stderr if stream == "stderr" else sys.stdout
            writer.write(text)
            writer.flush()


def _write(channel: int, data: bytes) -> None:
    fd = 2 if channel == 3 else 1
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _forward(api: Client, run_id: str, local: int, remote: int) -> int:
    try:
        listener = loopback_listener(local)
    except OSError as e:  # a local port taken: a local problem, exit 2 as a usage error
        raise CliError(f"cannot listen on 127.0.0.1:{local}: {e.strerror or e}") from None
    port = listener.getsockname()[1]
    link: Link | None = None
    forward: Forward | None = None
    access: Access | None = None
    met = left = False
    try:
        access = _open(api, run_id, "port_forward", port=remote)
        link = open_link(access, renew=renewal(api, run_id, access))
        meet(link, run_over=run_over(api, run_id))
        met = True
        forward = Forward(link, remote, listener, say=lambda line: err.print(line, markup=False, highlight=False))
        out.print(f"forwarding 127.0.0.1:{port} -> port {remote} of {run_id}", markup=False, highlight=False)
        sys.stdout.flush()
        forward.accept()
        ended = forward.pump()
    except SessionLost as e:
        ended = e
    except KeyboardInterrupt:  # ^C: the way to stop forwarding
        left = True
        return ExitCode.OK
    finally:
        if forward is not None:
            forward.close()
        listener.close()
        if access is not None and (not met or left):  # closed first: else its worker waits for a redial
            abandon(api, run_id, access.session_id)
        if link is not None:
            link.close()
    if ended is None:
        return ExitCode.OK
    if ended.reason == "run_ended":
        state = _state(api, run_id)
        err.print(f"run {run_id} ended ({state}); closing 127.0.0.1:{port}", markup=False, highlight=False)
        return ExitCode.OK
    say_error(str(ended))
    return LOST


def _state(api: Client, run_id: str) -> str:
    """The state the run ended in, for the message (the session is over either way)."""
    try:
        return str(api.get(run_id).wait(timeout=ENDED_WAIT).state)
    except WaitTimeout:
        return str(api.get(run_id).state)
    except ApiError:
        return "state unknown"
