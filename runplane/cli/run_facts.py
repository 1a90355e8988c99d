"""The lines ``runplane status`` shows of a run's pools to fall back to, its checkpoint and its
pieces (docs/scheduling.md, docs/checkpoints.md). Sizes are said in powers of 1024 (KiB, MiB, GiB),
as the dashboard says them."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from runplane.api.models import RunView
from runplane.domain.units import format_duration, format_size


def moment_text(moment: datetime, now: float) -> str:
    """``09:30:12 UTC (40s ago)``; with its date (``2026-11-23 09:30:12 UTC (2d1h ago)``) when it is
    not of today in UTC; ``(in 5m)`` for a moment to come."""
    at = moment.astimezone(UTC)
    today = datetime.fromtimestamp(now, UTC).date()
    said = at.strftime("%H:%M:%S UTC" if at.date() == today else "%Y-%m-%d %H:%M:%S UTC")
    left = at.timestamp() - now
    if abs(left) < 0.5:
        return f"{said} (now)"
    return f"{said} ({'in ' if left > 0 else ''}{format_duration(abs(left))}{'' if left > 0 else ' ago'})"


def _times(n: int) -> str:
    return f"{n} time{'s' if n != 1 else ''}"


def fallback_text(view: RunView, now: float | None = None) -> str | None:
    """``pools gpu-spot → gpu-ondemand (now on gpu-spot); moves on after 15s queued or 3 preemptions
    there (preempted 1 time on gpu-spot); next move at 10:42:05 UTC (in 12s)`` for a run with pools
    to fall back to; None for one without."""
    spec = view.spec
    if not spec.fallback:
        return None
    now = time.time() if now is None else now
    chain = [spec.queue or view.queue, *spec.fallback]
    last = view.queue == chain[-1]
    text = f"pools {' → '.join(chain)} (now on {view.queue}{', the last' if last else ''})"
    if last:
        return text
    rules = [f"{format_duration(spec.fallback_after)} queued" if spec.fallback_after else ""]
    if spec.fallback_after_preemptions:
        rules.append(
            f"{spec.fallback_after_preemptions} preemption{'s' if spec.fallback_after_preemptions != 1 else ''}"
        )
    text += f"; moves on after {' or '.join(r for r in rules if r)}"
    if spec.fallback_after_preemptions:
        text += f" there (preempted {_times(view.preemptions)} on {view.queue})"
    if view.state == "queued" and view.fallback_at is not None:
        text += f"; next move at {moment_text(view.fallback_at, now)}"
    return text


def checkpoint_text(view: RunView, now: float | None = None) -> str | None:
    """``7 (12 files, 3.1 MiB), synced 09:30:12 UTC (40s ago) by attempt 2`` (``of run X`` when it
    is the checkpoint it starts from); ``none synced yet (...)`` for a run that checkpoints, saying
    when it is synced."""
    shown = view.checkpoint
    if shown is None:
        rule = view.spec.checkpoint
        if rule is not None and rule.interval is not None:
            return f"none synced yet (synced every {format_duration(rule.interval)} and whenever the command exits)"
        if rule is not None:
            return "none synced yet (synced whenever the command exits)"
        return "none synced yet" if view.spec.from_checkpoint is not None else None
    now = time.time() if now is None else now
    size = f"{shown.files} file{'s' if shown.files != 1 else ''}, {format_size(shown.bytes)}"
    of = f" of run {shown.series}" if shown.series else ""
    return f"{shown.seq}{of} ({size}), synced {moment_text(shown.synced_at, now)} by attempt {shown.attempt}"


def pieces_text(view: RunView) -> str | None:
    """``piece 3 of at most 100 (exit code 85 starts it again)`` while the run goes on; ``went in 3
    pieces`` once it has ended; None for a run whose rule has no exit code."""
    rule = view.spec.checkpoint
    if rule is None or rule.exit_code is None:
        return None
    piece = view.pieces + 1
    if view.finished_at is not None:
        never = view.started_at is None and view.pieces == 0  # ended before it ran
        return None if never else f"went in {piece} piece{'s' if piece != 1 else ''}"
    return f"piece {piece} of at most {rule.piece_limit} (exit code {rule.exit_code} starts it again)"
