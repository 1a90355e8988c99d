"""What a run needs before its container is made: its image, who runs it, its directories and
its inputs."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import docker.errors
import requests

from runplane.domain.runs import Run, Usage
from runplane.domain.states import FailureReason, RunState
from worker_agent.container_spec import MAX_IMAGE_VOLUMES, image_volumes
from worker_agent.containers import RunContainer, explain
from worker_agent.images import ImageCache
from worker_agent.inputs import InputCache, InputUnavailable
from worker_agent.outcome import Outcome
from worker_agent.registries import RegistryLogins
from worker_agent.run_config import ExecutorConfig
from worker_agent.users import DEFAULT_RUN_AS, ImageUsers, UnknownUser

log = logging.getLogger(__name__)


class RunSetup:
    """Makes one claimed run ready on this worker: ``prepare`` gets its image (through ``box``,
    with the login ``logins`` gives the run), reads who runs it from the image's own account files
    (``users``, the agent's), makes its directories and fetches its inputs from the agent's
    ``inputs`` cache; ``release`` lets the inputs go again. ``run_as``, ``mounts`` and the
    directories are what its container is made of. The time each step took goes into
    ``usage.timings`` (``pull``, ``inputs``)."""

    def __init__(
        self,
        run: Run,
        config: ExecutorConfig,
        box: RunContainer,
        users: ImageUsers,
        clock: Callable[[], float],
        usage: Usage,
        images: ImageCache | None = None,
        inputs: InputCache | None = None,
        logins: RegistryLogins | None = None,
    ) -> None:
        self.run = run
        self.logins = logins
        self.config = config
        self.box = box
        self.users = users
        self.clock = clock
        self.usage = usage
        self.images = images
        self.inputs = inputs
        self.run_as = DEFAULT_RUN_AS
        self.mounts: dict[str, Path] = {}
        self.volumes: dict[str, Path] = {}
        """Each ``VOLUME`` path of the image, to its directory under ``volumes_dir``."""
        self.input_keys: list[str] = []
        self.input_bytes = 0  # what its inputs hold, counted against its disk
        self.run_dir = config.work_dir / "runs" / f"{run.id}-{run.attempt}"
        self.output_dir = self.run_dir / "output"
        self.home_dir = self.run_dir / "home"
        self.volumes_dir = self.run_dir / "volumes"
        self.checkpoint_dir = self.run_dir / "checkpoint"
        """Its checkpoint directory (``checkpoints``), when it has one: restored before it starts, synced while
        it runs, mounted at ``CHECKPOINT_DIR``."""

    @property
    def own_home(self) -> bool:
        """The run gets a home directory of its own (its image's is not writable for its user,
        and it sets no HOME itself)."""
        return self.run_as.home is not None and "HOME" not in self.run.spec.env

    @property
    def checkpoints(self) -> bool:
        """The run has a checkpoint directory: it checkpoints, or starts from another run's checkpoint."""
        spec = self.run.spec
        return spec.checkpoint is not None or spec.from_checkpoint is not None or self.run.restore_from is not None

    def prepare(self) -> Outcome | None:
        """The image, who runs it, the run's directories and its inputs; an Outcome if the run
        ends here."""
        image = self.run.spec.image or ""
        t0 = self.clock()
        login = partial(self.logins.for_run, self.run, image) if self.logins is not None else None
        outcome = self.box.ensure_image(image, self.config.pull, self.config.max_image_size, login, self.images)
        if outcome is None:
            outcome = self._resolve_user()
        self.usage.timings["pull"] = round(self.clock() - t0, 3)
        if outcome is None:
            outcome = self._make_dirs()
        if outcome is None:
            outcome = self._fetch_inputs()
        return outcome

    def release(self) -> None:
        """Let go of the run's inputs; one that cannot be released is logged."""
        for key in self.input_keys:
            if self.inputs is not None:
                try:
                    self.inputs.release(key, self._user)
                except OSError as e:
                    log.warning("run %s: could not release input %s: %s", self.run.id, key, e)

    def _resolve_user(self) -> Outcome | None:
        """Who the command runs as, from the image's own account files (users.py)."""
        image = self.run.spec.image
        try:
            self.run_as = self.users.run_as(self.box.image, self.config.run_user, self.config.allow_root)
        except UnknownUser as e:
            return Outcome(RunState.FAILED, FailureReason.CONTAINER_ERROR, f"image {image}: {e.message}")
        except (docker.errors.APIError, requests.RequestException) as e:
            return Outcome(
                RunState.FAILED, FailureReason.CONTAINER_ERROR, f"cannot read the users of image {image}: {explain(e)}"
            )
        return None

    def _make_dirs(self) -> Outcome | None:
        """The run's directories: 0700 and the run's uid's, in a 0700 ``runs`` directory."""
        uid, gid = self.run_as.uid, self.run_as.gid
        dirs = [self.run_dir, self.output_dir] + ([self.home_dir] if self.own_home else [])
        dirs += [self.checkpoint_dir] if self.checkpoints else []
        try:
            self.run_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for path in dirs:
                path.mkdir(mode=0o700, exist_ok=True)
                os.chown(path, uid, gid)
                path.chmod(0o700)
            return self._make_volume_dirs()
        except PermissionError as e:
            return Outcome(
                RunState.FAILED,
                FailureReason.AGENT_ERROR,
                f"cannot give the run's directory to uid {uid}: the agent runs as uid {os.geteuid()} and must be "
                f"root to run commands as another user (or use --run-user {os.geteuid()}:{os.getegid()}): {e}",
            )
        return None

    def _make_volume_dirs(self) -> Outcome | None:
        """A directory in the run directory for each ``VOLUME`` path of its image, named by its
        place in the list (never by the path, which the image's maker chose): ``volumes_dir``,
        the agent's, 0700, and in it one 0755 directory each, as Docker makes a volume's, which
        the engine gives the owner and mode of the image's own directory when it copies that in."""
        paths = image_volumes(self.box.image.attrs)
        if len(paths) > MAX_IMAGE_VOLUMES:
            return Outcome(
                RunState.FAILED,
                FailureReason.CONTAINER_ERROR,
                f"image {self.run.spec.image} declares {len(paths)} VOLUME paths, more than the "
                f"{MAX_IMAGE_VOLUMES} a run may have",
            )
        if paths:
            self.volumes_dir.mkdir(mode=0o700, exist_ok=True)
        for number, path in enumerate(paths):
            self.volumes[path] = self.volumes_dir / str(number)
            self.volumes[path].mkdir(exist_ok=True)
            self.volumes[path].chmod(0o755)  # whatever the umask
        return None

    def _fetch_inputs(self) -> Outcome | None:
        run = self.run
        if not run.spec.inputs:
            return None
        t0 = self.clock()
        if self.inputs is None:
            return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, "this worker has no input cache")
        disk = run.spec.resources.disk  # the inputs' bytes count against it
        name = ""
        try:
            for name, source in sorted(run.spec.inputs.items()):
                left = None if disk is None else max(disk - self.input_bytes, 0)
                groups = run.owner_groups
                fetched = self.inputs.fetch(source, self._user, owner=run.owner, groups=groups, max_bytes=left)
                self.input_keys.append(fetched.key)
                self.input_bytes += fetched.size
                self.mounts[name] = self._input_path(fetched.path)
        except InputUnavailable as e:
            return Outcome(RunState.FAILED, FailureReason.INPUT_UNAVAILABLE, f"input {name} unavailable: {e.message}")
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
