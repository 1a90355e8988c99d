"""``runplane usage``: what runs used (CPU- and GPU-hours, cost) per user, group or pool."""

from __future__ import annotations

import enum
from typing import Annotated

import typer
from rich.table import Table

from runplane.api.tenancy_models import UsageRow
from runplane.cli.common import cell, client, err, out, print_json, when
from runplane.cli.quotas import number


class By(enum.StrEnum):
    """What a report's rows are per (runplane.api.models.UsageBy)."""

    user = "user"
    group = "group"
    pool = "pool"


MOMENT = "an ISO 8601 date or time (2026-11-01, 2026-11-01T09:30:00Z; UTC without a zone) or Unix seconds"


def register(app: typer.Typer) -> None:
    app.command()(usage)


def usage(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="only this user's runs (another user's: administrators)")] = None,
    group: Annotated[str | None, typer.Option(help="only runs charged to this group")] = None,
    pool: Annotated[str | None, typer.Option(help="only runs of this pool")] = None,
    since: Annotated[
        str | None, typer.Option(help=f"runs submitted at or after this, {MOMENT} (default: this month's start)")
    ] = None,
    until: Annotated[str | None, typer.Option(help="runs submitted before this (default: now)")] = None,
    by: Annotated[By, typer.Option(help="a row per user, group or pool")] = By.user,
    as_json: Annotated[bool, typer.Option("--json", help="print the API's report as JSON")] = False,
) -> None:
    """Show what runs used: CPU-hours, GPU-hours and cost, per user, group or pool.

    Yours only, unless you are an administrator. A run counts in the window it was submitted in.
    """
    report = client(ctx).usage(user=user, group=group, pool=pool, since=since, until=until, by=by.value)
    if as_json:
        print_json(report)
        return
    table = Table(by.value, "runs", "cpu-hours", "gpu-hours", "cost")
    for row in report.rows:
        shown = row.key if row.key is not None else ("(no group)" if by == By.group else "-")
        table.add_row(*map(cell, (shown, *_figures(row))))
    if report.rows:
        table.add_row(*map(cell, ("total", *_figures(report.total))), style="bold")
    out.print(table)
    err.print(f"from {when(report.since)} until {when(report.until)}", style="dim", highlight=False)
    if not report.rows:
        err.print("no runs in this window", style="dim", highlight=False)


def _amount(value: float) -> str:
    """Like ``number``, but a small amount keeps two significant digits (a short run's 0.00028 h)."""
    return f"{value:.2g}" if 0 < abs(value) < 0.01 else number(value)


def _figures(row: UsageRow) -> tuple[str, str, str, str]:
    cost = "-" if row.cost is None else _amount(row.cost)
    return str(row.runs), _amount(row.cpu_seconds / 3600), _amount(row.gpu_seconds / 3600), cost
