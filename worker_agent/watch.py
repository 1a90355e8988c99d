"""One started container, watched until it exits or must be stopped: its output followed, its
use sampled and charged, its files and time held against its limits, the store polled."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from runplane.domain.errors import LeaseLost
from runplane.domain.states import FailureReason, RunState
from runplane.domain.units import format_duration
from worker_agent import limits
from worker_agent.containers import RunContainer
from worker_agent.control import RunControl
from worker_agent.disk import DiskSampler
from worker_agent.limits import Limits, Seen
from worker_agent.logship import RunLogs
from worker_agent.outcome import Outcome
from worker_agent.run_config import ExecutorConfig
from worker_agent.stop_window import cut_grace
from worker_agent.usage import Meter, read_cgroup

DiskCheck = Callable[[Callable[[], bool] | None], Outcome | None]


class Watch:
    """Watches the container of ``box`` (created, attached and started). ``check_disk`` checks
    what the run wrote (``disk.check_disk``); it runs on a thread of its own while the run goes,
    and once more after it exited. ``warn`` (a signal, seconds): a run handed back is sent the
    signal first and given that long to exit (to write its checkpoint) before it is killed, less when a
    preemption notice's moment comes sooner (``stop_window.cut_grace``)."""

    def __init__(
        self,
        box: RunContainer,
        logs: RunLogs,
        meter: Meter,
        control: RunControl,
        config: ExecutorConfig,
        clock: Callable[[], float],
        check_disk: DiskCheck,
        idle: Callable[[], float | None] = lambda: None,
        warn: tuple[str, float] | None = None,
    ) -> None:
        self.box, self.logs, self.meter, self.control = box, logs, meter, control
        self.config, self.clock, self.check_disk, self.idle = config, clock, check_disk, idle
        self.warn = warn
        self.attempt_started = 0.0

    def __call__(self, started: float, attempt_started: float | None = None) -> Outcome:
        """How the run ended (``limits.ended``), its container started at ``started`` (the time limit
        counts from there) in the attempt started at ``attempt_started`` (charged from there; default
        ``started``: a run in one piece)."""
        self.attempt_started = started if attempt_started is None else attempt_started
        exited, result = self.box.waiter()
        follower = threading.Thread(target=self.logs.follow, args=(self.box.stream,), daemon=True)
        follower.start()
        # the disk is walked on a thread of its own: a long walk never holds up a kill or a limit
        sampler = DiskSampler(self.check_disk, self.config, self.clock, f"disk-{self.control.run.id}")
        try:
            stopped = self._until_exit(started, exited, sampler)
            if stopped is not None:
                stopped = self._stop(stopped, exited, started, sampler)
        finally:
            sampler.stop()
            sampler.join()
        self.meter.sample(self.box.sample())
        follower.join(timeout=5)
        self.logs.flush()
        state, running = self.box.exited_state(exited)
        if running is not None:  # nothing of the run is read while it may still be writing
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                f"the container did not stop within {format_duration(self.config.stop_seconds)} of being "
                f"killed ({running})",
                upload=False,
            )
        if state is None:
            return Outcome(RunState.FAILED, FailureReason.CONTAINER_ERROR, limits.REMOVED)
        # a run may write past a limit and end before a sample sees it: look once more, now that
        # nothing in it moves any more
        over = self.check_disk(None) or limits.log_over(self.logs.received, self.limits)
        return limits.ended(stopped or over, state, result, self.limits, self.logs.stderr_tail())

    def _stop(self, stopped: Outcome, exited: threading.Event, started: float, sampler: DiskSampler) -> Outcome:
        """Kill the container; one handed back with a ``warn`` is sent its signal first, and killed
        only if it has not exited within the grace. The grace is watched as the run is: a lost lease,
        a kill, the time limit or the disk's and the log's limits end it at once, and then say how
        the run ended (a final state, not a hand-back). Returns why the run was stopped."""
        if self.warn is not None and stopped.state == RunState.QUEUED and not self.control.lease_lost.is_set():
            signal, grace = self.warn
            self.box.kill(signal)
            signalled = self.clock()

            def grace_ends() -> float:  # a notice's moment comes first, one heard during the grace too
                return signalled + cut_grace(grace, self.control.stop_by, signalled)

            cut = self._until_exit(started, exited, sampler, deadline=grace_ends, handing_back=True)
            if cut is None and exited.is_set():
                return stopped
            stopped = cut or stopped
        self.box.kill()
        exited.wait(self.config.stop_seconds)
        return stopped

    @property
    def limits(self) -> Limits:
        return Limits.of(self.control.run, self.config)

    def _until_exit(
        self,
        started: float,
        exited: threading.Event,
        sampler: DiskSampler,
        deadline: Callable[[], float] | None = None,
        handing_back: bool = False,
    ) -> Outcome | None:
        """Watch the running container until it exits (None) or must be stopped (why); with a
        ``deadline`` (read at every tick), until then at most (None). ``handing_back``: it is being handed back already
        (its grace), so the hand-back is no reason to stop it."""
        next_poll = next_usage = self.clock()
        while not exited.wait(self.config.tick_seconds):
            now = self.clock()
            if deadline is not None and now >= deadline():
                return None
            lease_lost = False
            if now >= next_poll:
                next_poll = now + self.config.kill_poll_seconds
                try:
                    self.control.poll()
                except LeaseLost:
                    lease_lost = True
            seen = self._seen(now - started, lease_lost)
            if now >= next_usage:
                next_usage = now + self.config.usage_seconds
                self.meter.sample(self.box.sample())
                # the heartbeat records it: a lost attempt counts so far
                ran = now - self.attempt_started  # every piece of the attempt so far
                self.meter.charge(self.control.run.spec.resources, self.config.rates, ran)
            else:
                # the cgroup's figures go with the container when it exits, before any look after
                # the exit: read them (two small files) every tick, so that what the run used up to
                # its last tick counts, not only up to its last full sample
                self.meter.sample(read_cgroup(self.box.container.id))
            # the flags as they stood before the sample, the disk's and the log's word as they stand after it
            requeue = seen.requeue and not handing_back
            seen = replace(seen, disk=sampler.over, log_bytes=self.logs.received, requeue=requeue)
            stopped = limits.stop(seen, self.limits)
            if stopped is not None:
                return stopped
            self.logs.flush(only_due=True)
        return None

    def _seen(self, elapsed: float, lease_lost: bool) -> Seen:
        control = self.control
        return Seen(
            elapsed=elapsed,
            lease_lost=lease_lost,
            requeue=control.requeue.is_set(),
            kill=control.kill.is_set(),
            kill_reason=control.run.kill_reason,
            idle=self.idle(),
        )
