"""One run on this worker: prepare, run the container, watch it, upload, write the final state.

The executor owns the run from claim to final state. It stops the container first and uploads
afterwards (kill is never held up by outputs), and every store write checks the attempt and worker,
so a run taken away from this worker is abandoned, not overwritten. Its parts: ``prepare`` (image,
user, directories, inputs), ``containers`` (every Docker call), ``watch`` (the running container:
``logship`` its output, ``disk`` its files, ``control`` the store's word; ``live`` uploads what it
writes under ``live/`` meanwhile; ``run_checkpoints`` restores its checkpoint directory before it
starts and syncs it while it runs and when it ends), ``limits`` (what the figures mean) and
``run_state`` (the one writer of the run's state)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from runplane.domain.common import RUN_ID_PATTERN
from runplane.domain.errors import LeaseLost, RunplaneError
from runplane.domain.runs import Run
from runplane.domain.states import FailureReason, RunState
from runplane.ports import Clock
from runplane.services.logs import outputs_prefix
from worker_agent import limits
from worker_agent.container_spec import (
    LABEL,
    container_labels,
    container_name,
    container_spec,
    holds,
    image_environment,
    on_read_only_safe_mount,
)
from worker_agent.containers import RunContainer, remove_container
from worker_agent.control import RunControl
from worker_agent.disk import check_disk
from worker_agent.images import ImageCache
from worker_agent.inputs import InputCache
from worker_agent.limits import Limits
from worker_agent.live import LIVE_DIR, LiveOutputs
from worker_agent.logship import RunLogs
from worker_agent.network import NetworkError, RunNetwork
from worker_agent.outcome import Outcome
from worker_agent.outputs import upload_dir
from worker_agent.prepare import RunSetup
from worker_agent.registries import RegistryLogins
from worker_agent.resources import Allocation
from worker_agent.run_checkpoints import CheckpointUnreachable, RunCheckpoints
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.run_state import RunStateWriter
from worker_agent.secrets import RunSecrets, SecretsUnreachable
from worker_agent.sessions.attach import Input
from worker_agent.sessions.host import SessionHost
from worker_agent.stop_window import GRACE_SHARE, earlier, final_sync_seconds, stop_by
from worker_agent.trees import remove_tree
from worker_agent.usage import Meter
from worker_agent.users import ImageUsers
from worker_agent.watch import Watch

if TYPE_CHECKING:
    import docker

__all__ = [
    "LABEL",
    "AgentPorts",
    "ExecutorConfig",
    "Outcome",
    "RunExecutor",
    "container_labels",
    "container_name",
    "container_spec",
    "holds",
    "remove_container",
]

log = logging.getLogger(__name__)

_RUN_ID = re.compile(RUN_ID_PATTERN)

HAND_BACK_PAUSE_SECONDS = 3.0
"""How long a run whose secrets could not be read for now waits before it is handed back (so that
a store or key that is briefly down is not met again at once by every attempt)."""


class RunExecutor:
    """Runs one claimed run to its end. ``start`` runs it in a thread; ``run_safely`` in this one.
    ``users`` is the agent's (one per agent: it caches each image's accounts). ``on_done`` is
    called once the run has ended, whatever happened, even if cleaning up after it failed;
    ``on_removed`` after that, once its container and directory are removed (or removing them
    failed): what the run wrote holds the worker's disk until then."""

    def __init__(
        self,
        run: Run,
        ports: AgentPorts,
        docker_client: docker.DockerClient,
        config: ExecutorConfig,
        clock: Clock,
        on_done: Callable[[RunExecutor], None] = lambda _: None,
        allocation: Allocation | None = None,
        inputs: InputCache | None = None,
        images: ImageCache | None = None,
        network: RunNetwork | None = None,
        *,
        users: ImageUsers,
        sleep: Callable[[float], None] = time.sleep,
        on_removed: Callable[[RunExecutor], None] = lambda _: None,
    ) -> None:
        self.claimed_at = clock()
        self.ports, self.config, self.clock, self.on_done = ports, config, clock, on_done
        self.on_removed = on_removed
        self.allocation, self.network = allocation, network
        self.state = RunStateWriter(run, ports, clock, config.rates.memory or None)
        self.control = RunControl(self.state, ports.store, config.worker_id)
        # what earlier attempts used, carried on: the run's figures are of all its attempts
        self.meter = Meter(run.usage)
        self.usage = self.meter.usage
        self.box = RunContainer(
            docker_client,
            run,
            config.worker_id,
            clock,
            sleep,
            stop_seconds=config.stop_seconds,
            remove_seconds=config.remove_seconds,
            timings=self.usage.timings,
        )
        logins = RegistryLogins(RunSecrets(ports.secrets, ports.opener), config.registries, config.registry_providers)
        self.setup = RunSetup(run, config, self.box, users, clock, self.usage, images, inputs, logins)
        # the run's id names its directory (made, chowned, removed): only an id that is one
        self.valid_id = _RUN_ID.fullmatch(run.id) is not None
        self.run_dir, self.output_dir, self.home_dir = self.setup.run_dir, self.setup.output_dir, self.setup.home_dir
        self.logs = RunLogs(ports.objects, run.id, run.attempt, clock, config.log_flush_seconds, config.max_log_size)
        self.saves = RunCheckpoints(
            self.state,
            ports.objects,
            self.setup.checkpoint_dir,
            self.run_dir,
            clock,
            run.spec.resources.disk,
            held=lambda: not self.control.lease_lost.is_set() and self.state.holds_attempt(config.worker_id),
        )
        self.secret_env: dict[str, str] = {}  # the values of the run's secrets, for its container only
        self.thread: threading.Thread | None = None
        self.preempted = False  # handed back because its machine is being taken away
        self.stop_asked: float | None = None  # when this worker was told to hand its runs back

    @property
    def run(self) -> Run:
        """The run as this worker last read or wrote it."""
        return self.state.run

    @property
    def container(self) -> Any:
        """The run's container on the engine, once made (None before)."""
        return self.box.container

    run_as = property(lambda self: self.setup.run_as, doc="who the run's command runs as")

    # -- control from other threads -------------------------------------------------------

    def observe(self, run: Run) -> None:
        """Take in a fresher copy of the stored run (from a heartbeat or a poll)."""
        self.control.observe(run)

    def lease_lost(self) -> None:
        self.control.lease_lost.set()

    def stop_and_requeue(self, preempted: bool = False, leaves_at: float | None = None) -> None:
        """Pass-down termination: stop the container and hand the run back to its queue (``preempted``:
        its machine is being taken away, which counts towards the run's ``fallback_after_preemptions``;
        ``leaves_at``: when it goes, in seconds since the epoch, if the notice says: the stop ends before)."""
        self.preempted = self.preempted or preempted
        if self.stop_asked is None:
            self.stop_asked = self.clock()
        self.control.stop_by = earlier(self.control.stop_by, stop_by(leaves_at, self.clock()))
        self.control.requeue.set()

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
            self._leave()

    def _leave(self) -> None:
        """Release its inputs, then give the slot back and clean up: the slot first when nothing of
        the run runs any more (the next run starts while its container goes), else last, once its
        container is removed by force; ``on_removed`` last of all, when its files are gone. A step
        that fails does not stop the others."""
        steps = [self.setup.release, lambda: self.on_done(self), self._cleanup]
        if not self.box.quiet:
            steps[1:] = steps[:0:-1]
        steps.append(lambda: self.on_removed(self))
        for step in steps:
            try:
                step()
            except Exception:  # the slot must come back whatever cleaning up met
                log.exception("run %s: error while leaving it", self.run.id)

    def execute(self) -> None:
        run = self.run
        if not self.valid_id:  # refused before anything on this host is made or touched
            self._final(
                Outcome(RunState.FAILED, FailureReason.AGENT_ERROR, f"run id {run.id[:80]!r} is not a valid run id")
            )
            return
        # the run's secrets first, read by this worker now that it holds the run (every attempt
        # reads them afresh): a run that cannot have them ends before its image is pulled; one whose
        # store or key failed for now (also for its image's login) goes back to its queue
        try:
            self.secret_env, outcome = RunSecrets(self.ports.secrets, self.ports.opener).for_container(run)
            self.logs.mask(self.secret_env.values())
            outcome = outcome or self.setup.prepare()
        except SecretsUnreachable as e:
            self._hand_back(f"{e} on worker {self.config.worker_id}; it will be tried again")
            return
        if outcome is None and self.clock() - self.claimed_at >= self.config.kill_poll_seconds:
            outcome = self._check_control()  # preparing took a while: was a kill asked for meanwhile?
        if outcome is None and self.setup.checkpoints:
            try:
                outcome = self.saves.restore((self.run_as.uid, self.run_as.gid))
            except CheckpointUnreachable as e:  # the store or this worker, for now: another attempt, not a failure
                self._hand_back(f"{e} on worker {self.config.worker_id}; it will be tried again")
                return
        outcome = outcome or self._start_container(run)
        if outcome is not None:
            self._final(outcome)
            return
        started = self.clock()
        # a LeaseLost here leaves through run_safely, whose cleanup removes the started container
        self.state.running(started, f"container started on worker {self.config.worker_id}")
        given = Input(self.clock)  # an interactive run's input, from its start
        sessions = self._sessions(given)
        idle = given.idle if run.spec.interactive else lambda: None
        rule = run.spec.checkpoint
        # a stop's grace and final sync fit in the agent's stop budget together: the grace has a share of it
        grace = None if rule is None else min(rule.stop_grace, self.config.stop_budget_seconds * GRACE_SHARE)
        warn = (rule.stop_signal, grace) if rule is not None and grace is not None else None
        watch = Watch(
            self.box, self.logs, self.meter, self.control, self.config, self.clock, self._check_disk, idle, warn
        )
        live = LiveOutputs(
            self.ports.objects,
            self.output_dir / LIVE_DIR,
            f"{outputs_prefix(run.id, run.attempt)}{LIVE_DIR}/",
            self.clock,
            self.config.live,
            f"live-{run.id}",
        )
        live.start()
        if self.setup.checkpoints:
            self.saves.start()
        try:
            outcome, synced = self._pieces(watch, started)
        finally:  # the container has exited: the final upload writes these keys again, last
            if sessions is not None:  # each told run_ended, ended and written before the run's end
                sessions.stop()
            given.release()  # the command's stdin, held from its first attach
            live.stop(self.config.upload_deadline_seconds)
            self.saves.stop()
        ran = self.usage.timings["run"] = round(self.clock() - started, 3)
        self.meter.charge(self.run.spec.resources, self.config.rates, ran)
        if self.control.lease_lost.is_set():
            raise LeaseLost(f"run {run.id} attempt {run.attempt} was taken away")
        over = None
        if self.setup.checkpoints and outcome.upload and not synced:  # before a hand-back and the outputs
            over = self._sync(self._final_sync_seconds())
        if over is not None:  # no checkpoint written: the run ends here, handed back or not
            self._final(over)
            return
        failed = ""  # the final sync's failure, or the last one's before it
        if self.saves.failed is not None:
            failed = f"; its last checkpoint sync failed (the one before stays its newest): {self.saves.failed}"
        outcome.message += failed
        if self.control.requeue.is_set() and outcome.state != RunState.SUCCEEDED and outcome.reason not in limits.FINAL:
            self.logs.flush()
            self.state.requeue(f"worker terminated{failed}", self.usage, preempted=self.preempted)
            return
        if not outcome.upload:  # over a limit, or the container may still run: nothing is read
            outcome.message += _passed_over(live) + "; outputs not uploaded"
            self._final(outcome)
            return
        live.drop_removed()
        outcome = self._upload(outcome, live)
        live.finish(self.config.upload_deadline_seconds)  # a live upload that outlived stop() is not left last
        self._final(outcome)

    def _pieces(self, watch: Watch, started: float) -> tuple[Outcome, bool]:
        """Watch the run's container until it ends, and while its command exits with its checkpoint
        rule's ``exit_code`` (not stopped meanwhile): sync its checkpoint, count the piece and start
        the next container, in this attempt, with the run's whole time limit; past ``max_pieces`` the
        run fails. How it ended, and whether its checkpoint was synced since."""
        rule = self.run.spec.checkpoint
        attempt_started = started
        short = 0  # short pieces in a row
        while True:
            outcome = watch(started, attempt_started)
            code = None if rule is None else rule.exit_code
            if code is None or outcome.exit_code != code or outcome.reason != FailureReason.NONZERO_EXIT:
                return outcome, False
            if self.control.stopping():
                return outcome, False
            over = self._sync(self.config.upload_deadline_seconds)
            if over is not None:
                return over, True
            pieces = self.run.pieces + 1
            if rule is not None and pieces >= rule.piece_limit:
                outcome.message = (
                    f"command exited with code {code} to be started again, but the run has gone in its "
                    f"max_pieces, {rule.piece_limit} pieces"
                )
                return outcome, True
            short = short + 1 if self.clock() - started < self.config.short_piece_seconds else 0
            after = f" after a {self.config.piece_pause(short):g} s pause (a short piece)" if short else ""
            self.state.piece_ended(
                pieces, f"piece {pieces} ended with exit code {code}; piece {pieces + 1} starts{after}"
            )
            if short and self.control.pause(self.config.piece_pause(short), self.config.kill_poll_seconds):
                killed = self.control.kill.is_set() and not self.control.requeue.is_set()
                return (limits.killed("killed on request", self.run.kill_reason) if killed else outcome), True
            self.box.replace(f"piece {pieces} of its run ended with exit code {code}; the next one starts")
            failed = self._start_container(self.run)
            if failed is not None:
                return failed, True
            started = self.clock()

    def _final_sync_seconds(self) -> float:
        """How long the final sync may take: ``upload_deadline_seconds``, and on a stop what is left of
        the agent's stop budget since it was told to stop, and of the time before a notice's moment."""
        config, asked = self.config, self.stop_asked
        by, now = self.control.stop_by, self.clock()
        return final_sync_seconds(config.upload_deadline_seconds, config.stop_budget_seconds, asked, by, now)

    def _sync(self, seconds: float) -> Outcome | None:
        """The final sync of the run's checkpoint, given up after ``seconds``."""
        deadline = self.clock() + seconds
        return self.saves.sync(lambda: self.clock() > deadline)

    def _sessions(self, given: Input) -> SessionHost | None:
        """The host of the run's sessions, told of the run from now on (None: none on this stack)."""
        if self.ports.sessions is None:
            return None
        host = SessionHost(
            self.ports.sessions,
            self.state,
            self.box.client.api,
            self.container,
            self.config.worker_id,
            self.clock,
            run_ending=self.control.stopping,
            given_input=given,
        )
        self.control.on_observe = host.observe
        host.observe(self.run)  # sessions asked before it was told
        return host

    def _hand_back(self, why: str) -> None:
        """Give the attempt back to the run's queue, not charged to it (its event says ``why``),
        after a short pause, unless the worker is stopping meanwhile."""
        log.warning("run %s: %s; handing it back to its queue", self.run.id, why)
        self.control.requeue.wait(HAND_BACK_PAUSE_SECONDS)
        self.logs.flush()
        self.state.requeue(why, self.usage)

    def _start_container(self, run: Run) -> Outcome | None:
        """Create the container (by the image id inspected, whose users were read, not the tag,
        which may move meanwhile), start it and, for a run with a network, close that off and let
        its command start; an Outcome if the run ends here."""
        setup = self.setup
        spec = container_spec(
            run,
            str(self.box.image.id),
            self.config,
            self.output_dir.resolve(),
            self.allocation,
            setup.mounts,
            setup.run_as,
            self.home_dir.resolve() if setup.own_home else None,
            inputs_on_safe_mount=all(on_read_only_safe_mount(p) for p in setup.mounts.values()),
            image_env=image_environment(self.box.image.attrs),
            volumes={path: d.resolve() for path, d in setup.volumes.items()},
            secrets=self.secret_env,
            checkpoint_dir=self.setup.checkpoint_dir.resolve() if setup.checkpoints else None,
        )
        if run.spec.network:  # hook: the agent's run network, the command behind a gate (network.py)
            if self.network is None:
                raise RuntimeError("this worker has no contained network for runs")
            self.network.prepare(spec, self.run_dir)
        held = partial(self.state.holds_attempt, self.config.worker_id)
        outcome = self.box.create(spec, held, self.allocation) or self.box.start(self.allocation)
        if outcome is None and run.spec.network:
            outcome = self._open_network()
            if outcome is not None:
                self.box.kill()
        return outcome

    def _open_network(self) -> Outcome | None:
        """Install the run's network rules, then let its command start (see network.py)."""
        t0 = self.clock()
        try:
            if self.network is None:
                raise NetworkError("this worker has no contained network for runs")
            self.network.release(self.container, self.run_dir, self.control.stopping)
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
        """Poll the store for a kill or a lost lease before the container starts (raises LeaseLost)."""
        self.control.poll()
        if self.control.kill.is_set():
            return limits.killed("killed on request before the container started", self.run.kill_reason)
        return None

    def _check_disk(self, cancelled: Callable[[], bool] | None = None) -> Outcome | None:
        home = self.home_dir if self.setup.own_home else None
        volumes = self.setup.volumes_dir if self.setup.volumes else None
        if self.saves.over is not None:  # its checkpoint found over the disk limit by a sync
            return self.saves.over
        return check_disk(
            self.output_dir,
            home,
            self.box.layer_size,
            Limits.of(self.run, self.config),
            self.usage,
            cancelled,
            volumes_dir=volumes,
            inputs=self.setup.input_bytes,
            checkpoint_dir=self.setup.checkpoint_dir if self.setup.checkpoints else None,
        )

    def _upload(self, outcome: Outcome, live: LiveOutputs) -> Outcome:
        run = self.run
        self.state.uploading(f"uploading outputs ({outcome.state})")
        t_up = self.clock()
        report = upload_dir(
            self.ports.objects,
            self.output_dir,
            outputs_prefix(run.id, run.attempt),
            self.config.upload_deadline_seconds,
        )
        self.usage.timings["upload"] = round(self.clock() - t_up, 3)
        named = report.skipped[:5]
        outcome.message += _passed_over(live, named)  # each thing said once: what the end names, there
        if report.skipped:
            outcome.message += f" (not uploaded: {', '.join(named)})"
        if report.error:
            if outcome.state == RunState.SUCCEEDED:
                outcome = Outcome(RunState.FAILED, FailureReason.UPLOAD_FAILED, report.error, outcome.exit_code)
            else:
                outcome.message += f"; {report.error}"
        return outcome

    def _final(self, outcome: Outcome) -> None:
        self.saves.finish()  # its series pruned of what a sync cut at its end left, while this worker holds it
        self.logs.flush()
        self.state.finish(outcome, self.usage)

    def _cleanup(self) -> None:
        """Remove the run's container and directory; what is left, a later start here removes."""
        self.box.remove(f"its attempt is over on this worker (the run as last read here: {self.run.state})")
        if self.valid_id:
            left = remove_tree(self.run_dir)
            if left is not None:
                log.warning("run %s: could not remove all of its directory: %s", self.run.id, left)


def _passed_over(live: LiveOutputs, said: list[str] | None = None) -> str:
    """What the scans passed over while the run went, for its final message, less what the final
    upload names as not uploaded (``said``): a fifo is named once, where it is said last."""
    if not live.notices:
        return ""
    left = live.summary(without=frozenset(said or ()))
    return f" (not uploaded while it ran: {left})" if left else ""
