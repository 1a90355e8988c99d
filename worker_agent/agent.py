"""The agent loop: take runs from the pool queue while there are free slots, heartbeat, exit
when told to, when idle, or after N runs. Its duties are rooms of their own: ``intake`` (hints
to claimed, started runs), ``reporting`` (heartbeats and the worker's item), ``recovery`` (what
a previous life left); ``slots`` is what they share."""

from __future__ import annotations

import logging
import threading

import docker
import docker.errors
import requests

from runplane.domain.errors import RunplaneError
from runplane.domain.runs import Run
from runplane.ports import Clock, Delivery, WorkerRegistry
from worker_agent.container_spec import LABEL
from worker_agent.executor import RunExecutor
from worker_agent.images import ImageCache
from worker_agent.inputs import InputCache
from worker_agent.intake import Intake
from worker_agent.metrics import AgentMetrics, Gauges
from worker_agent.netcheck import NetworkCheck
from worker_agent.prefetch import Prefetch
from worker_agent.quota_holds import QuotaHolds
from worker_agent.recovery import Recovery
from worker_agent.reporting import Reporter
from worker_agent.resources import Allocation, Allocator, host_cpus
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig
from worker_agent.slots import Slots
from worker_agent.users import ImageUsers

log = logging.getLogger(__name__)


