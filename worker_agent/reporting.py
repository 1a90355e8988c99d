"""Registration, heartbeats and reporting: check this agent against the control plane's version
window, renew the lease of every run held, take in kill requests, and write this worker's item in
the registry (what it has, what it holds, which agent it is)."""

from __future__ import annotations

import logging
import socket
import threading

from runplane.domain.errors import LeaseLost, RunplaneError
from runplane.domain.versions import agent_refusal
from runplane.domain.workers import Pulling, Worker
from runplane.ports import Clock, ObjectStore, WorkerRegistry
from runplane.services import lifecycle, skew
from worker_agent.run_config import AgentConfig, AgentPorts
from worker_agent.slots import Slots

log = logging.getLogger(__name__)


def stack_refusal(objects: ObjectStore, version: str) -> str | None:
    """Why the control plane refuses an agent of ``version``: its record (``skew.stack_record``) and the
    window of runplane.domain.versions (docs/architecture.md, "Version skew"). None when it does
    not, when there is no record to read (a control plane from before the check), or when the
    record cannot be read now (said in the log): an agent the control plane does not allow is
    still shown as refused in the pools view."""
    try:
        stack = skew.stack_record(objects)
    except RunplaneError as e:
        log.warning("cannot read the stack's version (going on unchecked): %s", e)
        return None
    if stack is None:
        log.info("no stack version to check agent %s against (an older control plane)", version)
        return None
    return agent_refusal(version, stack.version, stack.oldest_agent)


class Reporter:
    def __init__(
        self,
        config: AgentConfig,
        ports: AgentPorts,
        registry: WorkerRegistry,
        slots: Slots,
        clock: Clock,
        network_refused: str | None,
    ) -> None:
        self.config = config
        self.ports = ports
        self.registry = registry
        self.slots = slots
        self.clock = clock
        self.network_refused = network_refused
        self.started_at = clock()
        self.refused: str | None = None
        self.checked_at = self.started_at
        self.pulling: Pulling | None = None
        """The image it pulls before it takes runs (worker_agent/prefetch.py); its status is starting meanwhile."""
        self._writing = threading.Lock()  # a report of the pull and a heartbeat: the later one's item stays

    def register(self) -> str | None:
        """Check this agent's version against the control plane's window (``stack_refusal``).
        Refused: the worker's item says why (its status offline: it takes no runs) and so does the
        answer; None: it may serve (``recheck`` reads the window again while it does)."""
        self.checked_at = self.clock()
        self.refused = stack_refusal(self.ports.objects, self.config.version)
        if self.refused:
            log.error("refused: %s", self.refused)
            self.report("offline")
        return self.refused

    def beat_until(self, drained: threading.Event) -> None:
        """Heartbeat every ``heartbeat_seconds`` until ``drained`` is set (the runs under way have
        ended: their leases are renewed until then, also after a stop)."""
        while not drained.wait(self.config.heartbeat_seconds):
            try:
                self.heartbeat()
            except Exception:  # a failed beat must not kill the thread; the next one retries
                log.exception("heartbeat failed")

    def recheck(self) -> None:
        """Read the control plane's version window again, at most every ``skew_check_seconds``
        (functions upgraded while this agent lives may leave it behind). Refused now: it drains
        (finishes the runs it holds, takes no more) and its worker item says why."""
        if self.refused or self.clock() - self.checked_at < self.config.skew_check_seconds:
            return
        self.checked_at = self.clock()
        refused = stack_refusal(self.ports.objects, self.config.version)
        if refused:
            log.error("refused now: %s; finishing the runs held, taking no more", refused)
            self.refused = refused
            self.slots.stopping.set()
            self.slots.freed.set()

    def heartbeat(self) -> None:
        """Check the version window again (``recheck``), renew the lease of every run held, take
        in kill requests, and report the worker."""
        self.recheck()
        executors = self.slots.executors()
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
        self.report("busy" if executors else "idle")

    def show_pulling(self, pulling: Pulling | None) -> None:
        """Say in this worker's item which image it pulls before it takes runs, and how far (None:
        done; it is idle from now)."""
        self.pulling = pulling
        self.report("idle")

    def report(self, status: str) -> None:
        """Write this worker's item: ``status`` and what it holds now (a failure is logged)."""
        with self._writing:
            self._report(status)

    def _report(self, status: str) -> None:
        pulling = self.pulling
        if pulling is not None and status == "idle":
            status = "starting"
        owners = self.slots.owners()
        runs = list(owners)
        left = self.slots.runs_left()
        free_cpus, free_gpus = self.slots.allocator.free()
        stopping = self.slots.stopping.is_set()
        try:
            self.registry.put(
                Worker(
                    id=self.config.worker_id,
                    pool=self.config.pool,
                    status="draining" if stopping and runs else status,
                    host=socket.gethostname(),
                    slots=self.config.slots,
                    free_slots=0
                    if self.slots.stopping.is_set() or left == 0
                    else max(0, self.config.slots - len(runs)),
                    cpus=float(len(self.slots.allocator.cpus)),
                    gpus=len(self.slots.allocator.gpus),
                    gpu_ids=[g.uuid for g in self.slots.allocator.gpus],
                    free_cpus=float(free_cpus),
                    free_gpus=free_gpus,
                    cached_inputs=self.slots.cached_inputs,
                    memory=self.config.memory,
                    runs=runs,
                    run_owners=owners,
                    runs_done=self.slots.finished,
                    runs_left=left,
                    started_at=self.started_at,
                    heartbeat_at=self.clock(),
                    agent_version=self.config.version,
                    tag=self.config.tag,
                    tag_exclusive=self.config.tag_exclusive,
                    group=self.config.group,
                    network_refused=self.network_refused,
                    refused=self.refused,
                    pulling=pulling,
                )
            )
        except RunplaneError as e:
            log.warning("worker report failed: %s", e)

    def set_offline(self) -> None:
        self.report("offline")
