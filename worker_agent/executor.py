"""One run on this worker: prepare, run the container, watch it, upload, write the final state.

The executor owns the run from claim to final state. It stops the container first and
uploads afterwards (kill is never held up by outputs), and every store write checks the
attempt and worker, so a run taken away from this worker is abandoned, not overwritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
from docker.types import LogConfig, Mount

from runplane.domain import retries
from runplane.domain.accounting import Rates, charge
from runplane.domain.errors import LeaseLost, NotFound, RunplaneError
from runplane.domain.models import RUN_ID_PATTERN, FailureReason, Run, RunState, Usage
from runplane.domain.units import format_bytes, format_duration
from runplane.ports import ObjectStore, QuotaStore, RunQueue, RunStore
from runplane.services import lifecycle
from runplane.services.logs import outputs_prefix
from worker_agent.images import ImageCache
from worker_agent.inputs import InputCache, InputUnavailable
from worker_agent.logship import LogShipper
from worker_agent.network import NetworkError, RunNetwork
from worker_agent.outputs import upload_dir
from worker_agent.resources import Allocation
from worker_agent.settings import default
from worker_agent.trees import remove_tree
from worker_agent.usage import Sample, Tree, from_stats, read_cgroup, walk
from worker_agent.users import DEFAULT_RUN_AS, RUN_HOME, ImageUsers, RunAs, UnknownUser

log = logging.getLogger(__name__)

OUTPUT_MOUNT = "/runplane/output"
LABEL = "io.runplane"
_RUN_ID = re.compile(RUN_ID_PATTERN)


@dataclass(frozen=True)
class ExecutorConfig:
    worker_id: str
    work_dir: Path
    kill_poll_seconds: float = default("kill_poll_seconds")
    tick_seconds: float = 0.2
    log_flush_seconds: float = 1.0
    usage_seconds: float = 2.0
    upload_deadline_seconds: float = default("upload_deadline_seconds")
    pids_limit: int = 4096
    shm_size: str | None = default("shm_size")
    run_user: str = default("run_user")
    stack_id: str = ""
    pull: str = default("pull")  # missing | never
    # the pool's containment (Pool.allow_root, max_output_files, max_log_size)
    allow_root: bool = False
    max_output_files: int = 100_000
    max_log_size: int = 1024**3
    rates: Rates = field(default_factory=Rates)  # the pool's shape and price: what runs are charged
    docker_log_size: str = default("docker_log_size")  # Docker's own json log of a run: two files of at most this
    inputs_view: Path | None = None  # the input cache's read-only nosuid,nodev view (workdir.py)
    disk_sample_share: float = 0.05  # the most of its time the agent spends walking a run's files
    max_disk_interval_seconds: float = 10.0  # and the longest a run goes between two disk checks
    stop_seconds: float = 30.0  # how long a killed container may take to exit; past it, nothing uploads
    remove_seconds: float = 600.0  # how long removing a container may take (a layer of millions of files)


@dataclass
class Outcome:
    state: RunState
    reason: FailureReason | None = None
    message: str = ""
    exit_code: int | None = None
    upload: bool = True  # False: the outputs must not be read (over a limit, or the container may still run)


@dataclass
class Ports:
    store: RunStore
    queue: RunQueue
    objects: ObjectStore
    quotas: QuotaStore | None = None
    """Where claims reserve room under quotas (``services/admission.py``); None: no admission."""


@dataclass
class _Flags:
    kill: threading.Event = field(default_factory=threading.Event)
    lease_lost: threading.Event = field(default_factory=threading.Event)
    requeue: threading.Event = field(default_factory=threading.Event)
    log_limit: threading.Event = field(default_factory=threading.Event)


class RunExecutor:
    """Runs one claimed run to its end. ``start`` runs it in a thread; ``run_safely`` in this one.
    ``users`` is the agent's (one per agent: it caches each image's accounts). ``on_done`` is
    called once the run has ended, whatever happened, even if cleaning up after it failed."""

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
        network: RunNetwork | None = None,
        *,
        users: ImageUsers,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.images = images
        self.users = users
        self.sleep = sleep
        self.network = network
        self.claimed_at = clock()
        self.run_ = run
        self.allocation = allocation
        self.inputs = inputs
        self.mounts: dict[str, Path] = {}
        self.image: Any = None
        self.run_as = DEFAULT_RUN_AS
        self.log_bytes = 0  # stdout + stderr received, written by the follower thread only
        self.logs: Any = None  # the attached output stream, closed at cleanup whatever happened
        self._input_keys: list[str] = []
        self.ports = ports
        self.docker = docker_client
        self.config = config
        self.clock = clock
        self.on_done = on_done
        self.flags = _Flags()
        # what earlier attempts used, carried on: the run's figures are of all its attempts
        self.before = Usage(cpu_seconds=run.usage.cpu_seconds, gpu_seconds=run.usage.gpu_seconds, cost=run.usage.cost)
        self.usage = self.before.model_copy(deep=True)
        self.container: Any = None
        # the run's id names its directory (made, chowned, removed): only an id that is one
        self.valid_id = _RUN_ID.fullmatch(run.id) is not None
        self.run_dir = config.work_dir / "runs" / f"{run.id}-{run.attempt}"
        self.output_dir = self.run_dir / "output"
        self.home_dir = self.run_dir / "home"
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
        finally:  # whatever cleaning up met: the agent gets its slot back
            self.on_done(self)

    def execute(self) -> None:
        run = self.run
        if not self.valid_id:  # refused before anything on this host is made or touched
            self._final(
                Outcome(RunState.FAILED, FailureReason.AGENT_ERROR, f"run id {run.id[:80]!r} is not a valid run id")
            )
            return
        image = run.spec.image or ""
        outcome = self._prepare(image)
        if outcome is not None:
            self._final(outcome)
            return
        try:
            # by the id inspected (and whose users were read), not the tag, which may move meanwhile
            self.container = self._create(run, str(self.image.id))
            # attached before it starts: every byte, straight from the container, whatever
            # Docker's own (capped, rotated) log file keeps
            logs = self.logs = self.container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=True)
        except docker.errors.APIError as e:
            self._final(_create_failure(e, self.allocation))
            return
        try:
            self.container.start()
        except docker.errors.APIError as e:
            logs.close()
            self._final(_create_failure(e, self.allocation, "start"))
            return
        if run.spec.network:  # hook: close the run's network off, then let its command start
            failure = self._open_network()
            if failure is not None:
                self._kill_container()
                self._final(failure)
                return
        started = self.clock()
        # a LeaseLost here leaves through run_safely, whose cleanup removes the started container
        message = f"container started on worker {self.config.worker_id}"
        self._set_run(lifecycle.advance(self.ports.store, run, RunState.RUNNING, started, message))
        outcome = self._watch(started, logs)
        ran = self.usage.timings["run"] = round(self.clock() - started, 3)
        self._charge(ran)
        if self.flags.lease_lost.is_set():
            raise LeaseLost(f"run {run.id} attempt {run.attempt} was taken away")
        if self.flags.requeue.is_set() and outcome.state != RunState.SUCCEEDED:
            self._flush_logs()
            lifecycle.requeue(
                self.ports.store,
                self.ports.queue,
                self.run,
                self.clock(),
                "worker terminated",
                charge=False,
                usage=self.usage,
            )
            return
        if not outcome.upload:  # over a limit, or the container may still run: nothing is read
            outcome.message += "; outputs not uploaded"
            self._final(outcome)
            return
        self._final(self._upload(outcome))

    def _prepare(self, image: str) -> Outcome | None:
        """The image, who runs it, the run's directories and its inputs; an Outcome if the run
        ends here."""
        t0 = self.clock()
        outcome = self._ensure_image(image)
        if outcome is None and self.images is not None:
            try:
                self.images.used(image)
            except OSError as e:  # bookkeeping for pruning; never a reason to fail the run
                log.warning("run %s: could not record image use: %s", self.run.id, e)
        if outcome is None:
            outcome = self._resolve_user()
        self.usage.timings["pull"] = round(self.clock() - t0, 3)
        if outcome is None:
            outcome = self._make_dirs()
        if outcome is None:
            outcome = self._fetch_inputs()
        if outcome is None and self.clock() - self.claimed_at >= self.config.kill_poll_seconds:
            outcome = self._check_control()  # preparing took a while: was a kill asked for meanwhile?
        return outcome

    def _upload(self, outcome: Outcome) -> Outcome:
        run = self.run
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
        return outcome

    def _ensure_image(self, image: str) -> Outcome | None:
        try:
            self.image = self.docker.images.get(image)
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
            self.image = self.docker.images.pull(image)
            return None
        except (docker.errors.APIError, requests.RequestException) as e:
            return Outcome(
                RunState.FAILED,
                FailureReason.IMAGE_NOT_FOUND,
                f"image {image} is not on this worker and could not be pulled: {_explain(e)}",
            )

    def _resolve_user(self) -> Outcome | None:
        """Who the command runs as, from the image's own account files (users.py)."""
        image = self.run.spec.image
        try:
            self.run_as = self.users.run_as(self.image, self.config.run_user, self.config.allow_root)
        except UnknownUser as e:
            return Outcome(RunState.FAILED, FailureReason.CONTAINER_ERROR, f"image {image}: {e.message}")
        except (docker.errors.APIError, requests.RequestException) as e:
            return Outcome(
                RunState.FAILED, FailureReason.CONTAINER_ERROR, f"cannot read the users of image {image}: {_explain(e)}"
            )
        return None

    def _make_dirs(self) -> Outcome | None:
        """The run's directories: 0700 and the run's uid's, in a 0700 ``runs`` directory."""
        uid, gid = self.run_as.uid, self.run_as.gid
        dirs = [self.run_dir, self.output_dir] + ([self.home_dir] if self.own_home else [])
        try:
            self.run_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for path in dirs:
                path.mkdir(mode=0o700, exist_ok=True)
                os.chown(path, uid, gid)
                path.chmod(0o700)
        except PermissionError as e:
            return Outcome(
                RunState.FAILED,
                FailureReason.AGENT_ERROR,
                f"cannot give the run's directory to uid {uid}: the agent runs as uid {os.geteuid()} and must be "
                f"root to run commands as another user (or use --run-user {os.geteuid()}:{os.getegid()}): {e}",
            )
        return None

    def _fetch_inputs(self) -> Outcome | None:
        run = self.run
        if not run.spec.inputs:
            return None
        t0 = self.clock()
        if self.inputs is None:
            return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, "this worker has no input cache")
        try:
            for name, source in sorted(run.spec.inputs.items()):
                fetched = self.inputs.fetch(source, self._user, owner=run.owner, groups=run.owner_groups)
                self._input_keys.append(fetched.key)
                self.mounts[name] = self._input_path(fetched.path)
        except InputUnavailable as e:
            return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, f"input unavailable: {e.message}")
        finally:
            self.usage.timings["inputs"] = round(self.clock() - t0, 3)
        return None

    def _input_path(self, path: Path) -> Path:
        """``path`` (in the cache) seen through the read-only nosuid,nodev view, if there is one."""
        view = self.config.inputs_view
        if view is None or self.inputs is None:
            return path
        try:
            return view / path.resolve().relative_to(self.inputs.root.resolve())
        except ValueError:
            return path

    @property
    def _user(self) -> str:
        return f"{self.config.worker_id}--{self.run.id}-{self.run.attempt}"

    @property
    def own_home(self) -> bool:
        """The run gets a home directory of its own (its image's is not writable for its user,
        and it sets no HOME itself)."""
        return self.run_as.home is not None and "HOME" not in self.run.spec.env

    def _create(self, run: Run, image: str) -> Any:
        kwargs = container_spec(
            run,
            image,
            self.config,
            self.output_dir.resolve(),
            self.allocation,
            self.mounts,
            self.run_as,
            self.home_dir.resolve() if self.own_home else None,
            inputs_on_safe_mount=all(_on_read_only_safe_mount(p) for p in self.mounts.values()),
        )
        if run.spec.network:  # hook: the agent's run network, the command behind a gate (network.py)
            if self.network is None:
                raise RuntimeError("this worker has no contained network for runs")
            self.network.prepare(kwargs, self.run_dir)
        try:
            return self.docker.containers.create(**kwargs)
        except docker.errors.APIError as e:
            if e.status_code != 409:
                raise
        self._take_name_back(kwargs["name"])
        return self.docker.containers.create(**kwargs)

    def _take_name_back(self, name: str) -> None:
        """The name of this attempt's container is taken: by a container of this attempt that
        another worker made (a store that let two claims of one attempt through) or an earlier
        life of this worker left. It is removed only if the store says this worker holds the
        attempt (then its maker does not: one worker holds an attempt); otherwise the run is
        given up (LeaseLost) and the container, perhaps that of the worker holding the run, stays."""
        try:
            namesake = self.docker.containers.get(name)
        except docker.errors.NotFound:
            return  # gone meanwhile
        run = self.run
        try:
            stored = self.ports.store.get(run.id)
        except NotFound:
            stored = None
        if stored is None or not holds(stored, self.config.worker_id, run.attempt):
            maker = container_labels(namesake).get(f"{LABEL}.worker_id")
            raise LeaseLost(
                f"run {run.id} attempt {run.attempt} is not held by this worker (a container of worker {maker} "
                "has its name)"
            )
        why = f"worker {self.config.worker_id} holds attempt {run.attempt} of its run and needs its name"
        left = remove_container(namesake, self.config.remove_seconds, self.clock, self.sleep, why=why)
        if left is not None:
            log.warning("run %s: could not remove container %s: %s", run.id, namesake.id, left)

    def _open_network(self) -> Outcome | None:
        """Install the run's network rules, then let its command start (see network.py)."""
        t0 = self.clock()
        try:
            if self.network is None:
                raise NetworkError("this worker has no contained network for runs")
            flags = self.flags
            self.network.release(
                self.container,
                self.run_dir,
                lambda: flags.kill.is_set() or flags.requeue.is_set() or flags.lease_lost.is_set(),
            )
        except NetworkError as e:
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                f"the run's network could not be closed off, so its command never started: {e}",
            )
        finally:
            self.usage.timings["network"] = round(self.clock() - t0, 3)
        return None

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
            return self._killed("killed on request before the container started")
        return None

    def _killed(self, message: str) -> Outcome:
        """A kill asked for in the store, saying why when the asker said (``Run.kill_reason``)."""
        reason = self.run.kill_reason
        return Outcome(RunState.KILLED, FailureReason.KILLED, f"{message}: {reason}" if reason else message)

    def _follow(self, logs: Any) -> None:
        """Ship stdout and stderr from the attached stream as they come, up to the pool's
        ``max_log_size``, and read on to the end: the engine writes to this stream as the
        container writes, so a stream left unread would hold the container (and its kill) up."""
        try:
            for out, err in logs:
                for stream, data in (("stdout", out), ("stderr", err)):
                    if data:
                        self._ship(stream, data)
        except (docker.errors.APIError, requests.RequestException, OSError) as e:
            log.warning("run %s: the output stream ended early: %s", self.run.id, e)
        finally:
            logs.close()

    def _ship(self, stream: str, data: bytes) -> None:
        """Take in ``data``, at most up to the log limit; past it, flag the run (``_watch`` stops
        it) and drop the rest. A full buffer is uploaded here, which holds the container's output
        back meanwhile: the agent's memory stays bounded whatever a run prints."""
        room = self.config.max_log_size - self.log_bytes
        if len(data) > room:
            data = data[: max(room, 0)]
            self.flags.log_limit.set()
        if not data:
            return
        self.log_bytes += len(data)
        shipper = self.shippers[stream]
        shipper.write(data)
        if shipper.pending() >= shipper.max_buffer:
            try:
                shipper.flush()
            except RunplaneError as e:
                log.warning("run %s: log upload failed (will retry): %s", self.run.id, e)

    def _log_limit(self) -> Outcome | None:
        if not self.flags.log_limit.is_set():
            return None
        return Outcome(
            RunState.FAILED,
            FailureReason.LOG_LIMIT,
            f"wrote more than {format_bytes(self.config.max_log_size)} to stdout and stderr, the pool's "
            "max_log_size: stopped (the log keeps what came before the limit)",
        )

    def _watch(self, started: float, logs: Any) -> Outcome:
        exited = threading.Event()
        result: dict[str, Any] = {}

        def waiter() -> None:
            try:
                result.update(self.container.wait())
            except (docker.errors.APIError, requests.RequestException) as e:
                result["Error"] = str(e)
            exited.set()

        follower = threading.Thread(target=self._follow, args=(logs,), daemon=True)
        for t in (threading.Thread(target=waiter, daemon=True), follower):
            t.start()
        # the disk is walked on a thread of its own: a long walk never holds up a kill or a limit
        sampler = _DiskSampler(self._check_disk, self.config, self.clock, f"disk-{self.run.id}")
        try:
            stopped = self._until_exit(started, exited, sampler)
            sampler.stop()
            if stopped is not None:
                self._kill_container()
                exited.wait(self.config.stop_seconds)
        finally:
            sampler.stop()
            sampler.join()
        self._sample_usage()
        follower.join(timeout=5)
        self._flush_logs()
        state, running = self._exited_state(exited)
        if running is not None:  # nothing of the run is read while it may still be writing
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                f"the container did not stop within {format_duration(self.config.stop_seconds)} of being "
                f"killed ({running})",
                upload=False,
            )
        if state is None:
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                "the container was removed from the Docker engine while it ran (not by runplane)",
            )
        # a run may write past a limit and end before a sample sees it: look once more, now that
        # nothing in it moves any more
        over = self._check_disk() or self._log_limit()
        return self._ending(stopped or over, state, result)

    def _until_exit(self, started: float, exited: threading.Event, sampler: _DiskSampler) -> Outcome | None:
        """Watch the running container until it exits (None) or must be stopped (why)."""
        limit = self.run.spec.resources.time
        next_poll = next_usage = self.clock()
        while not exited.wait(self.config.tick_seconds):
            now = self.clock()
            stopped: Outcome | None = None
            if now >= next_poll:
                next_poll = now + self.config.kill_poll_seconds
                try:
                    self._check_control()
                except LeaseLost:
                    stopped = Outcome(RunState.FAILED, FailureReason.WORKER_LOST, "lease lost")
            if self.flags.requeue.is_set() and stopped is None:
                stopped = Outcome(RunState.QUEUED, message="worker terminated")
            if self.flags.kill.is_set() and stopped is None:
                stopped = self._killed("killed on request")
            if limit is not None and now - started > limit and stopped is None:
                stopped = Outcome(
                    RunState.TIMED_OUT, FailureReason.TIME_LIMIT, f"exceeded its time limit of {format_duration(limit)}"
                )
            if now >= next_usage:
                next_usage = now + self.config.usage_seconds
                self._sample_usage()
                self._charge(now - started)  # the heartbeat records it: a lost attempt counts so far
            stopped = stopped or sampler.over or self._log_limit()
            if stopped is not None:
                return stopped
            self._flush_logs(only_due=True)
        return None

    def _exited_state(self, exited: threading.Event) -> tuple[dict[str, Any] | None, str | None]:
        """The container's state once it has exited (None: it is gone from the engine), or why it
        cannot be said to have exited: it still runs ``stop_seconds`` after being killed (once
        more), or its state cannot be read. A wait that failed, a kill that failed or a process
        that ignores SIGKILL (uninterruptible sleep) all end here, never in an upload."""
        deadline = self.clock() + self.config.stop_seconds
        killed = False
        while True:
            try:
                self.container.reload()
            except docker.errors.NotFound:
                return None, None
            except (docker.errors.APIError, requests.RequestException) as e:
                why = f"its state cannot be read: {_explain(e)}"
            else:
                state: dict[str, Any] = self.container.attrs.get("State") or {}
                if state.get("Running") is False and not state.get("Restarting"):
                    return state, None
                why = f"it is still {state.get('Status') or 'running'}"
            if self.clock() >= deadline:
                return None, why
            if not killed:
                killed = True
                log.warning("run %s: the container has not exited (%s): killing it", self.run.id, why)
                self._kill_container()
            if exited.is_set():  # the wait ended (or failed) before: look again in a while
                self.sleep(0.2)
            else:
                exited.wait(0.2)

    def _ending(self, ended: Outcome | None, state: dict[str, Any], result: dict[str, Any]) -> Outcome:
        """How the run ended, from the engine's word on its exited container."""
        run = self.run
        if state.get("Status") in ("removing", "dead"):  # someone ran `docker rm -f` on it
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                "the container was removed from the Docker engine while it ran (not by runplane)",
            )
        exit_code = result.get("StatusCode", state.get("ExitCode"))
        if ended is not None:
            ended.exit_code = exit_code
            return ended
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
        """Kill the container; a kill that fails is logged (``_exited_state`` sees what came of it)."""
        try:
            self.container.kill()
        except docker.errors.APIError as e:
            if "is not running" not in str(e):
                log.warning("run %s: kill failed: %s", self.run.id, e)
        except requests.RequestException as e:
            log.warning("run %s: kill failed: %s", self.run.id, e)

    def _sample_usage(self) -> None:
        sample: Sample | None = read_cgroup(self.container.id)
        if sample is None:
            try:
                sample = from_stats(self.container.stats(stream=False, one_shot=True))
            except (docker.errors.APIError, requests.RequestException):
                sample = None
        if sample is not None:
            if sample.cpu_seconds is not None:
                self.usage.cpu_seconds = round((self.before.cpu_seconds or 0.0) + sample.cpu_seconds, 3)
            if sample.memory_peak is not None:
                self.usage.memory_peak = max(self.usage.memory_peak or 0, sample.memory_peak)

    def _charge(self, ran: float) -> None:
        """Record GPU-seconds and cost of earlier attempts plus ``ran`` seconds of this one."""
        gpu_seconds, cost = charge(self.run.spec.resources, self.config.rates, ran)
        self.usage.gpu_seconds = round((self.before.gpu_seconds or 0.0) + gpu_seconds, 3)
        if cost is not None:
            self.usage.cost = (self.before.cost or 0.0) + cost

    def _check_disk(self, cancelled: Callable[[], bool] | None = None) -> Outcome | None:
        """Everything the run wrote against its limits: its output directory, its home directory
        and the container's own writable layer, by apparent size against its disk limit, and by
        count, the three together, against the pool's max_output_files (the files a run may
        write). The walks stop once past a limit, or once ``cancelled()``; then it says nothing.
        What cannot be walked (an error, a tree too deep) counts as over the limit, never as 0."""
        limit, most = self.run.spec.resources.disk, self.config.max_output_files
        output = walk(self.output_dir, limit, most, cancelled)
        home = Tree()
        if self.own_home:
            home = walk(self.home_dir, _rest(limit, output.size), _rest(most, output.entries), cancelled)
        layer = self._layer_size(
            _rest(limit, output.size + home.size), _rest(most, output.entries + home.entries), cancelled
        )
        if cancelled is not None and cancelled():
            return None
        total = output.size + home.size + layer.size
        self.usage.disk = total
        trees = [("output directory", output), ("container file system", layer), ("home", home)]
        unreadable = "; ".join(f"{name}: {tree.unreadable}" for name, tree in trees if tree.unreadable)
        if unreadable:
            return Outcome(
                RunState.FAILED,
                FailureReason.DISK_LIMIT,
                f"what it wrote cannot be counted ({unreadable}), so it counts as over its disk limit",
                upload=False,
            )
        if output.entries + home.entries + layer.entries > most:
            return Outcome(
                RunState.FAILED,
                FailureReason.DISK_LIMIT,
                f"wrote more than {most} files and directories (output directory, home and container file system "
                "together), the pool's max_output_files",
                upload=False,
            )
        if limit is None or total <= limit:
            return None
        detail = ", ".join(f"{name} {format_bytes(tree.size)}" for name, tree in trees if tree.size)
        more = "more than " if output.stopped or home.stopped or layer.stopped else ""
        return Outcome(
            RunState.FAILED,
            FailureReason.DISK_LIMIT,
            f"wrote {more}{format_bytes(total)} ({detail}), over the {format_bytes(limit)} disk limit",
            upload=False,
        )

    def _layer_size(self, most: int | None, entries: int | None, cancelled: Callable[[], bool] | None) -> Tree:
        """The container's writable layer: its overlay upper directory walked from here when this
        agent can see it (as cheap as Docker's own count, and it stops early), else the
        ``SizeRw`` the engine counts (which has no count of files)."""
        data = (self.container.attrs.get("GraphDriver") or {}).get("Data") or {}
        upper = data.get("UpperDir")
        if upper and Path(upper).is_dir():
            return walk(upper, most, entries, cancelled)
        try:
            found = self.docker.api.containers(all=True, filters={"id": self.container.id}, size=True)
        except (docker.errors.APIError, requests.RequestException) as e:
            log.warning("run %s: cannot size the container's file system: %s", self.run.id, e)
            return Tree()
        return Tree(size=int((found[0] if found else {}).get("SizeRw") or 0))

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
            reason = outcome.reason or FailureReason.AGENT_ERROR
            decision = retries.decide(run, reason, self.config.rates.memory or None)
            if decision is not None and decision.retry:
                new = lifecycle.retry(
                    self.ports.store,
                    self.ports.queue,
                    run,
                    reason,
                    outcome.message,
                    decision.note,
                    self.clock(),
                    memory=decision.memory,
                    usage=self.usage,
                    exit_code=outcome.exit_code,
                )
            else:
                message = outcome.message if decision is None else f"{outcome.message}; {decision.note}"
                new = lifecycle.fail(
                    self.ports.store,
                    run,
                    reason,
                    message,
                    self.clock(),
                    exit_code=outcome.exit_code,
                    usage=self.usage,
                )
        self._set_run(new)
        lifecycle.ended(self.ports.queue, new)

    def _cleanup(self) -> None:
        """Release the run's inputs, remove its container and its directory. Each step is on its
        own: one that fails is logged and the others still go (what is left, a later start of
        this worker removes)."""
        for key in self._input_keys:
            if self.inputs is not None:
                try:
                    self.inputs.release(key, self._user)
                except OSError as e:
                    log.warning("run %s: could not release input %s: %s", self.run.id, key, e)
        if self.logs is not None:
            with contextlib.suppress(OSError, requests.RequestException):
                self.logs.close()
        if self.container is not None:
            why = f"its attempt is over on this worker (the run as last read here: {self.run.state})"
            left = remove_container(self.container, self.config.remove_seconds, self.clock, self.sleep, why=why)
            if left is not None:
                log.warning("run %s: could not remove its container: %s", self.run.id, left)
        if self.valid_id:
            left = remove_tree(self.run_dir)
            if left is not None:
                log.warning("run %s: could not remove all of its directory: %s", self.run.id, left)


