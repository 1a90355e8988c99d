"""One run's checkpoint directory on this worker: restored before its container starts, synced to its
series every ``interval`` while it runs (the old checkpoints pruned after each sync), and once more when
its command exits or is stopped; each sync that made a checkpoint is recorded on the run
(``Run.checkpoint``) by its one writer, ``run_state``. The engine underneath: ``checkpoints``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from runplane.domain.checkpoints import (
    CheckpointCancelled,
    CheckpointStatus,
    CheckpointTooLarge,
    Manifest,
)
from runplane.domain.errors import LeaseLost, RunplaneError
from runplane.domain.states import FailureReason, RunState
from runplane.ports import ObjectStore
from runplane.services import checkpoints as series
from worker_agent import checkpoints
from worker_agent.checkpoint_files import Owner
from worker_agent.outcome import Outcome
from worker_agent.run_state import RunStateWriter

log = logging.getLogger(__name__)

KEEP = 2
"""The checkpoints of a series kept after each sync (the newest two complete ones)."""


class RunCheckpoints:
    """The checkpoint directory ``directory`` of the run ``state`` writes, capped at ``max_bytes`` (the
    run's disk limit). ``restore`` fills it before the container starts; ``start`` and ``stop`` sync it
    every ``spec.checkpoint.interval`` on a thread of its own; ``sync`` is one sync now (the final one,
    or a piece's end), never two at once, and never beside a prune. ``over`` is set once the thread
    found the checkpoint over the disk limit (the run is to end ``disk_limit``). Large files are copied
    into ``scratch`` as they are hashed."""

    def __init__(
        self,
        state: RunStateWriter,
        objects: ObjectStore,
        directory: Path,
        scratch: Path,
        clock: Callable[[], float],
        max_bytes: int | None,
    ) -> None:
        self.state, self.objects, self.directory, self.scratch = state, objects, directory, scratch
        self.clock = clock
        self.limits = checkpoints.CheckpointLimits(max_bytes=max_bytes)
        self.previous: Manifest | None = None
        """The checkpoint the directory was restored from or synced to last."""
        self.over: Outcome | None = None
        self.failures = 0
        """Syncs that failed (the checkpoint before them stayed the newest)."""
        self.failed: str | None = None
        """Why the latest sync failed; None when it did not."""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def interval(self) -> float | None:
        rule = self.state.run.spec.checkpoint
        return None if rule is None else rule.interval

    # -- before the container starts --------------------------------------------------------

    def restore(self, owner: Owner) -> Outcome | None:
        """Write into the (empty) directory the newest complete checkpoint of the run's own series; when
        it has none, the checkpoint it was pinned to at submit (``Run.restore_from``; that run's newest
        complete one when that one was pruned meanwhile); else leave it empty. The timeline says what
        was restored. An Outcome when the run ends here: a checkpoint that cannot be restored
        (``input_unavailable``, the directory left empty) or is over the run's disk limit."""
        run = self.state.run
        chosen: Manifest | None = None
        instead = ""
        try:
            chosen = series.newest(self.objects, run.id)
            source = run.restore_from
            if chosen is None and source is not None:
                chosen = series.numbered(self.objects, source.run, source.seq)
                if chosen is None:
                    chosen = series.newest(self.objects, source.run)
                    instead = f" (checkpoint {source.seq}, which it was started from, is gone: its newest instead)"
                if chosen is None:
                    return Outcome(
                        RunState.FAILED,
                        FailureReason.INPUT_UNAVAILABLE,
                        f"run {source.run}, whose checkpoint {source.seq} it starts from, has no checkpoint any "
                        "more (deleted?)",
                    )
            if chosen is None:
                return None
            checkpoints.write(self.objects, chosen, self.directory, self.limits, owner=owner)
        except CheckpointTooLarge as e:
            return Outcome(
                RunState.FAILED,
                FailureReason.DISK_LIMIT,
                f"its checkpoint cannot be restored: {e.message}",
                upload=False,
            )
        except (RunplaneError, OSError) as e:  # CheckpointUnusable, a blob gone, the store
            what = f"checkpoint {chosen.seq} of run {chosen.series}" if chosen is not None else "its checkpoint"
            why = e.message if isinstance(e, RunplaneError) else (e.strerror or type(e).__name__)  # no host path
            log.warning("run %s: %s cannot be restored: %s", run.id, what, why)
            return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, f"{what} cannot be restored: {why[:300]}")
        self.previous = chosen
        said = (
            f"restored checkpoint {chosen.seq} ({_holding(len(chosen.files), chosen.total_bytes)}) of "
            f"run {chosen.series}{instead}"
        )
        if chosen.series == run.id:  # its record names it already
            self.state.note(self.clock(), said)
        else:  # the run's checkpoint until its first sync: another run's
            status = _status(chosen, chosen.attempt, series=chosen.series)
            self.state.checkpointed(status, said)
        return None

    # -- while it runs -----------------------------------------------------------------------

    def start(self) -> None:
        """Sync every ``interval`` on a thread of its own, until ``stop`` (none without an interval)."""
        interval = self.interval
        if interval is None:
            return
        self._thread = threading.Thread(
            target=self._every, args=(interval,), name=f"checkpoint-{self.state.run.id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the syncs of ``start``: one under way gives up before its manifest (the one before stays
        the newest)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def _every(self, interval: float) -> None:
        while not self._stopping.wait(interval):
            try:
                over = self.sync(self._stopping.is_set)
            except LeaseLost as e:  # the executor finds it out too, and abandons the run
                log.warning("run %s: %s; checkpoints stop", self.state.run.id, e)
                return
            except Exception:  # a bug, or what no one foresaw: the run goes on, and so do its syncs
                log.exception("run %s: checkpoint sync failed", self.state.run.id)
                continue
            if over is not None:
                self.over = over
                return

    # -- a sync ------------------------------------------------------------------------------

    def sync(self, cancelled: Callable[[], bool] = lambda: False) -> Outcome | None:
        """Sync the directory now (what changed since the checkpoint before), record the checkpoint on
        the run and prune the old ones. An Outcome (``disk_limit``, no checkpoint written) when the
        directory is over the run's disk limit; a sync that fails otherwise is logged and the
        checkpoint before stays the newest. Raises LeaseLost when the record cannot be written."""
        with self._lock:
            run = self.state.run
            self.failed = None
            try:
                manifest = checkpoints.sync(
                    self.objects,
                    run.id,
                    self.directory,
                    self.previous,
                    self.limits,
                    attempt=run.attempt,
                    clock=self.clock,
                    scratch=self.scratch,
                    cancelled=cancelled,
                )
            except CheckpointTooLarge as e:
                return Outcome(
                    RunState.FAILED,
                    FailureReason.DISK_LIMIT,
                    f"its checkpoint directory is over the run's disk limit, so no checkpoint was written: {e.message}",
                    upload=False,
                )
            except CheckpointCancelled:
                log.info("run %s: a checkpoint sync was given up (stopping)", run.id)
                return None
            except Exception as e:  # the store, the worker's disk, what the run did to its directory
                self.failures += 1
                self.failed = e.message if isinstance(e, RunplaneError) else _reason(e)
                log.warning(
                    "run %s: checkpoint sync failed (the checkpoint before stays the newest): %s",
                    run.id,
                    e,
                    exc_info=not isinstance(e, (RunplaneError, OSError)),
                )
                return None
            self.previous = manifest
            self.state.checkpointed(_status(manifest, run.attempt))
            try:
                checkpoints.prune(self.objects, run.id, keep=KEEP)
            except Exception as e:  # the store, or one of its listings that does not read
                log.warning("run %s: pruning old checkpoints failed (tried again after the next sync): %s", run.id, e)
            return None


def _reason(e: Exception) -> str:
    """What a message may say of an error that is not runplane's: its kind and, of an OSError, its
    words without the host's paths."""
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    return f"{type(e).__name__} (see the worker's log)"


def _status(manifest: Manifest, attempt: int, series: str | None = None) -> CheckpointStatus:
    return CheckpointStatus(
        seq=manifest.seq,
        attempt=attempt,
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        synced_at=manifest.created_at,
        series=series,
    )


def _holding(files: int, size: int) -> str:
    """'12 files, 3.1 MB'."""
    for unit, factor in (("GB", 1024**3), ("MB", 1024**2), ("kB", 1024)):
        if size >= factor:
            return f"{files} file{'' if files == 1 else 's'}, {size / factor:.1f} {unit}"
    return f"{files} file{'' if files == 1 else 's'}, {size} bytes"
