"""What a run's figures mean: whether it is over a limit, and how it ended. Pure: no I/O.

The executor observes (the clock, the store's kill and lease, the walks of its files, the bytes
of its output, the engine's word on its exited container) and asks here what that comes to:
an ``Outcome``, or None while the run may go on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from runplane.domain.runs import Run
from runplane.domain.states import FailureReason, RunState
from runplane.domain.units import format_bytes, format_duration
from worker_agent.outcome import Outcome
from worker_agent.run_config import ExecutorConfig
from worker_agent.usage import Tree

FINAL = frozenset({FailureReason.KILLED, FailureReason.TIME_LIMIT, FailureReason.DISK_LIMIT, FailureReason.LOG_LIMIT})
"""How a run ends whether or not its worker hands its runs back meanwhile: a kill, or a limit it passed
(in its grace too)."""

REMOVED = "the container was removed from the Docker engine while it ran (not by runplane)"


@dataclass(frozen=True)
class Limits:
    """A run's own limits (``RunSpec.resources``) and its pool's (``max_output_files``,
    ``max_log_size``). None: no such limit."""

    time: float | None = None
    disk: int | None = None
    memory: int | None = None
    max_output_files: int = 100_000
    max_log_size: int = 1024**3
    idle: float | None = None
    """An interactive run's: the most seconds without input (its pool's ``max_idle_interactive``)."""

    @classmethod
    def of(cls, run: Run, config: ExecutorConfig) -> Limits:
        res = run.spec.resources
        idle = config.max_idle_interactive if run.spec.interactive else None
        return cls(res.time, res.disk, res.memory, config.max_output_files, config.max_log_size, idle)


@dataclass(frozen=True)
class Seen:
    """What one look at a running run found."""

    elapsed: float
    """Seconds since its container started."""
    log_bytes: int = 0
    """What it wrote to stdout and stderr together, the bytes dropped past the log limit too."""
    disk: Outcome | None = None
    """What the latest check of its files found over a limit (``disk_over``)."""
    lease_lost: bool = False
    """The store says this worker no longer holds the attempt."""
    requeue: bool = False
    """This worker was told to stop and hand its runs back."""
    kill: bool = False
    kill_reason: str | None = None
    """Why the kill was asked for, when its asker said (``Run.kill_reason``)."""
    idle: float | None = None
    """An interactive run: seconds since its last input (None: not interactive, or its input ended)."""


def killed(message: str, reason: str | None) -> Outcome:
    """A kill asked for in the store, saying why when the asker said."""
    return Outcome(RunState.KILLED, FailureReason.KILLED, f"{message}: {reason}" if reason else message)


def stop(seen: Seen, limits: Limits) -> Outcome | None:
    """Why the running run must be stopped now, or None. The first that holds wins: a lost lease,
    a hand-back (``queued``, not a final state: the run goes to its queue again), a kill, the
    time limit, an interactive run's time without input, the disk limits, the log limit."""
    if seen.lease_lost:
        return Outcome(RunState.FAILED, FailureReason.WORKER_LOST, "lease lost")
    if seen.requeue:
        return Outcome(RunState.QUEUED, message="worker terminated")
    if seen.kill:
        return killed("killed on request", seen.kill_reason)
    if limits.time is not None and seen.elapsed > limits.time:
        return Outcome(
            RunState.TIMED_OUT, FailureReason.TIME_LIMIT, f"exceeded its time limit of {format_duration(limits.time)}"
        )
    if limits.idle is not None and seen.idle is not None and seen.idle > limits.idle:
        return Outcome(
            RunState.KILLED, FailureReason.KILLED, f"no input for {format_duration(limits.idle)} (max_idle_interactive)"
        )
    return seen.disk or log_over(seen.log_bytes, limits)


def log_over(log_bytes: int, limits: Limits) -> Outcome | None:
    """Over ``max_log_size``: the run is stopped, and its log keeps what came before."""
    if log_bytes <= limits.max_log_size:
        return None
    return Outcome(
        RunState.FAILED,
        FailureReason.LOG_LIMIT,
        f"wrote more than {format_bytes(limits.max_log_size)} to stdout and stderr, the pool's "
        "max_log_size: stopped (the log keeps what came before the limit)",
    )


