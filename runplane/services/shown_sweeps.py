"""Sweeps as an answer shows them: each request of ``sweeps`` on one sweep, answered with the
sweep and its members counted live (``sweeps.progress``); a listing's, as their records last saw
them (``recorded``)."""

from __future__ import annotations

from dataclasses import dataclass

from runplane.domain.sweeps import PENDING, Sweep, SweepSpec
from runplane.domain.tenancy import Principal
from runplane.ports import Ports
from runplane.services import sweeps
from runplane.services.sweeps import Progress


@dataclass(frozen=True)
class Shown:
    """A sweep with its members counted live."""

    sweep: Sweep
    progress: Progress
    created: bool = False
    """Made by this request (create only; False: a replay of the same Idempotency-Key)."""
    retried: int = 0
    """Members this request ran again (retry only)."""


def recorded(sweep: Sweep) -> Shown:
    """``sweep`` with its members counted as its record last saw them (no read)."""
    counts, failures = sweep.tally()
    held = sweep.waiting_on and sweep.finished_at is None and not sweep.killed
    waiting_for = f"waiting for {', '.join(sweep.waiting_on)}" if held else None
    return Shown(sweep, Progress(counts, failures, sweep.status.count(PENDING), waiting_for))


def _shown(ports: Ports, sweep: Sweep, *, created: bool = False, retried: int = 0) -> Shown:
    return Shown(sweep, sweeps.progress(ports, sweep), created, retried)


def create(ports: Ports, principal: Principal, spec: SweepSpec, idempotency_key: str | None) -> Shown:
    """``sweeps.create_sweep``, counted."""
    made = sweeps.create_sweep(ports, principal, spec, idempotency_key)
    return _shown(ports, made.sweep, created=made.created)


def set_max_parallel(ports: Ports, principal: Principal, sweep_id: str, most: int | None) -> Shown:
    """``sweeps.set_max_parallel``, counted."""
    return _shown(ports, sweeps.set_max_parallel(ports, principal, sweep_id, most))


def kill(ports: Ports, principal: Principal, sweep_id: str) -> Shown:
    """``sweeps.kill_sweep``, counted."""
    return _shown(ports, sweeps.kill_sweep(ports, principal, sweep_id))


def retry(ports: Ports, principal: Principal, sweep_id: str) -> Shown:
    """``sweeps.retry_sweep``, counted, with how many members it ran again."""
    sweep, again = sweeps.retry_sweep(ports, principal, sweep_id)
    return _shown(ports, sweep, retried=again)
