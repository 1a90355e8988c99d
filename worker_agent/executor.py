"""One run on this worker: prepare, run the container, watch it, upload, write the final state.

The executor owns the run from claim to final state. It stops the container first and
uploads afterwards (kill is never held up by outputs), and every store write checks the
attempt and worker, so a run taken away from this worker is abandoned, not overwritten.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from runplane.domain.errors import LeaseLost, NotFound, RunplaneError
from runplane.domain.models import FailureReason, Run, RunState, Usage
from runplane.domain.units import format_bytes, format_duration
from runplane.ports import ObjectStore, RunQueue, RunStore
from runplane.services import lifecycle
from runplane.services.logs import outputs_prefix
from worker_agent.images import ImageCache
from worker_agent.inputs import InputCache, InputUnavailable
from worker_agent.logship import LogShipper
from worker_agent.outputs import upload_dir
from worker_agent.resources import Allocation
from worker_agent.usage import Sample, dir_size, from_stats, read_cgroup

log = logging.getLogger(__name__)

OUTPUT_MOUNT = "/runplane/output"
LABEL = "io.runplane"


@dataclass(frozen=True)
class ExecutorConfig:
    worker_id: str
    work_dir: Path
    lease_seconds: float = 30
    kill_poll_seconds: float = 1.0
    tick_seconds: float = 0.2
    log_flush_seconds: float = 1.0
    usage_seconds: float = 2.0
    upload_deadline_seconds: float = 300
    network_mode: str = "bridge"
    pids_limit: int = 4096
    shm_size: str | None = None
    run_user: str = "nobody"
    stack_id: str = ""
    pull: str = "missing"  # missing | never


@dataclass
class Outcome:
    state: RunState
    reason: FailureReason | None = None
    message: str = ""
    exit_code: int | None = None


@dataclass
class Ports:
    store: RunStore
    queue: RunQueue
    objects: ObjectStore


@dataclass
class _Flags:
    kill: threading.Event = field(default_factory=threading.Event)
    lease_lost: threading.Event = field(default_factory=threading.Event)
    requeue: threading.Event = field(default_factory=threading.Event)


class RunExecutor:
    """Runs one claimed run to its end. ``start`` runs it in a thread; ``run`` in this one."""

    def __init__(
        self,
        run: Run,
        ports: Ports,
        docker_client: docker.DockerClient,
        config: ExecutorConfig,
        clock: Callable[[], float],
        on_done: Callable[[RunExecutor], None] = lambda _: None,
        allocation: Allocation | None = None,
        inputs: InputCache | None = None,
        images: ImageCache | None = None,
    ) -> None:
        self.images = images
        self.claimed_at = clock()
        self.run_ = run
        self.allocation = allocation
        self.inputs = inputs
        self.mounts: dict[str, Path] = {}
        self.image_user = ""
        self._input_keys: list[str] = []
        self.ports = ports
        self.docker = docker_client
        self.config = config
        self.clock = clock
        self.on_done = on_done
        self.flags = _Flags()
        self.usage = Usage()
        self.container: Any = None
        self.run_dir = config.work_dir / "runs" / f"{run.id}-{run.attempt}"
        self.output_dir = self.run_dir / "output"
        self.shippers = {
            s: LogShipper(ports.objects, run.id, run.attempt, s, clock, config.log_flush_seconds)
            for s in ("stdout", "stderr")
        }
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None

    # -- control from other threads -------------------------------------------------------

    @property
    def run(self) -> Run:
        with self._lock:
            return self.run_

    def _set_run(self, run: Run) -> None:
        with self._lock:
            self.run_ = run

    def observe(self, run: Run) -> None:
        """Take in a fresher copy of the stored run (from a heartbeat or a poll)."""
        if run.attempt != self.run.attempt or run.worker_id != self.config.worker_id or run.state.terminal:
            self.flags.lease_lost.set()
            return
        if run.kill_requested:
            self.flags.kill.set()
        self._set_run(run)

    def lease_lost(self) -> None:
        self.flags.lease_lost.set()

    def stop_and_requeue(self) -> None:
        """Pass-down termination: stop the container and hand the run back to its queue."""
        self.flags.requeue.set()

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run_safely, name=f"run-{self.run.id}", daemon=True)
        self.thread.start()

    # -- the run --------------------------------------------------------------------------

    def run_safely(self) -> None:
        try:
            self.execute()
        except LeaseLost as e:
            log.warning("run %s: %s; abandoning it", self.run.id, e)
        except Exception as e:  # the run must end in a state even if this agent has a bug
            log.exception("run %s: agent error", self.run.id)
            try:
                self._final(Outcome(RunState.FAILED, FailureReason.AGENT_ERROR, f"worker agent error: {e}"))
            except RunplaneError as final_error:
                log.error("run %s: could not record the failure: %s", self.run.id, final_error)
        finally:
            self._cleanup()
            self.on_done(self)

    def execute(self) -> None:
        run = self.run
        t0 = self.clock()
        image = run.spec.image or ""
        outcome = self._ensure_image(image)
        if outcome is None and self.images is not None:
            try:
                self.images.used(image)
            except OSError as e:  # bookkeeping for pruning; never a reason to fail the run
                log.warning("run %s: could not record image use: %s", run.id, e)
        self.usage.timings["pull"] = round(self.clock() - t0, 3)
        if outcome is None:
            outcome = self._fetch_inputs()
        if outcome is None and self.clock() - self.claimed_at >= self.config.kill_poll_seconds:
            outcome = self._check_control()  # preparing took a while: was a kill asked for meanwhile?
        if outcome is not None:
            self._final(outcome)
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.output_dir.chmod(0o777)  # the run's user (not the agent's) writes here; only it is mounted
        try:
            self.container = self._create(run, image)
        except docker.errors.APIError as e:
            self._final(_create_failure(e, self.allocation))
            return
        try:
            self.container.start()
        except docker.errors.APIError as e:
            self._final(_create_failure(e, self.allocation, "start"))
            return
        started = self.clock()
        # a LeaseLost here leaves through run_safely, whose cleanup removes the started container
        message = f"container started on worker {self.config.worker_id}"
        self._set_run(lifecycle.advance(self.ports.store, run, RunState.RUNNING, started, message))
        outcome = self._watch(started)
        self.usage.timings["run"] = round(self.clock() - started, 3)
        if self.flags.lease_lost.is_set():
            raise LeaseLost(f"run {run.id} attempt {run.attempt} was taken away")
        if self.flags.requeue.is_set() and outcome.state != RunState.SUCCEEDED:
            self._flush_logs()
            lifecycle.requeue(
                self.ports.store, self.ports.queue, self.run, self.clock(), "worker terminated", charge=False
            )
            return
        self._set_run(
            lifecycle.advance(
                self.ports.store, self.run, RunState.UPLOADING, self.clock(), f"uploading outputs ({outcome.state})"
            )
        )
        t_up = self.clock()
        report = upload_dir(
            self.ports.objects,
            self.output_dir,
            outputs_prefix(run.id, run.attempt),
            self.config.upload_deadline_seconds,
        )
        self.usage.timings["upload"] = round(self.clock() - t_up, 3)
        if report.skipped:
            outcome.message += f" (not uploaded: {', '.join(report.skipped[:5])})"
        if report.error:
            if outcome.state == RunState.SUCCEEDED:
                outcome = Outcome(RunState.FAILED, FailureReason.UPLOAD_FAILED, report.error, outcome.exit_code)
            else:
                outcome.message += f"; {report.error}"
        self._final(outcome)

    def _ensure_image(self, image: str) -> Outcome | None:
        try:
            self.image_user = _image_user(self.docker.images.get(image))
            return None
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as e:
            return Outcome(
                RunState.FAILED, FailureReason.IMAGE_NOT_FOUND, f"cannot inspect image {image}: {_explain(e)}"
            )
        if self.config.pull == "never":
            return Outcome(
                RunState.FAILED,
                FailureReason.IMAGE_NOT_FOUND,
                f"image {image} is not on this worker and pulling is off",
            )
        try:
            self.image_user = _image_user(self.docker.images.pull(image))
            return None
        except (docker.errors.APIError, requests.RequestException) as e:
            return Outcome(
                RunState.FAILED,
                FailureReason.IMAGE_NOT_FOUND,
                f"image {image} is not on this worker and could not be pulled: {_explain(e)}",
            )

    def _fetch_inputs(self) -> Outcome | None:
        run = self.run
        if not run.spec.inputs:
            return None
        t0 = self.clock()
        if self.inputs is None:
            return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, "this worker has no input cache")
        try:
            for name, source in sorted(run.spec.inputs.items()):
                fetched = self.inputs.fetch(source, self._user)
                self._input_keys.append(fetched.key)
                self.mounts[name] = fetched.path
        except InputUnavailable as e:
            return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, f"input unavailable: {e.message}")
        finally:
            self.usage.timings["inputs"] = round(self.clock() - t0, 3)
        return None

    @property
    def _user(self) -> str:
        return f"{self.config.worker_id}--{self.run.id}-{self.run.attempt}"

    def _create(self, run: Run, image: str) -> Any:
        kwargs = container_spec(
            run, image, self.config, self.output_dir.resolve(), self.allocation, self.mounts, self.image_user
        )
        try:
            return self.docker.containers.create(**kwargs)
        except docker.errors.APIError as e:
            if e.status_code != 409:
                raise
            # a container of this attempt left by an earlier life of this worker
            self.docker.containers.get(kwargs["name"]).remove(force=True)
            return self.docker.containers.create(**kwargs)

    def _check_control(self) -> Outcome | None:
        """Poll the store for a kill or a lost lease (the heartbeat does it too, less often)."""
        try:
            self.observe(self.ports.store.get(self.run.id))
        except NotFound:
            self.flags.lease_lost.set()
        except RunplaneError as e:
            log.warning("run %s: control poll failed: %s", self.run.id, e)
        if self.flags.lease_lost.is_set():
            raise LeaseLost(f"run {self.run.id} attempt {self.run.attempt} was taken away")
        if self.flags.kill.is_set():
            return Outcome(RunState.KILLED, FailureReason.KILLED, "killed on request before the container started")
        return None

    def _follow(self, stream: str) -> None:
        try:
            for chunk in self.container.logs(
                stream=True, follow=True, stdout=stream == "stdout", stderr=stream == "stderr"
            ):
                self.shippers[stream].write(chunk)
        except (docker.errors.APIError, requests.RequestException) as e:
            log.warning("run %s: %s stream ended early: %s", self.run.id, stream, e)

    def _watch(self, started: float) -> Outcome:  # noqa: C901 - one loop, several limits
        run = self.run
        limit = run.spec.resources.time
        exited = threading.Event()
        result: dict[str, Any] = {}

        def waiter() -> None:
            try:
                result.update(self.container.wait())
            except (docker.errors.APIError, requests.RequestException) as e:
                result["Error"] = str(e)
            exited.set()

        followers = [threading.Thread(target=self._follow, args=(s,), daemon=True) for s in self.shippers]
        for t in [threading.Thread(target=waiter, daemon=True), *followers]:
            t.start()
        stopped: Outcome | None = None
        next_poll = next_usage = self.clock()
        while not exited.wait(self.config.tick_seconds):
            now = self.clock()
            if now >= next_poll:
                next_poll = now + self.config.kill_poll_seconds
                try:
                    self._check_control()
                except LeaseLost:
                    stopped = Outcome(RunState.FAILED, FailureReason.WORKER_LOST, "lease lost")
            if self.flags.requeue.is_set() and stopped is None:
                stopped = Outcome(RunState.QUEUED, message="worker terminated")
            if self.flags.kill.is_set() and stopped is None:
                stopped = Outcome(RunState.KILLED, FailureReason.KILLED, "killed on request")
            if limit is not None and now - started > limit and stopped is None:
                stopped = Outcome(
                    RunState.TIMED_OUT, FailureReason.TIME_LIMIT, f"exceeded its time limit of {format_duration(limit)}"
                )
            if now >= next_usage:
                next_usage = now + self.config.usage_seconds
                self._sample_usage()
                disk, disk_limit = self.usage.disk or 0, run.spec.resources.disk
                if disk_limit is not None and disk > disk_limit and stopped is None:
                    stopped = Outcome(
                        RunState.FAILED,
                        FailureReason.DISK_LIMIT,
                        f"output directory grew to {format_bytes(disk)}, over the "
                        f"{format_bytes(disk_limit)} disk limit",
                    )
            if stopped is not None:
                self._kill_container()
                exited.wait(10)
                break
            self._flush_logs(only_due=True)
        self._sample_usage(final=True)
        for t in followers:
            t.join(timeout=5)
        self._flush_logs()
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                "the container was removed from the Docker engine while it ran (not by runplane)",
            )
        state = self.container.attrs.get("State", {})
        if state.get("Status") in ("removing", "dead"):  # someone ran `docker rm -f` on it
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                "the container was removed from the Docker engine while it ran (not by runplane)",
            )
        exit_code = result.get("StatusCode", state.get("ExitCode"))
        if stopped is not None:
            stopped.exit_code = exit_code
            return stopped
        if state.get("OOMKilled"):
            limit_text = format_bytes(run.spec.resources.memory or 0)
            return Outcome(
                RunState.FAILED,
                FailureReason.OUT_OF_MEMORY,
                f"ran out of memory: the container used its whole {limit_text} memory limit "
                "and the kernel stopped it (OOM)",
                exit_code,
            )
        if result.get("Error") or state.get("Error"):
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                f"container error: {result.get('Error') or state.get('Error')}",
                exit_code,
            )
        if exit_code == 0:
            return Outcome(RunState.SUCCEEDED, None, "command exited with code 0", 0)
        tail = bytes(self.shippers["stderr"].tail[-300:]).decode(errors="replace").strip()
        message = f"command exited with code {exit_code}"
        if tail:
            message += f"; stderr ends with: {tail.splitlines()[-1][:200]}"
        return Outcome(RunState.FAILED, FailureReason.NONZERO_EXIT, message, exit_code)

    def _kill_container(self) -> None:
        try:
            self.container.kill()
        except docker.errors.APIError as e:
            if "is not running" not in str(e):
                log.warning("run %s: kill failed: %s", self.run.id, e)

    def _sample_usage(self, final: bool = False) -> None:
        sample: Sample | None = read_cgroup(self.container.id)
        if sample is None:
            try:
                sample = from_stats(self.container.stats(stream=False, one_shot=True))
            except (docker.errors.APIError, requests.RequestException):
                sample = None
        if sample is not None:
            if sample.cpu_seconds is not None:
                self.usage.cpu_seconds = round(sample.cpu_seconds, 3)
            if sample.memory_peak is not None:
                self.usage.memory_peak = max(self.usage.memory_peak or 0, sample.memory_peak)
        # while it runs, the walk stops once past the limit: that is all the check needs
        limit = None if final else self.run.spec.resources.disk
        self.usage.disk = dir_size(self.output_dir, stop_after=limit)

    def _flush_logs(self, only_due: bool = False) -> None:
        for shipper in self.shippers.values():
            if only_due and not shipper.due():
                continue
            try:
                shipper.flush()
            except RunplaneError as e:
                log.warning("run %s: log upload failed (will retry): %s", self.run.id, e)

    def _final(self, outcome: Outcome) -> None:
        self._flush_logs()
        run = self.run
        if outcome.state == RunState.SUCCEEDED:
            new = lifecycle.advance(
                self.ports.store,
                run,
                RunState.SUCCEEDED,
                self.clock(),
                outcome.message,
                exit_code=outcome.exit_code,
                usage=self.usage,
            )
        else:
            new = lifecycle.fail(
                self.ports.store,
                run,
                outcome.reason or FailureReason.AGENT_ERROR,
                outcome.message,
                self.clock(),
                exit_code=outcome.exit_code,
                usage=self.usage,
            )
        self._set_run(new)

    def _cleanup(self) -> None:
        for key in self._input_keys:
            if self.inputs is not None:
                try:
                    self.inputs.release(key, self._user)
                except OSError as e:
                    log.warning("run %s: could not release input %s: %s", self.run.id, key, e)
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except docker.errors.APIError as e:
                if not isinstance(e, docker.errors.NotFound):
                    log.warning("run %s: could not remove container: %s", self.run.id, e)
        shutil.rmtree(self.run_dir, ignore_errors=True)


CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"]


def container_spec(
    run: Run,
    image: str,
    config: ExecutorConfig,
    output_dir: Path,
    allocation: Allocation | None,
    inputs: dict[str, Path] | None = None,
    image_user: str = "",
) -> dict[str, Any]:
    """Everything ``containers.create`` gets for ``run``: the command under ``sh -c``, limits,
    the run's own cores and GPUs, and the hardening every run has."""
    res = run.spec.resources
    env = dict(run.spec.env)
    env.update({"RUNPLANE_RUN_ID": run.id, "RUNPLANE_ATTEMPT": str(run.attempt), "RUNPLANE_OUTPUT": OUTPUT_MOUNT})
    allocation = allocation or Allocation((), ())
    env.update(allocation.environment())
    spec: dict[str, Any] = {
        "image": image,
        "entrypoint": ["/bin/sh", "-c"],
        "command": [run.spec.command],
        "name": f"runplane-{run.id}-{run.attempt}",
        "working_dir": OUTPUT_MOUNT,
        "environment": env,
        "volumes": {
            str(output_dir): {"bind": OUTPUT_MOUNT, "mode": "rw"},
            **{str(path): {"bind": f"/inputs/{name}", "mode": "ro"} for name, path in sorted((inputs or {}).items())},
        },
        "network_mode": config.network_mode if run.spec.network else "none",
        "mem_limit": res.memory,
        "memswap_limit": res.memory,
        "pids_limit": config.pids_limit,
        "cap_drop": ["ALL"],
        "cap_add": CAPABILITIES,
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "labels": {
            f"{LABEL}.run_id": run.id,
            f"{LABEL}.attempt": str(run.attempt),
            f"{LABEL}.worker_id": config.worker_id,
            f"{LABEL}.stack": config.stack_id,
        },
        "detach": True,
        **allocation.docker_kwargs(int(res.cpus * 1e9)),
    }
    if config.shm_size:
        spec["shm_size"] = config.shm_size
    user = run_user(config.run_user, image_user)
    if user is not None:
        spec["user"] = user
    return spec