def disk_over(
    output: Tree,
    home: Tree,
    layer: Tree,
    limits: Limits,
    volumes: Tree | None = None,
    inputs: Tree | None = None,
    checkpoint: Tree | None = None,
) -> Outcome | None:
    """What the run wrote (its output directory, its home directory, its container's writable
    layer, its image's ``VOLUME`` paths and its ``checkpoint`` directory, as walked) with its
    ``inputs`` (their bytes) against its disk limit, by apparent size, and against the pool's
    ``max_output_files``, by count of what it wrote. What could not be walked counts as over,
    never as 0. An Outcome over a limit uploads nothing."""
    volumes = volumes or Tree()
    trees = [("output directory", output), ("container file system", layer), ("home", home), ("volumes", volumes)]
    trees.append(("checkpoint", checkpoint or Tree()))
    inputs = inputs or Tree()
    trees.append(("inputs", inputs))
    unreadable = "; ".join(f"{name}: {tree.unreadable}" for name, tree in trees if tree.unreadable)
    if unreadable:
        return Outcome(
            RunState.FAILED,
            FailureReason.DISK_LIMIT,
            f"what it wrote cannot be counted ({unreadable}), so it counts as over its disk limit",
            upload=False,
        )
    most = limits.max_output_files
    if sum(tree.entries for _, tree in trees) > most:
        names = ["output directory", "home", "volumes", "container file system"]
        names += ["checkpoint directory"] if checkpoint is not None else []
        counted = f"{', '.join(names[:-1])} and {names[-1]}"
        held = (
            f"; its checkpoint directory holds {checkpoint.entries} of them"
            if checkpoint and checkpoint.entries
            else ""
        )
        return Outcome(
            RunState.FAILED,
            FailureReason.DISK_LIMIT,
            f"wrote more than {most} files and directories ({counted} together), the pool's max_output_files{held}",
            upload=False,
        )
    total = sum(tree.size for _, tree in trees)
    if limits.disk is None or total <= limits.disk:
        return None
    detail = ", ".join(f"{name} {format_bytes(tree.size)}" for name, tree in trees if tree.size)
    more = "more than " if any(tree.stopped for _, tree in trees) else ""
    return Outcome(
        RunState.FAILED,
        FailureReason.DISK_LIMIT,
        f"{'holds, with its inputs,' if inputs.size else 'wrote'} {more}{format_bytes(total)} ({detail}), over the "
        f"{format_bytes(limits.disk)} disk limit",
        upload=False,
    )


def ended(
    stopped: Outcome | None, state: dict[str, Any], result: dict[str, Any], limits: Limits, stderr_tail: bytes = b""
) -> Outcome:
    """How the run ended, from the engine's word on its exited container: ``state`` (the
    inspected ``State``) and ``result`` (the wait's answer, with ``Error`` when the wait failed).
    ``stopped``: why it was stopped, or found over a limit after it exited; it stands, with the
    exit code, unless the container was removed under it. ``stderr_tail``: the last bytes of its
    stderr, whose last line a nonzero exit quotes."""
    if state.get("Status") in ("removing", "dead"):  # someone ran `docker rm -f` on it
        return Outcome(RunState.FAILED, FailureReason.CONTAINER_ERROR, REMOVED)
    exit_code = result.get("StatusCode", state.get("ExitCode"))
    if stopped is not None:
        return replace(stopped, exit_code=exit_code)
    if state.get("OOMKilled"):
        return Outcome(
            RunState.FAILED,
            FailureReason.OUT_OF_MEMORY,
            f"ran out of memory: the container used its whole {format_bytes(limits.memory or 0)} memory limit "
            "and the kernel stopped it (OOM)",
            exit_code,
        )
    if result.get("Error") or state.get("Error"):
        return Outcome(
            RunState.FAILED,
            FailureReason.CONTAINER_ERROR,
            f"container error: {result.get('Error') or state.get('Error')}",
            exit_code,
        )
    if exit_code == 0:
        return Outcome(RunState.SUCCEEDED, None, "command exited with code 0", 0)
    tail = stderr_tail[-300:].decode(errors="replace").strip()
    message = f"command exited with code {exit_code}"
    if tail:
        message += f"; stderr ends with: {tail.splitlines()[-1][:200]}"
    return Outcome(RunState.FAILED, FailureReason.NONZERO_EXIT, message, exit_code)
