"""One run's checkpoint directory on this worker: restored before its container starts, synced to its
series every ``interval`` while it runs (the old checkpoints pruned after each sync), and once more when
its command exits or is stopped; each sync that made a checkpoint is recorded on the run
(``Run.checkpoint``) by its one writer, ``run_state``. The engine underneath: ``checkpoints``."""

from __future__ import annotations

import errno
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
from runplane.domain.errors import BackendError, LeaseLost, OutOfTime, RunplaneError
from runplane.domain.states import FailureReason, RunState
from runplane.domain.units import format_size
from runplane.ports import ObjectStore
from runplane.services import checkpoints as series
from worker_agent import checkpoints
from worker_agent.checkpoint_files import Owner
from worker_agent.outcome import Outcome
from worker_agent.run_state import RunStateWriter

log = logging.getLogger(__name__)

MAX_RESTORE_TRIES = 4
"""Checkpoints a restore tries, one found unusable passed over for the one before it."""
TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EMFILE, errno.ENFILE})
"""A restore that meets these on the worker hands the run back rather than failing it."""


class CheckpointUnreachable(RunplaneError):
    """A checkpoint could not be restored for now (the store failed, or this worker's disk was full): the
    run is handed back to its queue, not failed."""

    code = "checkpoint_unreachable"


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
        held: Callable[[], bool] | None = None,
    ) -> None:
        self.state, self.objects, self.directory, self.scratch = state, objects, directory, scratch
        self.held = held if held is not None else lambda: state.holds_attempt(str(state.run.worker_id))
        """Whether this worker holds the run still (asked before each manifest is written)."""
        self.clock = clock
        self.limits = checkpoints.CheckpointLimits(max_bytes=max_bytes)
        self.previous: Manifest | None = None
        """The checkpoint the directory was restored from or synced to last."""
        self.over: Outcome | None = None
        self.failures = 0
        """Syncs that failed (the checkpoint before them stayed the newest)."""
        self.failed: str | None = None
        """Why the latest sync failed; None when it did not."""
        self.failing = False
        self.pruned = False
        """The series was pruned since this attempt's latest sync that failed or was cut (which may leave
        blobs no manifest names), and since the attempt began."""
        """Syncs fail since the last one that did not: the timeline said so once, and says when one succeeds."""
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
        complete one when that one was pruned meanwhile); else leave it empty. A checkpoint that turns
        out unusable while written (a blob gone or not what its manifest says) is passed over for the
        one before it, of the same series (``MAX_RESTORE_TRIES`` in all). The timeline says what was
        restored. An Outcome when the run ends here: no checkpoint of its series that can be restored
        (``input_unavailable``, the directory left empty), or one over the run's disk limit. Raises
        CheckpointUnreachable when the store or this worker failed for now (the run is to be handed
        back, not failed)."""
        run = self.state.run
        passing: dict[str, set[int]] = {}
        why = ""
        for _ in range(MAX_RESTORE_TRIES):
            chosen, instead = self._choose(passing)
            if chosen is None:
                break
            try:
                checkpoints.write(self.objects, chosen, self.directory, self.limits, owner=owner)
            except CheckpointTooLarge as e:
                return Outcome(
                    RunState.FAILED,
                    FailureReason.DISK_LIMIT,
                    f"its checkpoint cannot be restored: {e.message}",
                    upload=False,
                )
            except (BackendError, OutOfTime) as e:
                raise CheckpointUnreachable(f"checkpoint {chosen.seq} of run {chosen.series}: {e.message}") from e
            except OSError as e:
                if e.errno in TRANSIENT_ERRNOS:  # this worker's disk or descriptors, for now
                    raise CheckpointUnreachable(
                        f"checkpoint {chosen.seq} of run {chosen.series} cannot be written on this worker for now: "
                        f"{_reason(e)}"
                    ) from e
                why = f"checkpoint {chosen.seq} of run {chosen.series} cannot be restored: {_reason(e)}"
                break
            except RunplaneError as e:  # CheckpointUnusable, a blob gone (NotFound) or larger than named
                why = f"checkpoint {chosen.seq} of run {chosen.series} cannot be restored: {e.message}"
                log.warning("run %s: %s; the one before it is tried", run.id, why)
                passing.setdefault(chosen.series, set()).add(chosen.seq)
                continue
            self._restored(chosen, instead)
            return None
        source = run.restore_from
        if why:
            message = why[:400]
        elif source is not None:
            message = (
                f"run {source.run}, whose checkpoint {source.seq} it starts from, has no checkpoint any more (deleted?)"
            )
        else:
            return None  # nothing to restore: it starts empty
        log.warning("run %s: %s", run.id, message)
        return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, message)

    def _choose(self, passing: dict[str, set[int]]) -> tuple[Manifest | None, str]:
        """The checkpoint to restore, less those in ``passing`` (by series), and what the timeline adds:
        the run's own newest; once its series has any, none other. Raises what the store raises."""
        run = self.state.run
        try:
            own = passing.get(run.id, set())
            chosen = series.newest(self.objects, run.id, own)
            source = run.restore_from
            if chosen is not None or own or source is None:
                return chosen, ""
            gone = passing.get(source.run, set())
            if source.seq not in gone:
                chosen = series.numbered(self.objects, source.run, source.seq)
                if chosen is not None:
                    return chosen, ""
            chosen = series.newest(self.objects, source.run, gone | {source.seq})
        except (BackendError, OutOfTime) as e:
            raise CheckpointUnreachable(f"its checkpoint cannot be read for now: {e.message}") from e
        return chosen, f" (checkpoint {source.seq}, which it was started from, is gone: its newest instead)"

    def _restored(self, chosen: Manifest, instead: str) -> None:
        self.previous = chosen
        said = (
            f"restored checkpoint {chosen.seq} ({_holding(len(chosen.files), chosen.total_bytes)}) of "
            f"run {chosen.series}{instead}"
        )
        if chosen.series == self.state.run.id:  # its record names it already
            self.state.note(self.clock(), said)
        else:  # the run's checkpoint until its first sync: another run's
            status = _status(chosen, chosen.attempt, series=chosen.series)
            self.state.checkpointed(status, said)

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
        checkpoint before stays the newest. Raises LeaseLost when the record cannot be written. A run
        without a checkpoint rule (one that only starts from another run's checkpoint) is never synced:
        fifty evaluations of one training would each store a copy of it."""
        if self.state.run.spec.checkpoint is None:
            return None
        with self._lock:
            run = self.state.run
            self.failed = None
            self.pruned, pruned = False, self.pruned  # until it is known to have left nothing
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
                    held=self.held,
                )
            except CheckpointTooLarge as e:
                return Outcome(
                    RunState.FAILED,
                    FailureReason.DISK_LIMIT,
                    f"its checkpoint directory is over the run's disk limit, so no checkpoint was written: {e.message}",
                    upload=False,
                )
            except LeaseLost:
                raise
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
                if not self.failing:  # said once, not once a failure
                    self.failing = True
                    self._say(f"checkpoint sync failed: {self.failed}; {self._newest()}")
                return None
            if self.failing:
                self.failing = False
                self._say(f"checkpoint syncs succeed again: checkpoint {manifest.seq} is the newest")
            if manifest is self.previous:  # nothing changed since: no checkpoint, record or prune
                self.pruned = pruned  # it uploaded nothing
                return None
            self.previous = manifest
            self.state.checkpointed(_status(manifest, run.attempt))
            self._prune()
            return None

    def finish(self) -> None:
        """At the run's end, while this worker holds it: prune its series unless its latest sync did (one
        cut or failed leaves blobs no manifest names, which no later sync of the run would prune)."""
        if self.state.run.spec.checkpoint is None or self.pruned:
            return
        with self._lock:
            self._prune()

    def _prune(self) -> None:
        try:
            checkpoints.prune(self.objects, self.state.run.id, keep=KEEP)
            self.pruned = True
        except Exception as e:  # the store, or one of its listings that does not read
            log.warning("run %s: pruning old checkpoints failed (tried again later): %s", self.state.run.id, e)

    def _newest(self) -> str:
        """Which checkpoint a restore would take now, in words."""
        previous = self.previous
        if previous is None:
            return "it has no checkpoint yet"
        if previous.series != self.state.run.id:
            return f"it has no checkpoint of its own yet (it started from run {previous.series}'s {previous.seq})"
        return f"checkpoint {previous.seq} is the newest complete one"

    def _say(self, message: str) -> None:
        """``message`` on the run's timeline; a store that fails it is logged (the syncs go on). Raises
        LeaseLost."""
        try:
            self.state.note(self.clock(), message)
        except LeaseLost:
            raise
        except RunplaneError as e:
            log.warning("run %s: %s (not on its timeline: %s)", self.state.run.id, message, e)


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
    """'12 files, 3.1 MiB'."""
    return f"{files} file{'' if files == 1 else 's'}, {format_size(size)}"
