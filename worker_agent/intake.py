"""Intake and claim: a hint from the pool's queue becomes a run started on this worker, when the
run is for this worker, fits its room now and its quotas, and the claim's conditional write lands;
else the hint goes back to the queue (or, stale, is deleted). What a claim reserved is given back
whenever the run does not start."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from runplane.domain.errors import BackendError, ConditionFailed, NotFound, RunplaneError
from runplane.domain.messages import RunMessage
from runplane.domain.runs import Run, run_rank
from runplane.domain.states import RunState
from runplane.domain.workers import refuses
from runplane.ports import Clock, Delivery
from runplane.services import lifecycle, skew
from worker_agent.executor import RunExecutor
from worker_agent.quota_holds import QuotaHolds
from worker_agent.resources import Allocation
from worker_agent.run_config import AgentConfig, AgentPorts
from worker_agent.slots import Slots

log = logging.getLogger(__name__)
RELEASE_DELAY_SECONDS = 5
# How long a received hint stays hidden from other workers. It is deleted as soon as the run is
# claimed (milliseconds later), so this only matters when a worker dies holding it -- or when a
# long poll was still open on the server as its worker died, which hands the next message to no one.
HOLD_SECONDS = 10
# How many runs at the front of its pool's line a worker looks at when a hint comes: it starts the
# first of them it can take, which may be ahead of the hinted run (docs/scheduling.md).
PICK_WINDOW = 8
# How long a hinted run that does not fit now waits for the room that runs over here hold until
# their files are removed, before its hint goes back: well within HOLD_SECONDS, so that no other
# worker gets the hint meanwhile.
LEAVING_WAIT_SECONDS = HOLD_SECONDS / 2


class ClaimLater(Exception):
    """A claim the store failed to answer: what was reserved for it is given back, and its run is
    offered again."""


class Intake:
    """Takes runs from the pool's queue into this worker's free slots. ``launch`` makes the
    executor of a claimed run (not yet started); ``network_refused`` says why runs that ask for a
    network are not taken here (None: they are)."""

    def __init__(
        self,
        config: AgentConfig,
        ports: AgentPorts,
        slots: Slots,
        holds: QuotaHolds,
        clock: Clock,
        launch: Callable[[Run, Allocation], RunExecutor],
        network_refused: str | None,
    ) -> None:
        self.config = config
        self.ports = ports
        self.slots = slots
        self.holds = holds
        self.clock = clock
        self.launch = launch
        self.network_refused = network_refused

    def receive(self, most: int) -> list[Delivery]:
        """Up to ``most`` hints of the pool's queue, waiting at most a poll for the first."""
        return self.ports.queue.receive(
            self.config.pool, most, self.config.poll_seconds, visibility_seconds=HOLD_SECONDS
        )

    def take(self, delivery: Delivery) -> None:
        """Act on one hint: take its run (or one ahead of it in line) when this worker can, else
        hand the hint back, or delete it when it is stale."""
        msg = delivery.message
        received = self.clock()
        try:
            run = self.ports.store.get(msg.run_id)
        except NotFound:
            self.ports.queue.delete(self.config.pool, delivery)
            return
        # a run that still waits for other runs is not to be taken: its release sends a new hint; nor
        # one that moved on to another pool (services.fallback): that pool's queue has its hint
        stale = run.state != RunState.QUEUED or run.attempt != msg.attempt or run.queue != self.config.pool
        if stale or run.waiting_on or self.slots.stopping.is_set():
            if self.slots.stopping.is_set():
                self.ports.queue.release(self.config.pool, delivery, 0)  # for another worker, now
                return
            self.ports.queue.delete(self.config.pool, delivery)  # stale hint
            return
        if self.slots.ending_here(run.id):
            # an earlier attempt of this run (whose lease this worker lost) is still ending here:
            # its cores, its heartbeat and its slot are keyed by the run, so let another worker, or
            # this one once it is over, take the new attempt
            log.info("run %s: an earlier attempt is still ending on this worker; leaving attempt %d", run.id,
                     run.attempt + 1)  # fmt: skip
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
            return
        if not self.refuses(run):
            # room that runs over here still hold while their files go comes back in a moment: wait
            # for it, so that the run first in line (this one or one ahead of it) starts now, not later
            res = run.spec.resources
            self.slots.allocator.wait_for_leaving(
                res.cpus, res.gpus, res.memory, res.disk, timeout=LEAVING_WAIT_SECONDS, stop=self.slots.stopping
            )
            if self.slots.stopping.is_set():  # told to stop meanwhile: for another worker, now
                self.ports.queue.release(self.config.pool, delivery, 0)
                return
        if self._take_ahead_of(run, delivery, received):
            return
        not_ours = self.refuses(run)
        if not_ours:
            log.debug("run %s is not for this worker: %s", run.id, not_ours)
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
            return
        res = run.spec.resources
        never = self.slots.allocator.fits_at_all(res.cpus, res.gpus, res.memory, res.disk)
        allocation = None if never else self.slots.allocator.allocate(run.id, res.cpus, res.gpus, res.memory, res.disk)
        if allocation is None:
            # not now (or never) on this worker: back to the queue for another worker or later
            log.info("run %s does not fit this worker %s", run.id, never or "right now")
            delay = 0 if self.slots.stopping.is_set() else RELEASE_DELAY_SECONDS
            self.ports.queue.release(self.config.pool, delivery, delay)
            return
        try:
            admitted = self._admit(run, delivery)
        except BaseException:
            self.slots.allocator.release(run.id)  # the hint's handing back failed: the room goes back all the same
            raise
        if not admitted:
            self.slots.allocator.release(run.id)
            return
        try:
            claimed = self.claim(run, allocation)
        except ClaimLater:
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
            return
        if claimed is not None:
            self._start(claimed, allocation, received)  # first: a queue error must not leave it claimed, unstarted
        try:
            self.ports.queue.delete(self.config.pool, delivery)
        except RunplaneError as e:
            log.warning("run %s: its hint was not deleted (it comes back, stale): %s", run.id, e)

    def refuses(self, run: Run) -> str | None:
        """Why this worker does not take ``run``: its tag, group or network; or its spec holds a
        field this agent does not know (a later release's), which it must not run without."""
        return refuses(
            self.config.tag, self.config.tag_exclusive, self.config.group, run, network_refused=self.network_refused
        ) or skew.not_understood(run, self.config.version)

    def _take_ahead_of(self, hinted: Run, delivery: Delivery, received: float) -> bool:
        """Start the first run queued ahead of ``hinted`` in the pool's line (``RunStore.head``,
        the first PICK_WINDOW) that this worker can take, with the checks ``hinted`` would get;
        then ``hinted`` is hinted afresh, for another worker at once (a fresh message: handing
        this delivery back would count one more receive towards the dead-letter queue). False when
        none ahead could start here (or the line could not be read): ``hinted`` is taken as its
        hint says. Runs waiting for a quota or a budget are left alone: the release that makes
        their room sends their hints again."""
        try:
            line = self.ports.store.head(self.config.pool, PICK_WINDOW)
        except RunplaneError as e:
            log.warning("cannot read the line of pool %s: %s", self.config.pool, e)
            return False
        rank = run_rank(hinted)
        for ahead in itertools.takewhile(lambda r: run_rank(r) < rank, line):
            ending_here = self.slots.ending_here(ahead.id)
            if (
                ahead.id == hinted.id
                or ending_here
                or self.refuses(ahead)
                or (ahead.waiting_reason or "").startswith(("quota:", "budget:"))
            ):
                continue
            res = ahead.spec.resources
            if self.slots.allocator.fits_at_all(res.cpus, res.gpus, res.memory, res.disk):
                continue
            try:  # the line is read from an index that may lag: the run itself, as it is now
                run = self.ports.store.get(ahead.id)
            except RunplaneError:
                continue
            if run.state != RunState.QUEUED or run.attempt != ahead.attempt or run.queue != self.config.pool:
                continue  # taken, or moved on to another pool (the line is an index that may lag)
            allocation = self.slots.allocator.allocate(run.id, res.cpus, res.gpus, res.memory, res.disk)
            if allocation is None:
                continue
            if not self.holds.reserve(run):
                self.slots.allocator.release(run.id)
                continue
            try:
                claimed = self.claim(run, allocation)
            except ClaimLater:
                continue  # its own hint brings it back
            if claimed is None:
                continue
            log.info("run %s is ahead of run %s in line: taken first", run.id, hinted.id)
            self._start(claimed, allocation, received)  # first: a queue error must not leave it claimed, unstarted
            try:
                self.ports.queue.send(self.config.pool, RunMessage(run_id=hinted.id, attempt=hinted.attempt))
                self.ports.queue.delete(self.config.pool, delivery)
            except RunplaneError as e:
                log.warning("run %s: its hint was not passed on (the reaper re-sends hints): %s", hinted.id, e)
            return True
        return False

    def claim(self, run: Run, allocation: Allocation) -> Run | None:
        """Claim the queued attempt of ``run`` (its room reserved, ``allocation`` made). On any
        error, what was reserved for it here (``allocation``, whatever it holds, and its quota
        holds) is given back first. None when another write came first, or when the store refused
        the claim: a refusal is no race, and no retry changes it, so the run ends ``failed``
        (``agent_error``) rather than being offered to every worker again. Raises ClaimLater when
        the store failed (the claim may be tried again), and what it met besides a RunplaneError."""
        try:
            return lifecycle.claim(
                self.ports.store,
                run,
                run.attempt,
                self.config.worker_id,
                self.config.lease_seconds,
                self.clock(),
                preemptible=self.config.preemptible,
                pool=self.config.pool,
            )
        except ConditionFailed as e:
            self.slots.allocator.release(run.id)
            stored = e.details.get("run")
            # the holds are the attempt's, not the worker's: one that another worker claimed (on a
            # duplicate hint) keeps them, and that worker releases them when the attempt ends
            if not isinstance(stored, Run) or stored.attempt != run.attempt + 1:
                self.holds.release(run, run.attempt + 1)
            return None
        except BackendError as e:
            mine = self._claimed_after_all(run)  # the write may have landed before its answer was lost
            if mine is not None:
                return mine
            self._give_back(run)
            log.warning("run %s: its claim failed (it is offered again): %s", run.id, e.message)
            raise ClaimLater(run.id) from e
        except RunplaneError as e:
            self._give_back(run)
            self._end_unclaimable(run, e)
            return None
        except BaseException:
            self._give_back(run)
            raise

    def _give_back(self, run: Run) -> None:
        """Give back all that was reserved for the claim of ``run``: its allocation on this worker
        and its quota holds."""
        self.slots.allocator.release(run.id)
        self.holds.release(run, run.attempt + 1)

    def _claimed_after_all(self, run: Run) -> Run | None:
        """``run`` as stored when this worker holds the attempt its claim asked for, else None."""
        try:
            stored = self.ports.store.get(run.id)
        except RunplaneError:
            return None
        held = (stored.attempt, stored.worker_id) == (run.attempt + 1, self.config.worker_id)
        return stored if held and stored.state == RunState.PREPARING else None

    def _end_unclaimable(self, run: Run, refusal: RunplaneError) -> None:
        """End ``run``, whose claim the store refused (``refusal``), failed; a run that moved on
        meanwhile is left to whoever moved it, and a failed write to the run's next hint."""
        message = f"worker {self.config.worker_id} could not claim it: {refusal.message}"
        log.error("run %s: %s; it ends failed", run.id, message)
        try:
            lifecycle.unclaimable(self.ports, run, message, self.clock())
        except ConditionFailed:
            pass
        except RunplaneError as e:
            log.warning("run %s: could not record that it cannot be claimed: %s", run.id, e)

    def _start(self, claimed: Run, allocation: Allocation, received: float) -> None:
        """Start the executor of ``claimed``, whose hint came at ``received`` (its ``claim`` timing:
        the line read, its room reserved, the claim written). When it cannot be started, what was
        reserved for it is given back and the run handed back to its queue (``_unstarted``) before
        the error is raised."""
        executor: RunExecutor | None = None
        try:
            executor = self.launch(claimed, allocation)
            executor.usage.timings["claim"] = round(self.clock() - received, 3)
            with self.slots.lock:
                self.slots.active[claimed.id] = executor
                self.slots.claimed += 1
            log.info("run %s attempt %d claimed", claimed.id, claimed.attempt)
            executor.start()
        except BaseException:
            self._unstarted(claimed, executor)
            raise

    def _unstarted(self, claimed: Run, executor: RunExecutor | None) -> None:
        """Undo the start of ``claimed`` that failed (its executor, if made, never ran): its slot,
        its allocation and its quota holds go back, and the run is handed back to its queue, not
        charged to it. A hand-back that fails leaves it to the reaper once its lease expires."""
        with self.slots.lock:
            if executor is not None and self.slots.active.get(claimed.id) is executor:
                del self.slots.active[claimed.id]
                self.slots.claimed -= 1
        self.slots.allocator.release(claimed.id)
        why = f"worker {self.config.worker_id} could not start it"
        try:
            lifecycle.requeue(self.ports, claimed, self.clock(), why, charge=False)
        except RunplaneError as e:
            log.warning("run %s: %s, nor hand it back (the reaper will once its lease expires): %s", claimed.id,
                        why, e)  # fmt: skip
        self.holds.release(claimed, claimed.attempt)

    def _admit(self, run: Run, delivery: Delivery) -> bool:
        """Reserve room for the attempt the claim makes under its owner's and group's quotas.
        False when there is none: the run stays queued with the reason, and its hint goes (the
        release that makes room, or the reaper, sends a new one); or when the quota store failed
        (the hint comes back after a delay)."""
        admitted = self.holds.reserve(run)
        if admitted is None:
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
        elif not admitted:
            self.ports.queue.delete(self.config.pool, delivery)
        return bool(admitted)
