"""``runplane pools`` and ``runplane workers``: where runs go and who runs them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from runplane.cli.common import cell, client, dumps, id_column, out, print_json, when
from runplane.client import PoolView, WorkerView
from runplane.domain.units import format_duration, format_progress

JSON = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]


def register(app: typer.Typer) -> None:
    app.command()(pools)
    app.command()(workers)


def pools(ctx: typer.Context, as_json: JSON = False) -> None:
    """List pools: shape, backlog, workers and their agents, launches, the last launch error and
    workers the stack refused for their agent's version."""
    found = client(ctx).pools()
    if as_json:
        print_json({"pools": dumps(found)})
        return
    table = Table(
        "name", "backend", "shape", "workers (starting/idle/busy)", "agents", "min-max", "backlog", "launches (failed)"
    )
    problems = []
    for p in found:
        s, w = p.shape, p.workers
        table.add_row(
            *map(
                cell,
                (
                    p.name + (" (disabled)" if p.disabled else ""),
                    p.backend,
                    f"{s.cpus:g} cpu, {s.gpus} gpu, {s.memory // 2**20} MiB",
                    f"{w.starting}/{w.idle}/{w.busy}",
                    " ".join(f"{version}x{n}" for version, n in p.agent_versions.items()),
                    f"{p.min_workers}-{p.max_workers}",
                    p.backlog,
                    f"{p.launches.launched} ({p.launches.failed})",
                ),
            )
        )
        if p.disabled:
            problems.append(f"{p.name}: disabled: {p.disabled}")
        elif p.last_error:
            problems.append(f"{p.name}: last launch error at {when(p.last_error_at)}: {p.last_error}")
        problems += [f"{p.name}: worker {worker} refused: {why}" for worker, why in p.refused_workers.items()]
    out.print(table)
    counted = [p.counted_at for p in found if p.counted_at is not None]
    if counted:
        out.print(f"backlog and workers as the dispatcher counted them, the oldest at {when(min(counted))}")
    notes = [kept for p in found if (kept := pool_retention(p)) is not None]
    notes += [said for p in found if (said := pool_sessions(p)) is not None]
    for line in notes + problems:
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def pool_sessions(pool: PoolView) -> str | None:
    """One line saying who may open sessions into ``pool``'s runs, or None when its owners may (and
    admins may not), as by default."""
    sessions = pool.sessions
    if sessions is None or (sessions.allow_exec and not sessions.allow_admin_exec):
        return None
    if not sessions.allow_exec:
        return f"{pool.name}: no sessions into its runs (allow_exec: false)"
    return f"{pool.name}: admins may open sessions into users' runs (allow_admin_exec: true)"


def pool_retention(pool: PoolView) -> str | None:
    """One line saying how long ``pool`` keeps what its runs leave, or None when it keeps all for good."""
    kept = pool.retention
    if kept is None or (kept.outputs, kept.logs, kept.runs) == (None, None, None):
        return None
    outputs, logs, runs = (
        f"{what} {'for good' if seconds is None else format_duration(seconds)}"
        for what, seconds in (("outputs", kept.outputs), ("logs", kept.logs), ("run records", kept.runs))
    )
    return f"{pool.name}: keeps {outputs}, {logs} and {runs} after a run ends"


def workers(
    ctx: typer.Context,
    pool: Annotated[str | None, typer.Option("--pool", help="only this pool's workers")] = None,
    as_json: JSON = False,
) -> None:
    """List workers with their state and last heartbeat."""
    found = client(ctx).workers(pool)
    if as_json:
        print_json({"workers": dumps(found)})
        return
    table = Table(id_column(), "pool", "status", "slots free", "runs", "done", "heartbeat")
    for w in found:
        table.add_row(
            *map(
                cell,
                (
                    w.id,
                    w.pool,
                    worker_status(w),
                    f"{w.free_slots}/{w.slots}",
                    ",".join(w.runs),
                    w.runs_done,
                    w.heartbeat_at,
                ),
            )
        )
    out.print(table)


def worker_status(w: WorkerView) -> str:
    """A worker's status, with the image it pulls before its first run and how far it is:
    'starting: pulling IMAGE (0.8 of 1.8 GB)'."""
    if w.pulling is None:
        return w.status
    far = f" ({format_progress(min(w.pulling.done, w.pulling.total), w.pulling.total)})" if w.pulling.total > 0 else ""
    return f"{w.status}: pulling {w.pulling.image}{far}"