NOBODY = "65534:65534"


def run_user(setting: str, image_user: str) -> str | None:
    """The ``user`` a container runs as. ``nobody``: the image's own user if it names a non-root
    one, else uid/gid 65534; ``image``: whatever the image says (None: Docker's default);
    anything else is taken as UID[:GID]."""
    if setting == "image":
        return None
    if setting == "nobody":
        if image_user and image_user.split(":")[0] not in ("root", "0"):
            return None
        return NOBODY
    return setting


def _image_user(image: Any) -> str:
    return str((image.attrs.get("Config") or {}).get("User") or "")


def _create_failure(e: docker.errors.APIError, allocation: Allocation | None, verb: str = "create") -> Outcome:
    text = _explain(e)
    if allocation is not None and allocation.gpus and ("device driver" in text or "nvidia" in text.lower()):
        ids = ",".join(g.uuid for g in allocation.gpus)
        return Outcome(
            RunState.FAILED,
            FailureReason.GPU_UNAVAILABLE,
            f"GPUs {ids} could not be given to the container: this worker's Docker engine has no "
            f"working NVIDIA runtime ({text})",
        )
    return Outcome(RunState.FAILED, FailureReason.CONTAINER_ERROR, f"cannot {verb} container: {text}")


def _explain(e: Exception) -> str:
    if isinstance(e, docker.errors.APIError):
        return str(e.explanation or e)
    return str(e)
