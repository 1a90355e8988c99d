"""How a stopping local stack ends its runs and agents: active runs killed (STOP_REASON) and
recorded so (queued and waiting runs stay queued), its local agents stopped, what killed agents
leave (containers, work-dir mounts, worker records) cleared."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import docker
import docker.errors
import requests

from runplane import bootstrap
from runplane.compute.local.compute import LocalCompute
from runplane.domain.errors import NotFound, RunplaneError
from runplane.domain.runs import Run
from runplane.ports import Ports, RunStore, WorkerRegistry
from runplane.services import runs
from worker_agent.executor import LABEL, container_labels, remove_container
from worker_agent.workdir import sweep_dead

log = logging.getLogger(__name__)
STOP_REASON = "the local stack stopped"
"""Why the runs a stopping stack kills were killed: their failure message says it."""
RUNS_END_SECONDS = 5.0
AGENT_EXIT_SECONDS = 1.0
KILLED_GONE_SECONDS = 2.0


def end_runs(stack: bootstrap.Stack, agents_dir: Path) -> None:
    """What ``DevStack.stop`` does to the runs and agents of ``stack`` (see its docstring);
    ``agents_dir``: the agents' work dirs."""
    store = stack.store
    left = [run for run in kill_all(stack.ports) if run.state.active]
    agents = [
        (backend, pool)
        for pool in stack.pools.pools
        if pool.backend == "local" and isinstance(backend := stack.backend(pool), LocalCompute)
    ]

    def agents_gone() -> bool:
        return not any(backend.list(pool) for backend, pool in agents)

    # told to stop now, agents take no more runs and exit once theirs have ended
    told = {job.worker_id for backend, pool in agents for job in backend.signal_all(pool, signal.SIGTERM)}
    pending = {run.id for run in left}

    def runs_ended() -> bool:
        pending.difference_update([run_id for run_id in pending if _ended(store, run_id)])
        return not pending

    _wait(runs_ended, RUNS_END_SECONDS)
    _wait(agents_gone, AGENT_EXIT_SECONDS)
    killed = {job.worker_id for backend, pool in agents for job in backend.signal_all(pool, signal.SIGKILL)}
    _wait(agents_gone, KILLED_GONE_SECONDS)
    if killed and pending:  # else they were only waiting for work (a long poll), and their end is no news
        log.warning(
            "killed %d agent(s): their runs had not ended within %g s: %s",
            len(killed),
            RUNS_END_SECONDS,
            ", ".join(sorted(killed)),
        )
    remove_containers(stack.settings.stack_id(), told | killed)
    try:
        sweep_dead(agents_dir)
    except OSError as e:
        log.warning("could not remove the work dir mounts of the stopped agents: %s", e)
    kill_all(stack.ports, workers_gone=True)
    for worker_id in killed:
        _offline(stack.workers, worker_id)


def kill_all(ports: Ports, workers_gone: bool = False) -> list[Run]:
    """``runs.stop_all`` of the active runs with STOP_REASON, said in the log: queued and waiting
    runs stay as they are, to run when the stack starts again on the same stores."""
    try:
        written = runs.stop_all(ports, STOP_REASON, workers_gone=workers_gone, active_only=True)
    except RunplaneError as e:
        log.warning("could not list the unfinished runs: %s", e)
        return []
    killed = [run for run in written if run.state.terminal]
    flagged = [run for run in written if run.state.active]
    if killed:
        log.info("killed %d run(s) left unfinished by the stopped agents: %s", len(killed), _ids(killed))
    if flagged:
        log.info("stopping %d active run(s): %s", len(flagged), _ids(flagged))
    return written


def remove_containers(stack_id: str, worker_ids: Iterable[str]) -> None:
    """Remove the containers (runs', network checks') that ``worker_ids`` made for this stack."""
    ids = set(worker_ids)
    if not ids:
        return
    client = None
    try:
        client = docker.from_env()
        containers = client.containers.list(sparse=True, all=True, filters={"label": f"{LABEL}.stack={stack_id}"})
        for container in containers:
            labels = container_labels(container)
            if (labels.get(f"{LABEL}.worker_id") or labels.get(f"{LABEL}.netcheck")) not in ids:
                continue  # another agent's (one started by hand against this stack)
            left = remove_container(container, 10, time.monotonic, why="its agent was stopped with the local stack")
            if left is not None:
                log.warning("could not remove container %s: %s", container.id, left)
    except (docker.errors.DockerException, requests.RequestException) as e:
        log.warning("could not remove the containers of the stopped agents: %s", e)
    finally:
        if client is not None:
            client.close()


def _ids(found: list[Run]) -> str:
    shown = ", ".join(run.id for run in found[:10])
    return shown + (f" and {len(found) - 10} more" if len(found) > 10 else "")


def _ended(store: RunStore, run_id: str) -> bool:
    try:
        return store.get(run_id).state.terminal
    except NotFound:
        return True
    except RunplaneError as e:
        log.warning("could not read run %s: %s", run_id, e)
        return False


def _wait(done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)


def _offline(registry: WorkerRegistry, worker_id: str) -> None:
    """Record a killed agent's worker offline (it could not say so itself), so that a stack
    started next on the same stores does not count on it."""
    try:
        worker = registry.get(worker_id)
        registry.put(worker.model_copy(update={"status": "offline", "runs": [], "run_owners": {}}))
    except NotFound:
        return
    except RunplaneError as e:
        log.warning("could not record worker %s offline: %s", worker_id, e)
