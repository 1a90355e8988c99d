"""The images of runs: pulled under the pool's size cap, and least-recently-used pruning of those
this worker's runs used, under a size limit."""

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
from docker import auth
from docker.utils import parse_repository_tag

from runplane.domain.units import format_bytes

log = logging.getLogger(__name__)


class ImageTooLarge(Exception):
    """An image over its pool's ``max_image_size``; the message says how large it is."""


def too_large(client: docker.DockerClient, name: str, image: Any, max_bytes: int | None, pulled: bool) -> str | None:
    """Why ``image`` (called ``name``) is over ``max_bytes`` as the engine counts its size (its
    layers unpacked, as ``docker images`` shows), or None. One this worker ``pulled`` for it is
    removed again (unless a container uses it): it must not stay on the worker."""
    size = int(image.attrs.get("Size") or 0)
    if max_bytes is None or size <= max_bytes:
        return None
    if pulled:
        try:
            client.images.remove(name, force=False)  # the name pulled; the image too unless named otherwise
        except docker.errors.APIError as e:  # in use, or tagged elsewhere: left for the cache's pruning
            log.info("keeping image %s: %s", name, getattr(e, "explanation", e))
    return f"image {name} is {format_bytes(size)}, larger than the pool's max_image_size {format_bytes(max_bytes)}"


def pull(
    client: docker.DockerClient, name: str, max_bytes: int | None, auth_config: dict[str, str] | None = None
) -> Any:
    """Pull image ``name`` with ``auth_config`` (None: the worker's own Docker configuration, if
    any; registries.py says which login a run uses). With ``max_bytes``, the pull is given up
    once the layers the registry announces pass it (their compressed sizes: an image at most that
    large may still be larger once unpacked, which ``too_large`` checks): the engine stops a pull
    whose client went away, so no more of it is downloaded. Raises ImageTooLarge, docker.errors.APIError (also for an
    error the engine reports in the middle of the pull) or requests.RequestException."""
    if max_bytes is None:
        return client.images.pull(name, auth_config=auth_config)
    repository, tag = parse_repository_tag(name)
    tag = tag or "latest"
    api = client.api  # as api.pull does it, but holding the response, to hang up on the engine
    headers = {}
    header = (
        auth.encode_header(auth_config)
        if auth_config
        else auth.get_config_header(api, auth.resolve_repository_name(repository)[0])
    )
    if header:
        headers["X-Registry-Auth"] = header
    params = {"fromImage": repository, "tag": tag}
    response = api._post(api._url("/images/create"), params=params, headers=headers, stream=True, timeout=None)
    announced: dict[str, int] = {}
    try:
        api._raise_for_status(response)
        for event in api._stream_helper(response, decode=True):
            if event.get("error"):
                raise docker.errors.APIError(str(event["error"]))
            total = (event.get("progressDetail") or {}).get("total")
            if event.get("status") == "Downloading" and isinstance(total, int) and event.get("id"):
                announced[str(event["id"])] = total
                if sum(announced.values()) > max_bytes:
                    raise ImageTooLarge(
                        f"image {name} has more than {format_bytes(sum(announced.values()))} of layers to download, "
                        f"larger than the pool's max_image_size {format_bytes(max_bytes)}: its pull was given up"
                    )
    finally:
        response.close()  # hangs up: a pull given up stops on the engine too
    return client.images.get(f"{repository}{'@' if tag.startswith('sha256:') else ':'}{tag}")


def registry_digest(client: docker.DockerClient, name: str, auth_config: dict[str, str] | None) -> str:
    """The digest of the manifest ``name`` names in its registry, asked with ``auth_config`` (as
    ``pull``) through the engine's distribution endpoint, which downloads no layer: the registry
    answers only if the login may pull it. Raises docker.errors.NotFound (no such image),
    docker.errors.APIError (refused, or the registry cannot be reached) or requests.RequestException."""
    return str(client.images.get_registry_data(name, auth_config=auth_config).id)


