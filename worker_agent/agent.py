"""The agent loop: take runs from the pool queue while there are free slots, heartbeat, exit
when told to, when idle, or after N runs."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from runplane import __version__
from runplane.domain.errors import BackendError, ConditionFailed, LeaseLost, NotFound, RunplaneError
from runplane.domain.messages import RunMessage
from runplane.domain.runs import Run, run_rank
from runplane.domain.states import RunState
from runplane.domain.workers import Worker, refuses
from runplane.ports import Delivery, Expect, WorkerRegistry
from runplane.services import admission, lifecycle
from worker_agent.executor import LABEL, ExecutorConfig, Ports, RunExecutor, container_labels, holds, remove_container
from worker_agent.images import ImageCache
from worker_agent.inputs import InputCache
from worker_agent.metrics import AgentMetrics, Gauges
from worker_agent.network import NetworkCheck
from worker_agent.resources import Allocation, Allocator, Gpu, host_cpus
from worker_agent.settings import default
from worker_agent.trees import remove_tree
from worker_agent.users import ImageUsers

log = logging.getLogger(__name__)
RELEASE_DELAY_SECONDS = 5
# How long a received hint stays hidden from other workers. It is deleted as soon as the run is
# claimed (milliseconds later), so this only matters when a worker dies holding it -- or when a
# long poll was still open on the server as its worker died, which hands the next message to no one.
HOLD_SECONDS = 10
# The most the agent waits at start for the engine to remove one container left by a previous
# life (the engine goes on removing it after that); a run's own removal may take remove_seconds.
STARTUP_REMOVE_SECONDS = 60.0
# How many runs at the front of its pool's line a worker looks at when a hint comes: it starts the
# first of them it can take, which may be ahead of the hinted run (docs/scheduling.md).
PICK_WINDOW = 8


def _leaving(executor: RunExecutor) -> str:
    """The name a run's disk is kept under from its end until its files are removed: its own
    executor's (a new attempt of the run may meanwhile set aside disk under the run's id)."""
    return f"{executor.run.id} leaving {id(executor):x}"


class ClaimLater(Exception):
    """A claim the store failed to answer: what was reserved for it is given back, and its run is
    offered again."""


@dataclass(frozen=True)
class AgentConfig:
    pool: str
    worker_id: str
    work_dir: Path
    slots: int = default("slots")
    memory: int = 0  # bytes runs may set aside in all (0: uncounted); runplane-agent gives --memory or the pool's
    disk: int = 0  # bytes of disk runs may set aside in all (0: uncounted); runplane-agent gives --disk or the pool's
    idle_seconds: float | None = default("idle_seconds")
    exit_after_num_runs: int | None = default("exit_after_num_runs")
    heartbeat_seconds: float = default("heartbeat_seconds")
    lease_seconds: float = default("lease_seconds")
    poll_seconds: float = default("poll_seconds")
    pass_down_termination: bool = default("pass_down_termination")
    exit_on_exception: bool = default("exit_on_exception")
    preemptible: bool = default("preemptible")
    executor: ExecutorConfig | None = None  # None: the defaults, for this worker_id and work_dir
    cpuset: tuple[int, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    tag: str | None = default("tag")
    tag_exclusive: bool = default("tag_exclusive")
    group: str | None = default("group")


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        ports: Ports,
        registry: WorkerRegistry,
        docker_client: docker.DockerClient,
        clock: Callable[[], float],
        inputs: InputCache | None = None,
        images: ImageCache | None = None,
        network: NetworkCheck | None = None,
    ) -> None:
        self.config = config
        # runs that ask for a network get one only where the start-up check passed (network.py)
        self.network = network.network if network is not None else None
        refused = network.refused if network is not None else None
        self.network_refused: str | None = None if self.network else refused or "its network was not checked"
        self.inputs = inputs
        self.images = images
        self.ports = ports
        self.registry = registry
        self.docker = docker_client
        self.clock = clock
        self.executor_config = config.executor or ExecutorConfig(worker_id=config.worker_id, work_dir=config.work_dir)
        if (self.executor_config.worker_id, self.executor_config.work_dir) != (config.worker_id, config.work_dir):
            raise ValueError("the executor's worker_id and work_dir must be the agent's")
        # who each image's runs run as, read once per image for all this agent's runs
        self.users = ImageUsers(docker_client, {f"{LABEL}.stack": self.executor_config.stack_id})
        self.allocator = Allocator(list(config.cpuset or host_cpus()), list(config.gpus), config.memory, config.disk)
        self.active: dict[str, RunExecutor] = {}
        self.leaving: list[RunExecutor] = []  # runs over whose container and directory may still be going
        self.metrics = AgentMetrics(config.pool, config.worker_id)
        self.cached_inputs = inputs.entries() if inputs is not None else 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # set once the runs under way have ended: leases are renewed until then, also after a stop
        self._drained = threading.Event()
        self._slot_freed = threading.Event()
        self.started_at = clock()
        self.last_busy = self.started_at
        self.claimed = 0
        self.finished = 0
        self.errors_in_a_row = 0
        self.failed = False
        self.exit_reason = ""

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self, pass_down: bool | None = None, reason: str = "asked to stop") -> None:
        """Stop taking runs. With pass-down, running runs are stopped and re-queued (attempt not
        used up); without, they run to their end, their leases renewed meanwhile."""
        self.exit_reason = self.exit_reason or reason
        if self.config.pass_down_termination if pass_down is None else pass_down:
            with self._lock:
                for executor in self.active.values():
                    executor.stop_and_requeue()
        self._stop.set()
        self._slot_freed.set()

    def run(self) -> str:
        """Work until told to stop or an exit condition holds; return why it stopped."""
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        self.recover_own_runs()
        self.sweep_orphans()
        self.heartbeat()
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        try:
            while not self._stop.is_set():
                reason = self._exit_condition()
                if reason:
                    self.exit_reason = reason
                    break
                free = self.config.slots - len(self.active)
                if free <= 0 or self._runs_left() == 0:
                    self._slot_freed.wait(self.config.poll_seconds)
                    self._slot_freed.clear()
                    continue
                try:
                    deliveries = self.ports.queue.receive(
                        self.config.pool,
                        min(free, self._runs_left() or free),
                        self.config.poll_seconds,
                        visibility_seconds=HOLD_SECONDS,
                    )
                except RunplaneError as e:
                    log.warning("receive failed: %s", e)
                    self._stop.wait(1)
                    continue
                for delivery in deliveries:
                    self._take_guarded(delivery)
        finally:
            self._stop.set()
            self._drain()
            self._drained.set()
            beat.join(self.config.lease_seconds)  # its last report must not land after "offline"
            self._set_offline()
        return self.exit_reason

    def _runs_left(self) -> int | None:
        if self.config.exit_after_num_runs is None:
            return None
        return max(0, self.config.exit_after_num_runs - self.claimed)

    def _exit_condition(self) -> str:
        with self._lock:
            busy = bool(self.active)
        if busy:
            self.last_busy = self.clock()
            return ""
        if self._runs_left() == 0:
            return f"finished {self.claimed} run(s), the most it may take"
        if self.config.idle_seconds is not None and self.clock() - self.last_busy >= self.config.idle_seconds:
            return f"idle for {self.config.idle_seconds:g}s"
        return ""

    def _drain(self) -> None:
        """Wait for the runs under way, and for the removal of those over. A run whose thread is
        gone is not waited on (its executor always gives its slot back; this is in case it could not)."""
        while True:
            with self._lock:
                executors = [*self.active.values(), *self.leaving]
                threads = [e.thread for e in executors if e.thread and e.thread.is_alive()]
            if not threads:
                return
            for t in threads:
                t.join(timeout=1)

    # -- taking a run ---------------------------------------------------------------------

    def _take_guarded(self, delivery: Delivery) -> None:
        """Take a run; an unexpected error is retried with a bounded backoff, or ends the agent
        with --exit-on-exception. Never a long sleep holding paid hardware."""
        try:
            self._take(delivery)
            self.errors_in_a_row = 0
        except Exception as e:
            self.errors_in_a_row += 1
            if self.config.exit_on_exception:
                log.exception("error while taking a run; exiting (--exit-on-exception)")
                self.exit_reason = f"error while taking a run: {e}"
                self.failed = True
                self._stop.set()
                return
            backoff = min(30.0, 2.0 ** min(self.errors_in_a_row, 5))
            log.exception("error while taking a run; retrying in %.0fs", backoff)
            self._stop.wait(backoff)

    def _take(self, delivery: Delivery) -> None:
        msg = delivery.message
        received = self.clock()
        try:
            run = self.ports.store.get(msg.run_id)
        except NotFound:
            self.ports.queue.delete(self.config.pool, delivery)
            return
        # a run that still waits for other runs is not to be taken: its release sends a new hint
        if run.state != RunState.QUEUED or run.attempt != msg.attempt or run.waiting_on or self._stop.is_set():
            if self._stop.is_set():
                self.ports.queue.release(self.config.pool, delivery, 0)  # for another worker, now
                return
            self.ports.queue.delete(self.config.pool, delivery)  # stale hint
            return
        with self._lock:
            ending_here = run.id in self.active
        if ending_here:
            # an earlier attempt of this run (whose lease this worker lost) is still ending here:
            # its cores, its heartbeat and its slot are keyed by the run, so let another worker, or
            # this one once it is over, take the new attempt
            log.info("run %s: an earlier attempt is still ending on this worker; leaving attempt %d", run.id,
                     run.attempt + 1)  # fmt: skip
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
            return
        if self._take_ahead_of(run, delivery, received):
            return
        not_ours = self._refuses(run)
        if not_ours:
            log.debug("run %s is not for this worker: %s", run.id, not_ours)
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
            return
        res = run.spec.resources
        never = self.allocator.fits_at_all(res.cpus, res.gpus, res.memory, res.disk)
        allocation = None if never else self.allocator.allocate(run.id, res.cpus, res.gpus, res.memory, res.disk)
        if allocation is None:
            # not now (or never) on this worker: back to the queue for another worker or later
            log.info("run %s does not fit this worker %s", run.id, never or "right now")
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
            return
        try:
            admitted = self._admit(run, delivery)
        except BaseException:
            self.allocator.release(run.id)  # the hint's handing back failed: the room goes back all the same
            raise
        if not admitted:
            self.allocator.release(run.id)
            return
        try:
            claimed = self._claim(run, allocation)
        except ClaimLater:
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
            return
        if claimed is not None:
            self._start(claimed, allocation, received)  # first: a queue error must not leave it claimed, unstarted
        try:
            self.ports.queue.delete(self.config.pool, delivery)
        except RunplaneError as e:
            log.warning("run %s: its hint was not deleted (it comes back, stale): %s", run.id, e)

    def _refuses(self, run: Run) -> str | None:
        return refuses(
            self.config.tag, self.config.tag_exclusive, self.config.group, run, network_refused=self.network_refused
        )

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
            with self._lock:
                ending_here = ahead.id in self.active
            if (
                ahead.id == hinted.id
                or ending_here
                or self._refuses(ahead)
                or (ahead.waiting_reason or "").startswith(("quota:", "budget:"))
            ):
                continue
            res = ahead.spec.resources
            if self.allocator.fits_at_all(res.cpus, res.gpus, res.memory, res.disk):
                continue
            try:  # the line is read from an index that may lag: the run itself, as it is now
                run = self.ports.store.get(ahead.id)
            except RunplaneError:
                continue
            if run.state != RunState.QUEUED or run.attempt != ahead.attempt:
                continue
            allocation = self.allocator.allocate(run.id, res.cpus, res.gpus, res.memory, res.disk)
            if allocation is None:
                continue
            if not self._reserve(run):
                self.allocator.release(run.id)
                continue
            try:
                claimed = self._claim(run, allocation)
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

    def _claim(self, run: Run, allocation: Allocation) -> Run | None:
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
            )
        except ConditionFailed as e:
            self.allocator.release(run.id)
            stored = e.details.get("run")
            # the holds are the attempt's, not the worker's: one that another worker claimed (on a
            # duplicate hint) keeps them, and that worker releases them when the attempt ends
            if not isinstance(stored, Run) or stored.attempt != run.attempt + 1:
                self._unreserve(run, run.attempt + 1)
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
        self.allocator.release(run.id)
        self._unreserve(run, run.attempt + 1)

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
            lifecycle.unclaimable(self.ports.store, self.ports.queue, run, message, self.clock())
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
            executor = RunExecutor(
                claimed,
                self.ports,
                self.docker,
                self.executor_config,
                self.clock,
                self._done,
                allocation,
                self.inputs,
                self.images,
                self.network,
                users=self.users,
                on_removed=self._removed,
            )
            executor.usage.timings["claim"] = round(self.clock() - received, 3)
            with self._lock:
                self.active[claimed.id] = executor
                self.claimed += 1
            log.info("run %s attempt %d claimed", claimed.id, claimed.attempt)
            executor.start()
        except BaseException:
            self._unstarted(claimed, executor)
            raise

    def _unstarted(self, claimed: Run, executor: RunExecutor | None) -> None:
        """Undo the start of ``claimed`` that failed (its executor, if made, never ran): its slot,
        its allocation and its quota holds go back, and the run is handed back to its queue, not
        charged to it. A hand-back that fails leaves it to the reaper once its lease expires."""
        with self._lock:
            if executor is not None and self.active.get(claimed.id) is executor:
                del self.active[claimed.id]
                self.claimed -= 1
        self.allocator.release(claimed.id)
        why = f"worker {self.config.worker_id} could not start it"
        try:
            lifecycle.requeue(self.ports.store, self.ports.queue, claimed, self.clock(), why, charge=False)
        except RunplaneError as e:
            log.warning("run %s: %s, nor hand it back (the reaper will once its lease expires): %s", claimed.id,
                        why, e)  # fmt: skip
        self._unreserve(claimed, claimed.attempt)

    def _admit(self, run: Run, delivery: Delivery) -> bool:
        """Reserve room for the attempt the claim makes under its owner's and group's quotas.
        False when there is none: the run stays queued with the reason, and its hint goes (the
        release that makes room, or the reaper, sends a new one); or when the quota store failed
        (the hint comes back after a delay)."""
        admitted = self._reserve(run)
        if admitted is None:
            self.ports.queue.release(self.config.pool, delivery, RELEASE_DELAY_SECONDS)
        elif not admitted:
            self.ports.queue.delete(self.config.pool, delivery)
        return bool(admitted)

    def _reserve(self, run: Run) -> bool | None:
        """Reserve room for the attempt the claim makes under its owner's and group's quotas:
        True when there is room (or no quota store); False when there is none, recorded as the
        run's waiting reason; None when the quota store failed."""
        if self.ports.quotas is None:
            return True
        try:
            reason = admission.reserve(self.ports.quotas, run, run.attempt + 1, self.clock())
        except Exception as e:  # whatever the quota store met: not now, and never the agent's end
            log.warning("run %s: cannot reserve its quota now: %s", run.id, e)
            return None
        if reason is None:
            return True
        log.info("run %s waits: %s", run.id, reason)
        if run.waiting_reason != reason:
            try:
                self.ports.store.update(
                    run, Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt), {"waiting_reason": reason}
                )
            except ConditionFailed:
                pass  # claimed or ended meanwhile
            except RunplaneError as e:
                log.warning("run %s: could not record why it waits: %s", run.id, e)
        return False

    def _unreserve(self, run: Run, attempt: int) -> None:
        """Give back what attempt ``attempt`` of ``run`` holds under quotas, and re-send the hints
        of runs that waited for that room. A failure is logged: the reaper releases what is left."""
        if self.ports.quotas is None:
            return
        try:
            blocked = admission.release(self.ports.quotas, run, attempt, self.clock())
            if blocked:
                admission.rehint(self.ports.store, self.ports.queue, blocked)
        except Exception as e:  # whatever the quota store met: the slot is given back all the same
            log.warning("run %s: could not release its quota hold (the reaper will): %s", run.id, e)

    def _done(self, executor: RunExecutor) -> None:
        # its cores, GPUs and memory are free now; its disk once its files are removed (_removed)
        self.allocator.release(executor.run.id, keep_disk_as=_leaving(executor))
        try:
            self.metrics.run_ended(executor.run, executor.usage.timings)
            self._unreserve(executor.run, executor.run.attempt)
            self._housekeeping()
        finally:  # the slot is free again whatever housekeeping met
            with self._lock:
                self.active.pop(executor.run.id, None)
                # its container and directory may still be being removed: stopping waits for that
                self.leaving = [e for e in self.leaving if e.thread and e.thread.is_alive()] + [executor]
                self.finished += 1
                self.last_busy = self.clock()
            self._slot_freed.set()
        log.info("run %s ended %s", executor.run.id, executor.run.state)

    def _removed(self, executor: RunExecutor) -> None:
        """The run's container and directory are removed (or could not be): its disk is free."""
        self.allocator.release(_leaving(executor))

    def gauges(self) -> Gauges:
        """What this worker has now, for its metrics."""
        with self._lock:
            active = len(self.active)
        return Gauges(slots=self.config.slots, active=active, gpus=len(self.config.gpus))

    def _housekeeping(self) -> None:
        """Keep the input cache and the image cache under their limits (between runs)."""
        try:
            if self.inputs is not None:
                self.inputs.evict()
                self.cached_inputs = self.inputs.entries()  # counted here, not at every heartbeat
            if self.images is not None:
                self.images.prune()
        except (OSError, docker.errors.DockerException, requests.RequestException) as e:
            log.warning("cache housekeeping failed: %s", e)

    # -- heartbeat ------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._drained.wait(self.config.heartbeat_seconds):
            try:
                self.heartbeat()
            except Exception:  # a failed beat must not kill the thread; the next one retries
                log.exception("heartbeat failed")

    def heartbeat(self) -> None:
        """Renew the lease of every run held, take in kill requests, and report the worker."""
        with self._lock:
            executors = list(self.active.values())
        for executor in executors:
            run = executor.run
            if run.state.terminal:
                continue
            try:
                executor.observe(
                    lifecycle.renew(
                        self.ports.store, run, self.config.lease_seconds, self.clock(), usage=executor.usage
                    )
                )
            except LeaseLost:
                executor.lease_lost()
            except RunplaneError as e:
                log.warning("lease renewal of %s failed: %s", run.id, e)
        self._report("busy" if executors else "idle")

    def _report(self, status: str) -> None:
        with self._lock:
            owners = {run_id: executor.run.owner for run_id, executor in self.active.items()}
        runs = list(owners)
        left = self._runs_left()
        free_cpus, free_gpus = self.allocator.free()
        try:
            self.registry.put(
                Worker(
                    id=self.config.worker_id,
                    pool=self.config.pool,
                    status="draining" if self._stop.is_set() and runs else status,
                    host=socket.gethostname(),
                    slots=self.config.slots,
                    free_slots=0 if self._stop.is_set() or left == 0 else max(0, self.config.slots - len(runs)),
                    cpus=float(len(self.allocator.cpus)),
                    gpus=len(self.allocator.gpus),
                    gpu_ids=[g.uuid for g in self.allocator.gpus],
                    free_cpus=float(free_cpus),
                    free_gpus=free_gpus,
                    cached_inputs=self.cached_inputs,
                    memory=self.config.memory,
                    runs=runs,
                    run_owners=owners,
                    runs_done=self.finished,
                    runs_left=left,
                    started_at=self.started_at,
                    heartbeat_at=self.clock(),
                    agent_version=__version__,
                    tag=self.config.tag,
                    tag_exclusive=self.config.tag_exclusive,
                    group=self.config.group,
                    network_refused=self.network_refused,
                )
            )
        except RunplaneError as e:
            log.warning("worker report failed: %s", e)

    def _set_offline(self) -> None:
        self._report("offline")

    # -- orphans --------------------------------------------------------------------------

    @property
    def _stack_label(self) -> str:
        return f"{LABEL}.stack={self.executor_config.stack_id}"

    def recover_own_runs(self) -> list[str]:
        """After a restart under the same id: runs this worker still holds had their agent die
        under them. Stop their containers and hand the runs back to the queue (attempt kept)
        at once, instead of waiting for their leases to expire."""
        recovered: list[str] = []
        try:
            containers = self.docker.containers.list(  # sparse: no inspect of each (it may go meanwhile)
                sparse=True,
                all=True,
                filters={"label": [f"{LABEL}.worker_id={self.config.worker_id}", self._stack_label]},
            )
        except (docker.errors.APIError, requests.RequestException) as e:
            log.warning("cannot list containers: %s", e)
            return recovered
        for container in containers:
            labels = container_labels(container)
            self._remove(container, "left by this worker's previous life")
            try:
                run = self.ports.store.get(labels[f"{LABEL}.run_id"])
            except RunplaneError:
                continue
            if run.worker_id != self.config.worker_id or str(run.attempt) != labels.get(f"{LABEL}.attempt"):
                continue
            if run.state.terminal:
                continue
            try:
                lifecycle.requeue(
                    self.ports.store, self.ports.queue, run, self.clock(), "its worker restarted", charge=False
                )
                recovered.append(run.id)
            except RunplaneError as e:
                log.warning("could not hand back run %s: %s", run.id, e)
                continue
            self._unreserve(run, run.attempt)
        if recovered:
            log.info("handed back %d run(s) left by this worker's previous life: %s", len(recovered), recovered)
        self._remove_run_dirs()
        return recovered

    def _remove_run_dirs(self) -> None:
        """What the previous life of this worker left in its runs directory (which stays: it may
        be a mount the agent made at start), however deep."""
        runs = self.config.work_dir / "runs"
        try:
            left_behind = list(runs.iterdir())
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("cannot list %s: %s", runs, e)
            return
        for path in left_behind:
            left = remove_tree(path)
            if left is not None:
                log.warning("could not remove all of %s: %s", path, left)

    def _remove(self, container: Any, why: str) -> bool:
        seconds = min(self.executor_config.remove_seconds, STARTUP_REMOVE_SECONDS)
        left = remove_container(container, seconds, self.clock, why=why)
        if left is not None:
            log.warning("could not remove container %s: %s", container.id, left)
        return left is None

    def sweep_orphans(self) -> int:
        """Remove run containers of this stack whose run is no longer held by their worker (left
        behind by an agent that died). Containers of live workers, and of other stacks sharing
        this engine, are left alone."""
        removed = 0
        try:
            containers = self.docker.containers.list(  # sparse: no inspect of each (it may go meanwhile)
                sparse=True, all=True, filters={"label": [f"{LABEL}.run_id", self._stack_label]}
            )
        except (docker.errors.APIError, requests.RequestException) as e:
            log.warning("cannot list containers: %s", e)
            return 0
        for container in containers:
            labels = container_labels(container)
            # read after the listing: every container listed was made after its attempt was claimed,
            # so this read shows that claim or what came of it, never an older state
            try:
                run = self.ports.store.get(labels[f"{LABEL}.run_id"])
            except NotFound:
                if self._remove(container, "its run is not in the store"):
                    removed += 1
                continue
            except RunplaneError:
                continue
            if holds(run, labels.get(f"{LABEL}.worker_id"), labels.get(f"{LABEL}.attempt")):
                continue
            holder = f"worker {run.worker_id}" if run.worker_id else "no worker"
            if self._remove(container, f"its run is {run.state} at attempt {run.attempt} on {holder}"):
                removed += 1
        return removed
