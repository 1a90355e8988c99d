"""A new worker's images: its pool's ``prefetch_images`` pulled before it takes its first run, so
that the runs that wait for it do not wait for a pull too. While it pulls, its worker item says
which image and how far (``Worker.pulling``), and so does the waiting reason of a run queued in its
pool. A pull that fails is logged and the worker goes on: a run that needs the image pulls it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import docker
import docker.errors
import requests
from docker.utils import parse_repository_tag

from runplane.domain.workers import Pulling
from worker_agent.registries import LoginUnavailable, RegistryLogins

log = logging.getLogger(__name__)

REPORT_SECONDS = 3.0
"""The most often a pull's progress is written to the worker's item."""

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
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Pull ``image``, telling ``on_progress`` how far it is at its start and then at most every
    ``every`` seconds. Raises docker.errors.APIError (also for an error the engine reports in the
    middle of the pull) or requests.RequestException."""
    repository, tag = parse_repository_tag(image)
    progress = PullProgress(image)
    on_progress(progress.pulling())
    last = clock()
    events = client.api.pull(
        repository,
        tag=tag or "latest",
        stream=True,
        decode=True,
        auth_config=dict(auth_config) if auth_config else None,
    )
    for event in events:
        if event.get("error"):
            raise docker.errors.APIError(str(event["error"]))
        progress.add(event)
        if clock() - last >= every:
            on_progress(progress.pulling())
            last = clock()


class Prefetch:
    """Pulls ``images`` (those not on the worker yet) one after the other, each with the pool's
    login for its registry (``logins.for_pool``; a run still checks a cached image with its own)."""

    def __init__(
        self,
        client: docker.DockerClient,
        images: Sequence[str],
        logins: RegistryLogins | None = None,
        every: float = REPORT_SECONDS,
    ) -> None:
        self.client = client
        self.images = list(images)
        self.logins = logins
        self.every = every

    def first(self) -> Pulling | None:
        """What the worker pulls first (what its item says before the first pull has begun)."""
        return Pulling(image=self.images[0]) if self.images else None

    def run(self, on_progress: Callable[[Pulling | None], None], stopping: threading.Event) -> list[str]:
        """Pull each image, then tell ``on_progress`` None (nothing pulled any more); return those
        that could not be pulled (each said in the log)."""
        failed = []
        try:
            for image in self.images:
                if stopping.is_set():
                    break
                if not self._pull(image, on_progress):
                    failed.append(image)
        finally:
            on_progress(None)
        return failed

    def _pull(self, image: str, on_progress: Callable[[Pulling | None], None]) -> bool:
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
            pull_with_progress(self.client, image, on_progress, login.auth_config() if login else None, self.every)
        except (docker.errors.DockerException, requests.RequestException, LoginUnavailable) as e:
            log.warning("prefetch of image %s failed (a run that needs it pulls it itself): %s", image, e)
            return False
        log.info("prefetch: pulled image %s in %.0fs", image, time.monotonic() - started)
        return True
