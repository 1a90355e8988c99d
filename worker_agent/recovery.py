"""Recovery at start: what a previous life of this worker, or an agent that died, left behind --
runs this worker still holds, run containers whose run is no longer held by their worker, run
directories."""

from __future__ import annotations

import logging
from typing import Any

import docker
import docker.errors
import requests

from runplane.domain.errors import NotFound, RunplaneError
from runplane.ports import Clock
from runplane.services import lifecycle
from worker_agent.container_spec import LABEL, container_labels, holds
from worker_agent.containers import remove_container
from worker_agent.quota_holds import QuotaHolds
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig
from worker_agent.trees import remove_tree

log = logging.getLogger(__name__)
# The most the agent waits at start for the engine to remove one container left by a previous
# life (the engine goes on removing it after that); a run's own removal may take remove_seconds.
STARTUP_REMOVE_SECONDS = 60.0


class Recovery:
    def __init__(
        self,
        config: AgentConfig,
        executor_config: ExecutorConfig,
        ports: AgentPorts,
        docker_client: docker.DockerClient,
        holds: QuotaHolds,
        clock: Clock,
    ) -> None:
        self.config = config
        self.executor_config = executor_config
        self.ports = ports
        self.docker = docker_client
        self.holds = holds
        self.clock = clock

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
                lifecycle.requeue(self.ports, run, self.clock(), "its worker restarted", charge=False)
                recovered.append(run.id)
            except RunplaneError as e:
                log.warning("could not hand back run %s: %s", run.id, e)
                continue
            self.holds.release(run, run.attempt)
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