class _DiskSampler:
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


def remove_container(
    container: Any,
    seconds: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None] = time.sleep,
    *,
    why: str = "the agent is done with it",
) -> str | None:
    """Remove ``container`` (killed first if it runs), taking up to ``seconds``: a request that
    fails or times out (removing a layer of millions of files outlasts the client's timeout,
    and the engine goes on with it) is tried again, and one the engine answers "already in
    progress" is waited on, until the container is gone. Returns why it is not gone, or None;
    never raises. Logs one INFO line first: the container's run, attempt and worker, and ``why``."""
    labels = container_labels(container)
    log.info(
        "removing container %s (run %s attempt %s, made by worker %s): %s",
        str(container.id)[:12],
        labels.get(f"{LABEL}.run_id", "-"),
        labels.get(f"{LABEL}.attempt", "-"),
        labels.get(f"{LABEL}.worker_id", "-"),
        why,
    )
    deadline = clock() + seconds
    while True:
        try:
            container.remove(force=True)
            return None
        except docker.errors.NotFound:
            return None
        except (docker.errors.APIError, requests.RequestException) as e:
            if clock() >= deadline:
                return f"not removed within {format_duration(seconds)}: {_explain(e)}"
        sleep(min(0.5, max(deadline - clock(), 0.0)))