def _leaving(executor: RunExecutor) -> str:
    """The name a run's disk is kept under from its end until its files are removed: its own
    executor's (a new attempt of the run may meanwhile set aside disk under the run's id)."""
    return f"{executor.run.id} leaving {id(executor):x}"


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        ports: AgentPorts,
        registry: WorkerRegistry,
        docker_client: docker.DockerClient,
        clock: Clock,
        inputs: InputCache | None = None,
        images: ImageCache | None = None,
        network: NetworkCheck | None = None,
        prefetch: Prefetch | None = None,
    ) -> None:
        self.config = config
        # runs that ask for a network get one only where the start-up check passed (network.py)
        self.network = network.network if network is not None else None
        refused = network.refused if network is not None else None
        network_refused: str | None = None if self.network else refused or "its network was not checked"
        self.inputs = inputs
        self.images = images
        self.prefetch = prefetch
        self.ports = ports
        self.docker = docker_client
        self.clock = clock
        self.executor_config = config.executor or ExecutorConfig(worker_id=config.worker_id, work_dir=config.work_dir)
        if (self.executor_config.worker_id, self.executor_config.work_dir) != (config.worker_id, config.work_dir):
            raise ValueError("the executor's worker_id and work_dir must be the agent's")
        # who each image's runs run as, read once per image for all this agent's runs
        self.users = ImageUsers(docker_client, {f"{LABEL}.stack": self.executor_config.stack_id})
        allocator = Allocator(list(config.cpuset or host_cpus()), list(config.gpus), config.memory, config.disk)
        self.slots = Slots(allocator, config.exit_after_num_runs)
        self.slots.cached_inputs = inputs.entries() if inputs is not None else 0
        self.metrics = AgentMetrics(config.pool, config.worker_id)
        self.holds = QuotaHolds(ports, clock)
        self.intake = Intake(config, ports, self.slots, self.holds, clock, self._launch, network_refused)
        self.reporter = Reporter(config, ports, registry, self.slots, clock, network_refused)
        self.recovery = Recovery(config, self.executor_config, ports, docker_client, self.holds, clock)
        # set once the runs under way have ended: leases are renewed until then, also after a stop
        self._drained = threading.Event()
        self.last_busy = self.reporter.started_at
        self.errors_in_a_row = 0
        self.failed = False
        self.exit_reason = ""

    # -- lifecycle ------------------------------------------------------------------------

    def stop(
        self,
        pass_down: bool | None = None,
        reason: str = "asked to stop",
        preempted: bool = False,
        leaves_at: float | None = None,
    ) -> None:
        """Stop taking runs. With pass-down, running runs are stopped and re-queued (attempt not
        used up); without, they run to their end, their leases renewed meanwhile. ``preempted``: the
        machine is being taken away (a preemption notice): each run handed back counts a preemption;
        ``leaves_at``: when it goes (seconds since the epoch), if the notice says: each run's stop ends
        before."""
        self.exit_reason = self.exit_reason or reason
        if self.config.pass_down_termination if pass_down is None else pass_down:
            with self.slots.lock:
                for executor in self.slots.active.values():
                    executor.stop_and_requeue(preempted, leaves_at)
        self.slots.stopping.set()
        self.slots.freed.set()

    def run(self) -> str:
        """Register, then work until told to stop or an exit condition holds; return why it
        stopped. An agent the control plane's version window refuses takes no runs: it returns
        why at once (``failed`` set); refused later, at a heartbeat, it drains (finishes the runs it
        holds, takes no more) and returns why (``failed`` set)."""
        refused = self.reporter.register()
        if refused:  # nothing taken, nothing touched: its item says why, and so does its exit
            self.exit_reason, self.failed = refused, True
            return refused
        self.config.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the runs' files: this user's alone
        self.recovery.recover_own_runs()
        self.recovery.sweep_orphans()
        if self.prefetch is not None:  # starting, not idle, until its pool's images are here
            self.reporter.pulling = self.prefetch.first()
        self.reporter.heartbeat()
        beat = threading.Thread(target=self.reporter.beat_until, args=(self._drained,), name="heartbeat", daemon=True)
        beat.start()
        slots = self.slots
        try:
            if self.prefetch is not None:
                self.prefetch.run(self.reporter.show_pulling, slots.stopping)
                self.last_busy = self.clock()  # idle from when it could take runs
            while not slots.stopping.is_set():
                reason = self._exit_condition()
                if reason:
                    self.exit_reason = reason
                    break
                free = self.config.slots - len(slots.active)
                if free <= 0 or slots.runs_left() == 0:
                    slots.freed.wait(self.config.poll_seconds)
                    slots.freed.clear()
                    continue
                try:
                    deliveries = self.intake.receive(min(free, slots.runs_left() or free))
                except RunplaneError as e:
                    log.warning("receive failed: %s", e)
                    slots.stopping.wait(1)
                    continue
                for delivery in deliveries:
                    self._take_guarded(delivery)
        finally:
            slots.stopping.set()
            self._drain()
            self._drained.set()
            beat.join(self.config.lease_seconds)  # its last report must not land after "offline"
            self.reporter.set_offline()
        if self.reporter.refused and not self.exit_reason:  # refused while it served: drained
            self.exit_reason, self.failed = self.reporter.refused, True
        return self.exit_reason

    def _exit_condition(self) -> str:
        with self.slots.lock:
            busy = bool(self.slots.active)
        if busy:
            self.last_busy = self.clock()
            return ""
        if self.slots.runs_left() == 0:
            return f"finished {self.slots.claimed} run(s), the most it may take"
        if self.config.idle_seconds is not None and self.clock() - self.last_busy >= self.config.idle_seconds:
            return f"idle for {self.config.idle_seconds:g}s"
        return ""

    def _drain(self) -> None:
        """Wait for the runs under way, and for the removal of those over. A run whose thread is
        gone is not waited on (its executor always gives its slot back; this is in case it could not)."""
        while True:
            with self.slots.lock:
                executors = [*self.slots.active.values(), *self.slots.leaving]
                threads = [e.thread for e in executors if e.thread and e.thread.is_alive()]
            if not threads:
                return
            for t in threads:
                t.join(timeout=1)

    def _take_guarded(self, delivery: Delivery) -> None:
        """Take a run; an unexpected error is retried with a bounded backoff, or ends the agent
        with --exit-on-exception. Never a long sleep holding paid hardware."""
        try:
            self.intake.take(delivery)
            self.errors_in_a_row = 0
        except Exception as e:
            self.errors_in_a_row += 1
            if self.config.exit_on_exception:
                log.exception("error while taking a run; exiting (--exit-on-exception)")
                self.exit_reason = f"error while taking a run: {e}"
                self.failed = True
                self.slots.stopping.set()
                return
            backoff = min(30.0, 2.0 ** min(self.errors_in_a_row, 5))
            log.exception("error while taking a run; retrying in %.0fs", backoff)
            self.slots.stopping.wait(backoff)

    # -- a run's executor -----------------------------------------------------------------

    def _launch(self, claimed: Run, allocation: Allocation) -> RunExecutor:
        """The executor of ``claimed`` (not started), with what it holds here."""
        return RunExecutor(
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

    def _done(self, executor: RunExecutor) -> None:
        # its cores, GPUs and memory are free now; its disk once its files are removed (_removed)
        self.slots.allocator.release(executor.run.id, keep_disk_as=_leaving(executor))
        try:
            self.metrics.run_ended(executor.run, executor.usage.timings)
            self.holds.release(executor.run, executor.run.attempt)
            self._housekeeping()
        finally:  # the slot is free again whatever housekeeping met
            with self.slots.lock:
                self.slots.active.pop(executor.run.id, None)
                # its container and directory may still be being removed: stopping waits for that
                self.slots.leaving = [e for e in self.slots.leaving if e.thread and e.thread.is_alive()] + [executor]
                self.slots.finished += 1
                self.last_busy = self.clock()
            self.slots.freed.set()
        log.info("run %s ended %s", executor.run.id, executor.run.state)

    def _removed(self, executor: RunExecutor) -> None:
        """The run's container and directory are removed (or could not be): its disk is free."""
        self.slots.allocator.release(_leaving(executor))

    def gauges(self) -> Gauges:
        """What this worker has now, for its metrics."""
        with self.slots.lock:
            active = len(self.slots.active)
        return Gauges(slots=self.config.slots, active=active, gpus=len(self.config.gpus))

    def _housekeeping(self) -> None:
        """Keep the input cache and the image cache under their limits (between runs)."""
        try:
            if self.inputs is not None:
                self.inputs.evict()
                self.slots.cached_inputs = self.inputs.entries()  # counted here, not at every heartbeat
            if self.images is not None:
                self.images.prune()
        except (OSError, docker.errors.DockerException, requests.RequestException) as e:
            log.warning("cache housekeeping failed: %s", e)
