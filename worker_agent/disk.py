"""What a run wrote, walked and held against its limits, on a thread of its own while it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from runplane.domain.runs import Usage
from worker_agent.limits import Limits, disk_over
from worker_agent.outcome import Outcome
from worker_agent.run_config import ExecutorConfig
from worker_agent.usage import Tree, walk

LayerSize = Callable[[int | None, int | None, Callable[[], bool] | None], Tree]
"""The container's writable layer, walked up to (bytes, entries) or until cancelled."""


def check_disk(
    output_dir: Path,
    home_dir: Path | None,
    layer_size: LayerSize,
    limits: Limits,
    usage: Usage,
    cancelled: Callable[[], bool] | None = None,
    *,
    volumes_dir: Path | None = None,
    inputs: int = 0,
    checkpoint_dir: Path | None = None,
) -> Outcome | None:
    """Everything the run wrote against its limits (``limits.disk_over``): its output directory,
    its home directory (``home_dir``, when it has one of its own), the directories of its image's
    ``VOLUME`` paths (``volumes_dir``, when it has any), its checkpoint directory (``checkpoint_dir``,
    when it has one) and its container's writable layer, with
    the engine's files bound into it (``layer_size``); and the ``inputs`` bytes it was given,
    which count against its disk too. The walks stop once past a limit, or once ``cancelled()``;
    then it says nothing. What they found in all goes into ``usage.disk``."""
    limit, most = _rest(limits.disk, inputs), limits.max_output_files
    output = walk(output_dir, limit, most, cancelled)
    home = Tree()
    if home_dir is not None:
        home = walk(home_dir, _rest(limit, output.size), _rest(most, output.entries), cancelled)
    volumes = Tree()
    if volumes_dir is not None:
        size, entries = output.size + home.size, output.entries + home.entries
        volumes = walk(volumes_dir, _rest(limit, size), _rest(most, entries), cancelled)
    size, entries = output.size + home.size + volumes.size, output.entries + home.entries + volumes.entries
    checkpoint = Tree()
    if checkpoint_dir is not None:
        checkpoint = walk(checkpoint_dir, _rest(limit, size), _rest(most, entries), cancelled)
        size, entries = size + checkpoint.size, entries + checkpoint.entries
    layer = layer_size(_rest(limit, size), _rest(most, entries), cancelled)
    if cancelled is not None and cancelled():
        return None
    usage.disk = size + layer.size
    return disk_over(output, home, layer, limits, volumes, Tree(size=inputs), checkpoint)


class DiskSampler:
    """Checks a run's files against its limits on a thread of its own, so that a long walk never
    holds up a kill, a time limit or a lost lease: ``over`` is set once a check finds the run
    over a limit. Walking takes at most ``disk_sample_share`` of the time, and a check starts at
    most ``max_disk_interval_seconds`` after the one before (``disk_interval``)."""

    def __init__(
        self,
        check: Callable[[Callable[[], bool]], Outcome | None],
        config: ExecutorConfig,
        clock: Callable[[], float],
        name: str,
    ) -> None:
        self.over: Outcome | None = None
        self._check = check
        self._config = config
        self._clock = clock
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking: a walk under way gives up within a few milliseconds."""
        self._stopping.set()

    def join(self) -> None:
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopping.is_set():
            began = self._clock()
            over = self._check(self._stopping.is_set)
            if over is not None:
                self.over = over
                return
            spent = self._clock() - began
            if self._stopping.wait(max(disk_interval(spent, self._config) - spent, 0.0)):
                return


def disk_interval(spent: float, config: ExecutorConfig) -> float:
    """Seconds from the start of one disk check to the start of the next, after one that took
    ``spent``: walking takes at most ``disk_sample_share`` of the time, but a run never goes
    longer than ``max_disk_interval_seconds`` unchecked (a run that makes its walks long, with
    many empty files, makes them follow each other: the file count caps how long one is)."""
    spaced = max(config.usage_seconds, spent / config.disk_sample_share)
    return min(spaced, max(config.max_disk_interval_seconds, config.usage_seconds))


def _rest(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(limit - used, 0)