def container_labels(container: Any) -> dict[str, str]:
    """A container's labels, from a listing (sparse) or an inspect alike."""
    attrs = container.attrs or {}
    labels = attrs.get("Labels") if "Labels" in attrs else (attrs.get("Config") or {}).get("Labels")
    return dict(labels or {})


def holds(run: Run, worker_id: str | None, attempt: int | str | None) -> bool:
    """Whether, as ``run`` was read from the store, worker ``worker_id`` holds its ``attempt``:
    only the container of that worker and attempt may run for it (one made by any other worker
    or attempt is no longer of use)."""
    held = worker_id is not None and run.worker_id == worker_id and str(run.attempt) == str(attempt)
    return held and not run.state.terminal


CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"]
"""What a root run keeps (only on a pool with ``allow_root``); a run that is not root gets none."""
DOCKER_LOG_FILES = 2


def container_name(stack_id: str, run_id: str, attempt: int) -> str:
    """The name of a run's container: opaque, since every container on a run network learns the
    names of the others from Docker's DNS (a reverse lookup of an address answers it), and run
    ids are their owners' only. The agent computes it (a retried create) and finds its containers
    by their labels, which hold the run id."""
    digest = hashlib.sha256(f"{stack_id}\0{run_id}\0{attempt}".encode()).hexdigest()[:32]
    return f"runplane-{digest}"


