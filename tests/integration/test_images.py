"""Image cache pruning on the real engine: least recently used first, never an image in use,
never an image no run used."""

import contextlib
import gzip
import hashlib
import http.server
import io
import json
import os
import tarfile
import threading
import time
from types import SimpleNamespace

import docker.errors
import pytest

from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import FailureReason
from tests.conftest import wait_for
from worker_agent.containers import RunContainer
from worker_agent.images import ImageCache, pull

pytestmark = pytest.mark.docker


def make_image(client, tag, size):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("blob")
        info.size = size
        tar.addfile(info, io.BytesIO(tag.encode().ljust(size, b"\0")))
    client.api.import_image_from_data(data.getvalue(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    return client.images.get(tag)


def test_prune_lru_under_the_limit(docker_client, tmp_path):
    tags = [f"runplane/prune-test-{i}:1" for i in range(3)]
    images = [make_image(docker_client, tag, 300_000) for tag in tags]
    keep = make_image(docker_client, "runplane/prune-test-unrelated:1", 300_000)
    holder = None
    try:
        state = tmp_path / "images.json"
        state.write_text(json.dumps({tags[0]: time.time() - 60}))  # by name, as an earlier release kept it
        cache = ImageCache(docker_client, state, max_bytes=700_000)
        for image in images[1:]:
            cache.used(image.id)
        holder = docker_client.containers.create(tags[0], command=["x"])  # in use: must survive
        removed = cache.prune()
        assert removed == [images[1].id]
        remaining = {t for img in docker_client.images.list(name="runplane/prune-test-*") for t in img.tags}
        assert {tags[0], tags[2], "runplane/prune-test-unrelated:1"} <= remaining
        assert tags[1] not in remaining
        assert set(json.loads(state.read_text())) == {images[0].id, images[2].id}  # the name read as its id
        assert ImageCache(docker_client, tmp_path / "images.json", None).prune() == []  # no limit, no pruning
    finally:
        if holder is not None:
            holder.remove(force=True)
        for img in [*images, keep]:
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(img.id, force=True)


class Registry:
    """A registry of the test's own on loopback (the engine pulls from 127.0.0.0/8 over plain
    HTTP): ``publish(name, data)`` makes an image of one layer holding ``data`` and returns its
    reference. Blobs go out in CHUNK pieces, PACE seconds apart, as over a slow network: a blob
    the engine hangs up on is recorded in ``hung_up`` with the bytes it was sent."""

    CHUNK = 64 * 1024
    PACE = 0.01

    def __init__(self) -> None:
        self.blobs: dict[str, tuple[bytes, str]] = {}
        self.hung_up: dict[str, int] = {}
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                found = registry.blobs.get(self.path.rsplit("/", 1)[1]) if self.path != "/v2/" else (b"{}", "x")
                if found is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                body, ctype = found
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Docker-Content-Digest", _digest(body))
                self.end_headers()
                if self.command == "HEAD":
                    return
                sent = 0
                try:
                    while sent < len(body):
                        self.wfile.write(body[sent : sent + Registry.CHUNK])
                        sent = min(len(body), sent + Registry.CHUNK)
                        time.sleep(Registry.PACE)  # the pace of a slow network, not a wait for an event
                except OSError:  # the engine hung up
                    registry.hung_up[self.path] = sent

            do_HEAD = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def publish(self, name: str, data: bytes) -> str:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo("blob")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        layer = gzip.compress(raw.getvalue(), compresslevel=1)
        rootfs = {"type": "layers", "diff_ids": [_digest(raw.getvalue())]}
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}, "rootfs": rootfs}).encode()
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                           "digest": _digest(config)},
                "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                            "digest": _digest(layer)}],
            }
        ).encode()  # fmt: skip
        self.blobs[_digest(config)] = (config, "application/octet-stream")
        self.blobs[_digest(layer)] = (layer, "application/octet-stream")
        for reference in ("1", _digest(manifest)):  # asked by tag, then by digest
            self.blobs[reference] = (manifest, "application/vnd.docker.distribution.manifest.v2+json")
        self.layer = f"/v2/{name}/blobs/{_digest(layer)}"
        return f"{self.host}/{name}:1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def registry(docker_client):
    served = Registry()
    yield served
    served.close()
    for image in docker_client.images.list():
        for tag in image.tags:
            if tag.startswith(f"{served.host}/"):
                with contextlib.suppress(docker.errors.APIError):
                    docker_client.images.remove(tag, force=True)


def box(client):
    run = Run(id="r-pull", owner="a", queue="q", created_at=0, attempt=1, spec=RunSpec(command="true"))
    return RunContainer(client, run, "w-1", time.time)


def test_a_pull_is_given_up_once_the_layers_announced_pass_the_pools_cap(docker_client, registry):
    """A 16m layer (random: it compresses to no less) on a 3m cap: the pull is given up as soon as
    the registry announces the layer's size, the engine hangs up on the registry before the layer
    is through, and nothing of the image stays."""
    size = 16 * 1024**2
    ref = registry.publish("runplane/big", os.urandom(size))
    outcome = box(docker_client).ensure_image(ref, "missing", 3 * 1024**2)
    assert outcome is not None and outcome.reason == FailureReason.IMAGE_TOO_LARGE
    assert outcome.message.startswith(f"image {ref} has more than ") and "its pull was given up" in outcome.message
    wait_for(lambda: registry.layer in registry.hung_up, 30, 0.05, "the engine to hang up on the registry")
    assert registry.hung_up[registry.layer] < size
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(ref)


def test_an_image_over_the_cap_once_unpacked_is_removed_after_its_pull(docker_client, registry):
    """8m of zeros travel as a few kilobytes: the pull goes through, then the image's own size is
    over the cap, so the run is refused and the image pulled for it removed. Under the cap, the
    same image is pulled and kept."""
    ref = registry.publish("runplane/sparse", b"\0" * (8 * 1024**2))
    outcome = box(docker_client).ensure_image(ref, "missing", 3 * 1024**2)
    assert outcome is not None and outcome.reason == FailureReason.IMAGE_TOO_LARGE
    assert outcome.message == f"image {ref} is 8m, larger than the pool's max_image_size 3m"
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(ref)
    taken = box(docker_client)
    assert taken.ensure_image(ref, "missing", 9 * 1024**2) is None
    assert taken.image.id == docker_client.images.get(ref).id


class _ClosingNoted:
    """The engine's low-level API, noting for each response it streams whether it was closed."""

    def __init__(self, api):
        self._api = api
        self.closed: list[bool] = []

    def _post(self, *args, **kwargs):
        response = self._api._post(*args, **kwargs)
        index, close = len(self.closed), response.close
        self.closed.append(False)

        def closing():
            self.closed[index] = True
            close()

        response.close = closing
        return response

    def __getattr__(self, name):
        return getattr(self._api, name)


def test_a_capped_pull_the_engine_refuses_closes_its_response(docker_client):
    """The engine answers an error at once (no registry listens on 127.0.0.1:1): the error says
    why, and the response is closed, as a pull's is on every other way out."""
    api = _ClosingNoted(docker_client.api)
    client = SimpleNamespace(api=api, images=docker_client.images)
    with pytest.raises(docker.errors.APIError, match=r"127\.0\.0\.1:1.*connection refused"):
        pull(client, "127.0.0.1:1/runplane/absent:1", 3 * 1024**2)
    assert api.closed == [True]
