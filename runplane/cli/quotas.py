"""``runplane quota set|ls|show|rm``: what users and groups may hold of the pools, and their use.

A quota's subject is a user (``alice``) or a group (``@vision``). Admins set and remove quotas;
everyone may list and show those that apply to them.
"""

from __future__ import annotations

import enum
import math
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from runplane.api.tenancy_models import QuotaView
from runplane.cli.common import CliError, cell, client, dumps, err, out, print_json, when

JSON = Annotated[bool, typer.Option("--json", help="print JSON on stdout")]
SUBJECT = Annotated[str, typer.Argument(metavar="USER|@GROUP", help="a user (alice) or a group (@vision)")]

quota_app = typer.Typer(
    no_args_is_help=True,
    help="Quotas of users and groups: runs, GPUs and cpus at once, GPU- and cpu-hours per period.",
)


def register(app: typer.Typer) -> None:
    app.add_typer(quota_app, name="quota")


class Period(enum.StrEnum):
    """The calendar periods (UTC) budgets are counted in (runplane.domain.quotas.Period)."""

    day = "day"
    week = "week"
    month = "month"


def subject_of(q: QuotaView) -> str:
    """How a quota's user or group is written: ``alice``, ``@vision``."""
    return q.name if q.kind == "user" else f"@{q.name}"


def number(value: float) -> str:
    """``value`` for a person: whole numbers plain, others with at most two decimals."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def used(use: float, limit: float | None, unit: str) -> str:
    """Use against its limit: ``1/2 GPUs``, ``12.5/200 GPU-h``; ``3 runs`` where none applies."""
    return f"{number(use)} {unit}" if limit is None else f"{number(use)}/{number(limit)} {unit}"


def uses(q: QuotaView) -> list[tuple[str, str]]:
    """Each limit of ``q`` with its use, as (what, "use/limit unit")."""
    u = q.usage
    return [
        ("running", used(u.running, q.max_running, "runs")),
        ("gpus", used(u.gpus, q.max_gpus, "GPUs")),
        ("cpus", used(u.cpus, q.max_cpus, "cpus")),
        ("gpu-hours", used(u.gpu_hours, q.gpu_hours, "GPU-h")),
        ("cpu-hours", used(u.cpu_hours, q.cpu_hours, "cpu-h")),
    ]


def _subject(subject: str) -> str:
    """``subject`` checked for a name (the API judges the name itself)."""
    if not subject.removeprefix("@"):
        raise CliError(f"{subject!r} names no user or group: give a user (alice) or a group (@vision)")
    return subject


def _finite(**values: float | None) -> None:
    for flag, value in values.items():
        if value is not None and not math.isfinite(value):
            raise CliError(f"--{flag.replace('_', '-')} must be a finite number, got {value}")


@quota_app.command("set")
def quota_set(
    ctx: typer.Context,
    subject: SUBJECT,
    max_running: Annotated[int | None, typer.Option(min=0, help="runs started and not yet ended, at once")] = None,
    max_gpus: Annotated[int | None, typer.Option(min=0, help="GPUs held at once")] = None,
    max_cpus: Annotated[float | None, typer.Option(min=0, help="cpus held at once")] = None,
    gpu_hours: Annotated[float | None, typer.Option(min=0, help="GPU-hours per period")] = None,
    cpu_hours: Annotated[float | None, typer.Option(min=0, help="cpu-hours per period")] = None,
    period: Annotated[Period | None, typer.Option(help="the period budgets count in, UTC (default: month)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the quota as JSON")] = False,
) -> None:
    """Set the quota of USER or @GROUP (administrators).

    The limits given replace all it had: one left out no longer applies.
    """
    limits = {"max_running": max_running, "max_gpus": max_gpus, "max_cpus": max_cpus}
    limits |= {"gpu_hours": gpu_hours, "cpu_hours": cpu_hours}
    if all(v is None for v in limits.values()) and period is None:
        raise CliError(
            "give at least one of --max-running, --max-gpus, --max-cpus, --gpu-hours, --cpu-hours, --period "
            "(runplane quota rm removes a quota)"
        )
    _finite(max_cpus=max_cpus, gpu_hours=gpu_hours, cpu_hours=cpu_hours)
    stored = client(ctx).set_quota(
        _subject(subject),
        max_running=max_running,
        max_gpus=max_gpus,
        max_cpus=max_cpus,
        gpu_hours=gpu_hours,
        cpu_hours=cpu_hours,
        period=period.value if period is not None else None,
    )
    if as_json:
        print_json(stored)
        return
    _show(stored)


@quota_app.command("ls")
def quota_ls(ctx: typer.Context, as_json: JSON = False) -> None:
    """List quotas with their use: every one (administrators), or those that apply to you."""
    found = client(ctx).quotas()
    if as_json:
        print_json({"quotas": dumps(found)})
        return
    table = Table("quota", "running", "gpus", "cpus", "gpu-hours", "cpu-hours", "period")
    for q in found:
        table.add_row(*map(cell, (subject_of(q), *(text for _, text in uses(q)), q.usage.period)))
    out.print(table)
    if not found:
        err.print("no quotas", style="dim", highlight=False)


@quota_app.command("show")
def quota_show(ctx: typer.Context, subject: SUBJECT, as_json: JSON = False) -> None:
    """Show the quota of USER or @GROUP and its use."""
    found = client(ctx).quota(_subject(subject))
    if as_json:
        print_json(found)
        return
    _show(found)


@quota_app.command("rm")
def quota_rm(
    ctx: typer.Context,
    subject: SUBJECT,
    as_json: Annotated[bool, typer.Option("--json", help='print {"quota": ..., "removed": true}')] = False,
) -> None:
    """Remove the quota of USER or @GROUP (administrators): their runs are no longer held to it."""
    client(ctx).delete_quota(_subject(subject))
    if as_json:
        print_json({"quota": subject, "removed": True})
        return
    err.print(Text(f"{subject}: quota removed"), highlight=False)


def _show(q: QuotaView) -> None:
    table = Table.grid(padding=(0, 2))
    rows = [("quota", subject_of(q)), *uses(q), ("period", q.usage.period), ("updated", when(q.updated_at))]
    for key, value in rows:
        table.add_row(Text(key, style="bold"), cell(value))
    out.print(table)