def container_spec(
    run: Run,
    image: str,
    config: ExecutorConfig,
    output_dir: Path,
    allocation: Allocation | None,
    inputs: dict[str, Path] | None = None,
    run_as: RunAs = DEFAULT_RUN_AS,
    home_dir: Path | None = None,
    *,
    inputs_on_safe_mount: bool = False,
) -> dict[str, Any]:
    """Everything ``containers.create`` gets for ``run``: the command under ``sh -c`` as
    ``run_as`` (numbers), limits, the run's own cores and GPUs, and the hardening every run has.
    ``home_dir`` is mounted as HOME when ``run_as`` asks for one (and the run sets no HOME).
    Mounts are a list (``docker.types.Mount``), one per target: two inputs of the same source
    are two mounts. ``inputs_on_safe_mount``: the input paths are on a read-only nosuid,nodev
    mount (the inputs view), so they are bound without Docker's read-only, which runc applies by
    a remount that drops nosuid and nodev; read-only they stay, from the mount they come from."""
    res = run.spec.resources
    env = dict(run.spec.env)
    env.update({"RUNPLANE_RUN_ID": run.id, "RUNPLANE_ATTEMPT": str(run.attempt), "RUNPLANE_OUTPUT": OUTPUT_MOUNT})
    if run.sweep_id is not None:
        env.update({"RUNPLANE_SWEEP_ID": run.sweep_id, "RUNPLANE_SWEEP_INDEX": str(run.sweep_index)})
    allocation = allocation or Allocation((), ())
    env.update(allocation.environment())
    mounts = [Mount(OUTPUT_MOUNT, str(output_dir), type="bind")]
    if run_as.home and home_dir is not None and "HOME" not in run.spec.env:
        env["HOME"] = run_as.home
        mounts.append(Mount(RUN_HOME, str(home_dir), type="bind"))
    for name, path in sorted((inputs or {}).items()):
        mounts.append(Mount(f"/inputs/{name}", str(path), type="bind", read_only=not inputs_on_safe_mount))
    spec: dict[str, Any] = {
        "image": image,
        "entrypoint": ["/bin/sh", "-c"],
        "command": [run.spec.command],
        "name": container_name(config.stack_id, run.id, run.attempt),
        "working_dir": OUTPUT_MOUNT,
        "environment": env,
        "mounts": mounts,
        # every run starts without a network; a networked one gets its run network from
        # RunNetwork.release once its rules are in (network.py)
        "network_mode": "none",
        "mem_limit": res.memory,
        "memswap_limit": res.memory,
        "pids_limit": config.pids_limit,
        "user": run_as.user,
        "cap_drop": ["ALL"],
        "cap_add": CAPABILITIES if run_as.root else [],
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "labels": {
            f"{LABEL}.run_id": run.id,
            f"{LABEL}.attempt": str(run.attempt),
            f"{LABEL}.worker_id": config.worker_id,
            f"{LABEL}.stack": config.stack_id,
        },
        # the agent ships the output itself (attached); Docker's own copy stays small
        "log_config": LogConfig(
            type="json-file", config={"max-size": config.docker_log_size, "max-file": str(DOCKER_LOG_FILES)}
        ),
        "detach": True,
        **allocation.docker_kwargs(int(res.cpus * 1e9)),
    }
    if config.shm_size:
        spec["shm_size"] = config.shm_size
    return spec


def _on_read_only_safe_mount(path: Path) -> bool:
    try:
        flags = os.statvfs(path).f_flag
    except OSError:
        return False
    return flags & (os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV) == os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV


def _rest(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(limit - used, 0)


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
