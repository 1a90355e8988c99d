"""A new worker's images: its pool's ``prefetch_images`` pulled before it takes its first run, so
that the runs that wait for it do not wait for a pull too. While it pulls, its worker item says
which image and how far (``Worker.pulling``), and so does the waiting reason of a run queued in its
pool. A pull that fails is logged and the worker goes on: a run that needs the image pulls it."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import docker
import docker.errors
import requests
from docker import auth
from docker.utils import parse_repository_tag

from runplane.domain.workers import Pulling
from worker_agent.registries import LoginUnavailable, RegistryLogins
from worker_agent.secrets import SecretsUnreachable

log = logging.getLogger(__name__)

REPORT_SECONDS = 3.0
"""The most often a pull's progress is written to the worker's item."""

STOP_CHECK_SECONDS = 0.5
"""How often a pull under way looks whether the worker is stopping, or the pull has stalled."""

STALL_SECONDS = 120.0
"""A pull the engine says nothing of for this long is given up (a registry that stopped sending)."""

LIMIT_SECONDS = 1800.0
"""The most a worker's whole prefetch may take: past it, the pull under way is given up and no other begun."""

DONE = ("Download complete", "Verifying Checksum", "Extracting", "Pull complete")
"""The statuses of a layer whose download is over (the engine streams them in this order)."""


class PullProgress:
    """How far a pull is, from the events the engine streams: per layer, the bytes announced
    (``progressDetail.total`` of its "Downloading" events) and those downloaded (``current``; all of
    them once its download is over). Layers already on the worker are not counted."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.totals: dict[str, int] = {}
        self.done: dict[str, int] = {}

    def add(self, event: Mapping[str, Any]) -> None:
        layer, status = event.get("id"), event.get("status")
        if not isinstance(layer, str) or not isinstance(status, str):
            return
        detail = event.get("progressDetail")
        detail = detail if isinstance(detail, Mapping) else {}
        if status == "Downloading":
            total, current = detail.get("total"), detail.get("current")
            if isinstance(total, int) and total > 0:
                self.totals[layer] = total
            if isinstance(current, int) and current >= 0:
                self.done[layer] = current
        elif status in DONE and layer in self.totals:
            self.done[layer] = self.totals[layer]

    def pulling(self) -> Pulling:
        done = sum(min(self.done.get(layer, 0), total) for layer, total in self.totals.items())
        return Pulling(image=self.image, done=done, total=sum(self.totals.values()))


def pull_with_progress(
    client: docker.DockerClient,
    image: str,
    on_progress: Callable[[Pulling], None],
    auth_config: Mapping[str, str] | None = None,
    every: float = REPORT_SECONDS,
    stopping: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    stall_seconds: float | None = None,
    deadline: float | None = None,
) -> bool:
    """Pull ``image``, telling ``on_progress`` how far it is at its start and then at most every
    ``every`` seconds; False: given up once ``stopping`` was set (the engine stops a pull whose
    client hangs up). Raises PullGivenUp when the engine sends nothing for ``stall_seconds`` or
    ``clock`` passes ``deadline``, docker.errors.APIError (also for an error the engine reports in
    the middle of the pull) or requests.RequestException."""
    repository, tag = parse_repository_tag(image)
    progress = PullProgress(image)
    on_progress(progress.pulling())
    last = clock()
    watch = _Watch(clock, stopping, stall_seconds, deadline)
    api = client.api  # as api.pull does it, but holding the response, to hang up on the engine
    headers = {}
    if auth_config:
        headers["X-Registry-Auth"] = auth.encode_header(dict(auth_config))
    elif header := auth.get_config_header(api, auth.resolve_repository_name(repository)[0]):
        headers["X-Registry-Auth"] = header
    params = {"fromImage": repository, "tag": tag or "latest"}
    try:  # the engine may answer nothing until the registry does: read no longer than the watch allows
        response = api._post(
            api._url("/images/create"), params=params, headers=headers, stream=True, timeout=watch.read_timeout()
        )
    except requests.RequestException:
        if watch.check():
            return watch.outcome()
        raise
    over = threading.Event()
    if watch.needed:  # a pull may go minutes without a word (a stalled layer): hang up from aside
        threading.Thread(target=_hang_up, args=(api, response, watch, over), name="prefetch-watch", daemon=True).start()
    try:
        api._raise_for_status(response)
        for event in api._stream_helper(response, decode=True):
            watch.heard()
            if event.get("error"):
                raise docker.errors.APIError(str(event["error"]))
            progress.add(event)
            if clock() - last >= every:
                on_progress(progress.pulling())
                last = clock()
    except Exception:
        if watch.given_up or watch.check():  # what reading a response closed (or timed out) meanwhile raises
            return watch.outcome()
        raise
    finally:
        over.set()
        response.close()
    return watch.outcome()


class PullGivenUp(Exception):
    """A pull given up: the engine sent nothing for too long, or the prefetch ran out of time."""


class _Watch:
    """Whether a pull under way is to be given up, and why: ``stopping`` set, nothing heard from the
    engine for ``stall_seconds``, or ``clock`` past ``deadline``."""

    def __init__(
        self,
        clock: Callable[[], float],
        stopping: threading.Event | None,
        stall_seconds: float | None,
        deadline: float | None,
    ) -> None:
        self.clock, self.stopping, self.stall_seconds, self.deadline = clock, stopping, stall_seconds, deadline
        self.needed = stopping is not None or stall_seconds is not None or deadline is not None
        self.last_heard = clock()
        self.why: str | None = None  # set once the pull is given up for other than a stop
        self.given_up = False

    def heard(self) -> None:
        self.last_heard = self.clock()

    def read_timeout(self) -> float | None:
        """The longest a read of the engine's answer may wait (None: no limit)."""
        left = None if self.deadline is None else max(self.deadline - self.clock(), STOP_CHECK_SECONDS)
        limits = [t for t in (self.stall_seconds, left) if t is not None]
        return min(limits) if limits else None

    def check(self) -> bool:
        """Whether to hang up now (and why, in ``why``, unless it is a stop)."""
        now = self.clock()
        if self.stopping is not None and self.stopping.is_set():
            self.given_up = True
        elif self.stall_seconds is not None and now - self.last_heard >= self.stall_seconds:
            self.why, self.given_up = f"the registry sent nothing for {self.stall_seconds:g}s", True
        elif self.deadline is not None and now >= self.deadline:
            self.why, self.given_up = "the prefetch ran out of time", True
        return self.given_up

    def outcome(self) -> bool:
        """True: the pull is done; False: given up on a stop. Raises PullGivenUp."""
        if self.why is not None:
            raise PullGivenUp(self.why)
        return not self.given_up and (self.stopping is None or not self.stopping.is_set())


