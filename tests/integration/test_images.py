"""Image cache pruning on the real engine: least recently used first, never an image in use,
never an image no run used."""

import contextlib
import io
import tarfile

import docker.errors
import pytest

from worker_agent.images import ImageCache

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
        cache = ImageCache(docker_client, tmp_path / "images.json", max_bytes=700_000)
        for tag in tags:
            cache.used(tag)
        holder = docker_client.containers.create(tags[0], command=["x"])  # in use: must survive
        removed = cache.prune()
        assert removed == [tags[1]]
        remaining = {t for img in docker_client.images.list(name="runplane/prune-test-*") for t in img.tags}
        assert {tags[0], tags[2], "runplane/prune-test-unrelated:1"} <= remaining
        assert tags[1] not in remaining
        assert ImageCache(docker_client, tmp_path / "images.json", None).prune() == []  # no limit, no pruning
    finally:
        if holder is not None:
            holder.remove(force=True)
        for img in [*images, keep]:
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(img.id, force=True)
