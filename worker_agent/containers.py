"""The Docker engine as one run uses it: its image, and its container from create to removal.

The executor makes no Docker call of its own: every call a run makes is here, but for those of
its network (network.py) and of its image's accounts (users.py). Every engine error is
translated, into an ``Outcome`` where the run ends of it, else into a log line.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from runplane.domain.errors import LeaseLost
from runplane.domain.runs import Run
from runplane.domain.secrets import SecretUnavailable
from runplane.domain.states import FailureReason, RunState
from runplane.domain.units import format_duration
from worker_agent import images
from worker_agent.cgroup_signal import signal_cgroup, signal_number
from worker_agent.container_spec import LABEL, container_labels
from worker_agent.outcome import Outcome
from worker_agent.registries import Login, LoginUnavailable, hub_denied, rate_limited, refused, registry_of
from worker_agent.resources import Allocation
from worker_agent.usage import Sample, Tree, from_stats, read_cgroup, walk

log = logging.getLogger(__name__)

ENGINE_FILE_ALLOWANCE = 64 * 1024
"""What the engine itself writes in each of the files it binds into a container (a few hundred
bytes: localhost, the container's address, the host's resolver) is not counted as the run's:
the first this many bytes of each."""

ENGINE_FILES = (("HostsPath", "/etc/hosts"), ("HostnamePath", "/etc/hostname"), ("ResolvConfPath", "/etc/resolv.conf"))
"""The files the engine binds into a container writable: where the engine's inspection names
each on the host, and its path in the container."""


class RunContainer:
    """Attempt ``run.attempt`` of ``run`` on the engine of ``client``: ``image`` once
    ``ensure_image`` found it, ``container`` once ``create`` made it (None before), ``stream`` its
    attached output. A container that is killed gets ``stop_seconds`` to exit; removing it may
    take ``remove_seconds``."""

    def __init__(
        self,
        client: docker.DockerClient,
        run: Run,
        worker_id: str,
        clock: Callable[[], float],
        sleep: Callable[[float], None] = time.sleep,
        *,
        stop_seconds: float = 30.0,
        remove_seconds: float = 600.0,
        timings: dict[str, float] | None = None,
    ) -> None:
        self.client = client
        self.run_id, self.attempt, self.worker_id = run.id, run.attempt, worker_id
        self.clock, self.sleep = clock, sleep
        self.stop_seconds, self.remove_seconds = stop_seconds, remove_seconds
        self.image: Any = None
        self.container: Any = None
        self.stream: Any = None
        self.started = False
        self.exited = False
        self.public = False  # the image was had with no login at all (ensure_image)
        self.timings = {} if timings is None else timings  # seconds its create and start took
        self._engine_paths: list[tuple[str, str]] | None = None  # (on the host, in the container)

    def ensure_image(
        self,
        image: str,
        pull: str,
        max_bytes: int | None = None,
        login: Callable[[], Login | None] | None = None,
        cache: images.ImageCache | None = None,
    ) -> Outcome | None:
        """Find ``image`` on this engine, else pull it (unless ``pull`` is ``never``) with the run's
        ``login`` (registries.py; asked only when the registry is); one larger than ``max_bytes``
        (the pool's ``max_image_size``) is refused (images.py). An image here that came from a
        registry (it has RepoDigests) is used only once its registry, asked with the run's own
        login, names its digest (``_checked``): a run never starts an image another run's login
        pulled without its own check. Unless the image ``cache`` remembers that this worker got
        that image (by id) with no login at all: anyone may have it, and it is used as it is, so
        that a registry that is down or limits its anonymous pulls (Docker Hub's) fails no run of
        a public image already here. The image a run gets is recorded in ``cache`` (by id, for
        pruning; with whether it was had with no login at all, ``self.public``).

        An agent that never pulls (``pull`` ``never``) uses what it has, unchecked: on an engine it
        shares with agents that pull, its runs may use images those pulled with their logins."""
        self.public = False
        try:
            found: Any = self.client.images.get(image)
        except docker.errors.ImageNotFound:
            found = None
        except docker.errors.APIError as e:
            return Outcome(
                RunState.FAILED, FailureReason.IMAGE_NOT_FOUND, f"cannot inspect image {image}: {explain(e)}"
            )
        if found is not None and (pull == "never" or not found.attrs.get("RepoDigests")):
            self.image = found  # built or imported here, or an agent that never pulls: as it is
            return self._used(cache, self._refuse_too_large(image, max_bytes, pulled=False))
        if found is not None and cache is not None and cache.public(found.id):
            self.image, self.public = found, True  # this worker had it with no login: anyone may
            return self._used(cache, self._refuse_too_large(image, max_bytes, pulled=False))
        if pull == "never":
            return Outcome(
                RunState.FAILED,
                FailureReason.IMAGE_NOT_FOUND,
                f"image {image} is not on this worker and pulling is off",
            )
        try:
            who = login() if login is not None else None
        except SecretUnavailable as e:
            return Outcome(RunState.FAILED, FailureReason.SECRET_UNAVAILABLE, str(e))
        except LoginUnavailable as e:
            return Outcome(RunState.FAILED, FailureReason.IMAGE_UNAUTHORIZED, f"image {image}: {e}")
        if found is not None:
            outcome = self._checked(image, who, max_bytes)
        else:
            outcome = self._pulled(image, image, who, max_bytes)
        self.public = outcome is None and who is None and images.anonymous(self.client, image)
        return self._used(cache, outcome)

    def _used(self, cache: images.ImageCache | None, outcome: Outcome | None) -> Outcome | None:
        """Record the run's image in ``cache`` unless the run ends of ``outcome``; a record that
        cannot be written is logged (bookkeeping for pruning, never a reason to fail the run)."""
        if outcome is None and cache is not None:
            try:
                cache.used(self.image.id, self.public)
            except OSError as e:
                log.warning("run %s: could not record image use: %s", self.run_id, e)
        return outcome

    def _checked(self, image: str, who: Login | None, max_bytes: int | None) -> Outcome | None:
        """``image`` is here from a registry: ask the registry for its digest with ``who``, then
        use the image here that holds that digest (by its id: a tag moved meanwhile swaps
        nothing), pulling ``repository@digest`` first if none does. A registry that cannot be
        reached fails the run ``image_not_found`` (as a pull it cannot reach does): using the
        image unchecked would let a run without access start a private image."""
        try:
            digest = images.registry_digest(self.client, image, who.auth_config() if who else None)
        except (docker.errors.APIError, requests.RequestException) as e:
            return pull_failure(image, who, e, "is on this worker but its registry did not confirm access to it")
        pinned = images.by_digest(image, digest)
        try:
            self.image = self.client.images.get(pinned)
        except docker.errors.ImageNotFound:
            return self._pulled(image, pinned, who, max_bytes)
        except docker.errors.APIError as e:
            return Outcome(
                RunState.FAILED, FailureReason.IMAGE_NOT_FOUND, f"cannot inspect image {pinned}: {explain(e)}"
            )
        return self._refuse_too_large(image, max_bytes, pulled=False)

    def _pulled(self, image: str, name: str, who: Login | None, max_bytes: int | None) -> Outcome | None:
        """Pull ``name`` (``image``, or the digest of it the registry named) with ``who``."""
        try:
            self.image = images.pull(self.client, name, max_bytes, who.auth_config() if who else None)
            return self._refuse_too_large(name, max_bytes, pulled=True)
        except images.ImageTooLarge as e:
            return Outcome(RunState.FAILED, FailureReason.IMAGE_TOO_LARGE, str(e))
        except (docker.errors.APIError, requests.RequestException) as e:
            return pull_failure(image, who, e, "is not on this worker and could not be pulled")

    def _refuse_too_large(self, image: str, max_bytes: int | None, pulled: bool) -> Outcome | None:
        why = images.too_large(self.client, image, self.image, max_bytes, pulled)
        if why is None:
            return None
        self.image = None
        return Outcome(RunState.FAILED, FailureReason.IMAGE_TOO_LARGE, why)

    def create(self, spec: dict[str, Any], held: Callable[[], bool], allocation: Allocation | None) -> Outcome | None:
        """Create the container of ``spec`` and attach to its output before it starts: every byte,
        straight from the container, whatever Docker's own (capped, rotated) log file keeps. A
        name already taken is taken back when ``held()`` (the store, read now, says this worker
        holds the attempt); else this raises LeaseLost and the namesake stays."""
        t0 = self.clock()
        try:
            self.container = self._create(spec, held)
            self.stream = self.container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=True)
        except docker.errors.APIError as e:
            return create_failure(e, allocation)
        self.timings["create"] = round(self.clock() - t0, 3)
        return None

    def start(self, allocation: Allocation | None) -> Outcome | None:
        t0 = self.clock()
        self.started = True  # asked: a start whose answer is lost may have started it all the same
        try:
            self.container.start()
        except docker.errors.APIError as e:
            self.started = False  # refused by the engine: it never ran
            self.stream.close()
            return create_failure(e, allocation, "start")
        self.timings["start"] = round(self.clock() - t0, 3)
        return None

    @property
    def quiet(self) -> bool:
        """Nothing of the run runs any more: no container, one whose start the engine refused (or
        never asked), or one seen exited (or gone). One that may still run is not quiet."""
        return self.container is None or not self.started or self.exited

    def waiter(self) -> tuple[threading.Event, dict[str, Any]]:
        """Wait for the container to exit on a thread of its own: the event is set once it has,
        and the dict holds the engine's answer (``StatusCode``), or ``Error`` when the wait failed."""
        exited = threading.Event()
        result: dict[str, Any] = {}

        def wait() -> None:
            try:
                result.update(self.container.wait())
            except (docker.errors.APIError, requests.RequestException) as e:
                result["Error"] = str(e)
            exited.set()

        threading.Thread(target=wait, daemon=True).start()
        return exited, result

    def kill(self, signal: str | None = None) -> None:
        """Kill the container, or send ``signal`` to every process in it (its cgroup's, from the
        host: a child of the command's shell hears it too), else, where this agent cannot see its
        cgroup, to its first process (the engine's kill); a kill that fails is logged
        (``exited_state`` sees what came of it)."""
        signo = None if signal is None else signal_number(signal)
        if signo is not None and signal_cgroup(self.container.id, signo):
            return
        try:
            self.container.kill(signal=signal)
        except docker.errors.APIError as e:
            if "is not running" not in str(e):
                log.warning("run %s: kill failed: %s", self.run_id, e)
        except requests.RequestException as e:
            log.warning("run %s: kill failed: %s", self.run_id, e)

    def exited_state(self, exited: threading.Event) -> tuple[dict[str, Any] | None, str | None]:
        """The container's state once it has exited (None: it is gone from the engine), or why it
        cannot be said to have exited: it still runs ``stop_seconds`` after being killed (once
        more), or its state cannot be read. A wait that failed, a kill that failed or a process
        that ignores SIGKILL (uninterruptible sleep) all end here, never in an upload."""
        deadline = self.clock() + self.stop_seconds
        killed = False
        while True:
            try:
                self.container.reload()
            except docker.errors.NotFound:
                self.exited = True
                return None, None
            except (docker.errors.APIError, requests.RequestException) as e:
                why = f"its state cannot be read: {explain(e)}"
            else:
                state: dict[str, Any] = self.container.attrs.get("State") or {}
                if state.get("Running") is False and not state.get("Restarting"):
                    self.exited = True
                    return state, None
                why = f"it is still {state.get('Status') or 'running'}"
            if self.clock() >= deadline:
                return None, why
            if not killed:
                killed = True
                log.warning("run %s: the container has not exited (%s): killing it", self.run_id, why)
                self.kill()
            if exited.is_set():  # the wait ended (or failed) before: look again in a while
                self.sleep(0.2)
            else:
                exited.wait(0.2)

    def sample(self) -> Sample | None:
        """Its cpu time and peak memory: from its cgroup when this agent sees it, else the engine's stats."""
        sample = read_cgroup(self.container.id)
        if sample is None:
            try:
                sample = from_stats(self.container.stats(stream=False, one_shot=True))
            except (docker.errors.APIError, requests.RequestException):
                sample = None
        return sample

    def layer_size(self, most: int | None, entries: int | None, cancelled: Callable[[], bool] | None) -> Tree:
        """The container's writable layer: its overlay upper directory walked from here when this
        agent can see it (as cheap as Docker's own count, and it stops early), else the
        ``SizeRw`` the engine counts (which has no count of files); and the engine's files bound
        into it beyond what the engine writes there (``engine_files``)."""
        layer = self._layer(most, entries, cancelled)
        files = self.engine_files()
        return Tree(layer.size + files.size, layer.entries + files.entries, layer.stopped, layer.unreadable)

    def engine_files(self) -> Tree:
        """The files the engine binds into the container writable, its ``/etc/hosts``,
        ``/etc/hostname`` and ``/etc/resolv.conf``: kept in the engine's own directory of the
        container, outside its layer, and root in the container can write them (a run that is
        not root cannot: they are root's, 0644). What each holds past ``ENGINE_FILE_ALLOWANCE``
        counts as the run's. Sized where this agent sees them, else (an agent in a container of
        its own, which sees the engine's socket but not its directories) as the engine sizes them
        in the container; their paths are known once the container has started."""
        if self._engine_paths is None:
            try:
                attrs = self.client.api.inspect_container(self.container.id)
            except (docker.errors.APIError, requests.RequestException):
                return Tree()  # asked again at the next check
            paths = [(str(attrs.get(key) or ""), inside) for key, inside in ENGINE_FILES]
            if not all(host for host, _ in paths):
                return Tree()  # not started yet
            self._engine_paths = paths
        files = Tree()
        for host, inside in self._engine_paths:
            try:
                size = Path(host).stat().st_size
            except OSError:
                size = self._size_inside(inside)
            files.size += max(size - ENGINE_FILE_ALLOWANCE, 0)
        return files

    def _size_inside(self, path: str) -> int:
        """The size of the file at ``path`` in the container, as the engine's archive API states
        it (a HEAD request: the stat alone, no content); 0 when the engine does not say."""
        api = self.client.api
        try:
            response = api.head(
                api._url("/containers/{0}/archive", self.container.id), params={"path": path}, timeout=api.timeout
            )
            try:
                api._raise_for_status(response)
                stat = response.headers.get("X-Docker-Container-Path-Stat")
            finally:
                response.close()
            return int(docker.utils.decode_json_header(stat).get("size") or 0) if stat else 0
        except (docker.errors.APIError, requests.RequestException, ValueError) as e:
            log.debug("run %s: cannot size %s in its container: %s", self.run_id, path, e)
            return 0

    def _layer(self, most: int | None, entries: int | None, cancelled: Callable[[], bool] | None) -> Tree:
        data = (self.container.attrs.get("GraphDriver") or {}).get("Data") or {}
        upper = data.get("UpperDir")
        if upper and Path(upper).is_dir():
            return walk(upper, most, entries, cancelled)
        try:
            found = self.client.api.containers(all=True, filters={"id": self.container.id}, size=True)
        except (docker.errors.APIError, requests.RequestException) as e:
            log.warning("run %s: cannot size the container's file system: %s", self.run_id, e)
            return Tree()
        return Tree(size=int((found[0] if found else {}).get("SizeRw") or 0))

    def remove(self, why: str) -> None:
        """Close the output stream and remove the container, if there is one; what is left is logged."""
        if self.stream is not None:
            with contextlib.suppress(OSError, requests.RequestException):
                self.stream.close()
        if self.container is not None:
            left = remove_container(self.container, self.remove_seconds, self.clock, self.sleep, why=why)
            if left is not None:
                log.warning("run %s: could not remove its container: %s", self.run_id, left)

    def replace(self, why: str) -> None:
        """Remove the exited container (``remove``) so that the attempt's next one can be made with its
        name (a run that goes in pieces: ``create`` and ``start`` again)."""
        self.remove(why)
        self.container = self.stream = None
        self.started = self.exited = False
        self._engine_paths = None

    def _create(self, spec: dict[str, Any], held: Callable[[], bool]) -> Any:
        try:
            return self.client.containers.create(**spec)
        except docker.errors.APIError as e:
            if e.status_code != 409:
                raise
        self._take_name_back(spec["name"], held)
        return self.client.containers.create(**spec)

    def _take_name_back(self, name: str, held: Callable[[], bool]) -> None:
        """The name of this attempt's container is taken: by a container of this attempt that
        another worker made (a store that let two claims of one attempt through) or an earlier
        life of this worker left. It is removed only if the store says this worker holds the
        attempt (then its maker does not: one worker holds an attempt); otherwise the run is
        given up (LeaseLost) and the container, perhaps that of the worker holding the run, stays."""
        try:
            namesake = self.client.containers.get(name)
        except docker.errors.NotFound:
            return  # gone meanwhile
        if not held():
            maker = container_labels(namesake).get(f"{LABEL}.worker_id")
            raise LeaseLost(
                f"run {self.run_id} attempt {self.attempt} is not held by this worker (a container of worker "
                f"{maker} has its name)"
            )
        why = f"worker {self.worker_id} holds attempt {self.attempt} of its run and needs its name"
        left = remove_container(namesake, self.remove_seconds, self.clock, self.sleep, why=why)
        if left is not None:
            log.warning("run %s: could not remove container %s: %s", self.run_id, namesake.id, left)


def remove_container(
    container: Any,
    seconds: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None] = time.sleep,
    *,
    why: str = "the agent is done with it",
) -> str | None:
    """Remove ``container`` (killed first if it runs) with its anonymous volumes (those of its
    image's ``VOLUME`` paths), taking up to ``seconds``: a request that
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
            container.remove(force=True, v=True)
            return None
        except docker.errors.NotFound:
            return None
        except (docker.errors.APIError, requests.RequestException) as e:
            if clock() >= deadline:
                return f"not removed within {format_duration(seconds)}: {explain(e)}"
        sleep(min(0.5, max(deadline - clock(), 0.0)))


def pull_failure(image: str, who: Login | None, error: Exception, what: str) -> Outcome:
    """``image_unauthorized``, naming the registry and the login, when the registry refused;
    else ``image_not_found`` (no such image, a registry that cannot be reached, or one that limits
    how often it is asked: a passing failure, said as such)."""
    server = registry_of(image)
    if rate_limited(error):
        return Outcome(
            RunState.FAILED,
            FailureReason.IMAGE_NOT_FOUND,
            f"registry {server} is limiting how often it is asked (a passing failure: a later try, or a "
            f"login, may get image {image}): {explain(error)}",
        )
    if not refused(error):
        return Outcome(RunState.FAILED, FailureReason.IMAGE_NOT_FOUND, f"image {image} {what}: {explain(error)}")
    if who is None and hub_denied(error):
        message = f"image {image} does not exist on registry {server}, or needs a login (give image_pull_secret)"
    elif who is None:
        message = f"registry {server} needs a login for image {image}: give image_pull_secret"
    elif hub_denied(error):
        message = f"image {image} does not exist on registry {server}, or {who.source} may not pull it"
    else:
        message = f"registry {server} refused the credentials of {who.source} for image {image}"
    return Outcome(RunState.FAILED, FailureReason.IMAGE_UNAUTHORIZED, f"{message} ({explain(error)})")


def create_failure(e: docker.errors.APIError, allocation: Allocation | None, verb: str = "create") -> Outcome:
    text = explain(e)
    if allocation is not None and allocation.gpus and ("device driver" in text or "nvidia" in text.lower()):
        ids = ",".join(g.uuid for g in allocation.gpus)
        return Outcome(
            RunState.FAILED,
            FailureReason.GPU_UNAVAILABLE,
            f"GPUs {ids} could not be given to the container: this worker's Docker engine has no "
            f"working NVIDIA runtime ({text})",
        )
    return Outcome(RunState.FAILED, FailureReason.CONTAINER_ERROR, f"cannot {verb} container: {text}")


def explain(e: Exception) -> str:
    """What an engine error says, in its own words."""
    if isinstance(e, docker.errors.APIError):
        return str(e.explanation or e)
    return str(e)