def _hang_up(api: Any, response: Any, watch: _Watch, over: threading.Event) -> None:
    """Hang up on the engine once ``watch`` says so, unless the pull is ``over`` first: the
    connection is shut down (closing it alone does not wake the read waiting on it)."""
    while not over.wait(STOP_CHECK_SECONDS):
        if watch.check():
            with contextlib.suppress(OSError, AttributeError, docker.errors.DockerException):
                raw = api._get_raw_response_socket(response)
                getattr(raw, "_sock", raw).shutdown(socket.SHUT_RDWR)
            response.close()
            return


class Prefetch:
    """Pulls ``images`` (those not on the worker yet) one after the other, each with the pool's
    login for its registry (``logins.for_pool``; a run still checks a cached image with its own).
    A pull the engine says nothing of for ``stall_seconds`` is given up, and so is the pull under
    way once the prefetch has taken ``limit_seconds``: a worker never waits on a registry forever."""

    def __init__(
        self,
        client: docker.DockerClient,
        images: Sequence[str],
        logins: RegistryLogins | None = None,
        every: float = REPORT_SECONDS,
        stall_seconds: float = STALL_SECONDS,
        limit_seconds: float = LIMIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.images = list(images)
        self.logins = logins
        self.every = every
        self.stall_seconds = stall_seconds
        self.limit_seconds = limit_seconds
        self.clock = clock

    def first(self) -> Pulling | None:
        """What the worker pulls first (what its item says before the first pull has begun)."""
        return Pulling(image=self.images[0]) if self.images else None

    def run(self, on_progress: Callable[[Pulling | None], None], stopping: threading.Event) -> list[str]:
        """Pull each image, then tell ``on_progress`` None (nothing pulled any more); return those
        that could not be pulled (each said in the log). Once ``stopping`` is set, or the prefetch
        has taken ``limit_seconds``, the pull under way is given up and no other is begun."""
        failed = []
        deadline = self.clock() + self.limit_seconds
        try:
            for i, image in enumerate(self.images):
                if stopping.is_set():
                    break
                if self.clock() >= deadline:
                    left = self.images[i:]
                    log.warning(
                        "prefetch: its %gs are up; not pulled (a run that needs one pulls it itself): %s",
                        self.limit_seconds,
                        ", ".join(left),
                    )
                    failed.extend(left)
                    break
                if not self._pull(image, on_progress, stopping, deadline):
                    failed.append(image)
        finally:
            on_progress(None)
        return failed

    def _pull(
        self,
        image: str,
        on_progress: Callable[[Pulling | None], None],
        stopping: threading.Event,
        deadline: float | None = None,
    ) -> bool:
        try:
            self.client.images.get(image)
            log.info("prefetch: image %s is on this worker already", image)
            return True
        except docker.errors.ImageNotFound:
            pass
        except (docker.errors.DockerException, requests.RequestException) as e:
            log.warning("prefetch: cannot inspect image %s: %s", image, e)
        started = time.monotonic()
        try:
            login = self.logins.for_pool(image) if self.logins is not None else None
            config = login.auth_config() if login else None
            if not pull_with_progress(
                self.client, image, on_progress, config, self.every, stopping, self.clock, self.stall_seconds, deadline
            ):
                log.info("prefetch of image %s given up: the worker is stopping", image)
                return False
        except PullGivenUp as e:
            log.warning("prefetch of image %s given up (a run that needs it pulls it itself): %s", image, e)
            return False
        except (docker.errors.DockerException, requests.RequestException, LoginUnavailable, SecretsUnreachable) as e:
            log.warning("prefetch of image %s failed (a run that needs it pulls it itself): %s", image, e)
            return False
        log.info("prefetch: pulled image %s in %.0fs", image, time.monotonic() - started)
        return True