def anonymous(client: docker.DockerClient, name: str) -> bool:
    """Whether a pull of ``name`` given no ``auth_config`` goes with no login at all: the agent's
    own Docker configuration (as ``pull`` reads it) holds none for its registry. False when that
    configuration cannot be read."""
    try:
        registry = auth.resolve_repository_name(parse_repository_tag(name)[0])[0]
        return auth.get_config_header(client.api, registry) is None
    except (docker.errors.DockerException, ValueError, OSError):
        return False


def by_digest(name: str, digest: str) -> str:
    """The reference to ``digest`` in the repository of image ``name``: ``repository@digest``."""
    return f"{parse_repository_tag(name)[0]}@{digest}"


class ImageCache:
    """Remembers, by image id, when each image was last used by a run (in ``state_file``, so it
    survives restarts) and removes the least recently used ones, never one a container still
    uses, until the total is under ``max_bytes``. Images no run of this worker used are left
    alone. Keyed by id, not by the name a run gave: an image pulled by digest once its tag moved
    is counted and pruned too (a file an earlier release wrote, keyed by name, is read as well).

    It also remembers which images this worker pulled with no login at all (``public``, in a file
    beside ``state_file``: an earlier release's agent sharing the state file reads it as before):
    their registry gave them to anyone, so a run uses them as they are, without asking the
    registry again (containers.py)."""

    def __init__(self, client: docker.DockerClient, state_file: Path, max_bytes: int | None) -> None:
        self.client = client
        self.state_file = state_file
        self.public_file = state_file.with_name(f"{state_file.stem}.public.json")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(self.state_file.read_text())
            return {str(k): float(v) for k, v in data.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def _load_public(self) -> set[str]:
        try:
            data = json.loads(self.public_file.read_text())
            return {str(k) for k in data} if isinstance(data, list) else set()
        except (OSError, ValueError):
            return set()

    def _write(self, path: Path, data: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    def _save(self, data: dict[str, float]) -> None:
        self._write(self.state_file, data)

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

    def used(self, image_id: str, public: bool = False) -> None:
        """A run used the image of id ``image_id``; ``public``: this worker pulled it (or its
        registry confirmed it) with no login at all."""
        with self._locked():
            data = self._load()
            data[image_id] = time.time()
            self._save(data)
            if public:
                known = self._load_public()
                if image_id not in known:
                    self._write(self.public_file, sorted(known | {image_id}))

    def public(self, image_id: str) -> bool:
        """Whether this worker got the image of id ``image_id`` with no login at all (False when
        that cannot be read: the image is then checked with its registry)."""
        try:
            with self._locked():
                return image_id in self._load_public()
        except OSError as e:
            log.warning("cannot read which images are public: %s", e)
            return False

    def prune(self) -> list[str]:
        """Remove least recently used images until the total is under ``max_bytes``; returns the
        ids removed."""
        if self.max_bytes is None:
            return []
        with self._locked():
            found: dict[str, tuple[float, Any]] = {}
            unread: dict[str, float] = {}
            for key, last in self._load().items():  # an id, or the name an earlier release kept
                try:
                    img = self.client.images.get(key)
                except docker.errors.ImageNotFound:
                    continue  # gone: forgotten
                except docker.errors.APIError as e:
                    log.warning("cannot inspect image %s: %s", key, e)
                    unread[key] = last
                    continue
                found[img.id] = (max(last, found[img.id][0]) if img.id in found else last, img)
            sizes = {image_id: int(img.attrs.get("Size", 0)) for image_id, (_, img) in found.items()}
            total = sum(sizes.values())
            removed = []
            for image_id, _ in sorted(found.items(), key=lambda t: t[1][0]):
                if total <= self.max_bytes:
                    break
                try:
                    self.client.images.remove(image_id, force=False)
                except docker.errors.APIError as e:  # in use by a container, or tagged elsewhere
                    log.info("keeping image %s: %s", image_id, getattr(e, "explanation", e))
                    continue
                total -= sizes.pop(image_id, 0)
                found.pop(image_id)
                removed.append(image_id)
            self._save(unread | {image_id: last for image_id, (last, _) in found.items()})
            self._write(self.public_file, sorted(self._load_public() & (set(found) | set(unread))))
        if removed:
            log.info("pruned %d image(s) to stay under the image cache limit: %s", len(removed), removed)
        return removed
