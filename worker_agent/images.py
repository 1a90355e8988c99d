"""Least-recently-used pruning of the Docker images this worker's runs used, under a size limit."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors

log = logging.getLogger(__name__)


class ImageCache:
    """Remembers when each image was last used by a run (in ``state_file``, so it survives
    restarts) and removes the least recently used ones, never one a container still uses,
    until the total is under ``max_bytes``. Images no run of this worker used are left alone."""

    def __init__(self, client: docker.DockerClient, state_file: Path, max_bytes: int | None) -> None:
        self.client = client
        self.state_file = state_file
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(self.state_file.read_text())
            return {str(k): float(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save(self, data: dict[str, float]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.state_file)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Agents on one host share the file: a thread lock here, a file lock between them."""
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, self.state_file.with_suffix(".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def used(self, image: str) -> None:
        with self._locked():
            data = self._load()
            data[image] = time.time()
            self._save(data)

    def prune(self) -> list[str]:
        if self.max_bytes is None:
            return []
        with self._locked():
            data = self._load()
            images: list[tuple[float, str, Any]] = []
            for name, last in data.items():
                try:
                    images.append((last, name, self.client.images.get(name)))
                except docker.errors.ImageNotFound:
                    continue
                except docker.errors.APIError as e:
                    log.warning("cannot inspect image %s: %s", name, e)
            sizes = {img.id: int(img.attrs.get("Size", 0)) for _, _, img in images}
            total = sum(sizes.values())
            removed = []
            for _, name, img in sorted(images, key=lambda t: t[0]):
                if total <= self.max_bytes:
                    break
                try:
                    self.client.images.remove(img.id, force=False)
                except docker.errors.APIError as e:  # in use by a container, or tagged elsewhere
                    log.info("keeping image %s: %s", name, getattr(e, "explanation", e))
                    continue
                total -= sizes.pop(img.id, 0)
                data.pop(name, None)
                removed.append(name)
            self._save(data)
        if removed:
            log.info("pruned %d image(s) to stay under the image cache limit: %s", len(removed), removed)
        return removed
