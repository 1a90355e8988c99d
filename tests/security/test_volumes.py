"""A hostile image against the real Docker engine, through the agent's own executor: its
``VOLUME`` paths, and the files the engine binds into every container, must count against the
run's disk limit and leave nothing on the worker once the run is over."""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.domain.states import RunState
from tests.security.test_containment import Worker, _failure, _rootfs
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker

VOLUME_IMAGE = "runplane/test-volume:1"
SEED = b"what the image holds at its VOLUME path\n"


def _rootfs_with_volume_dirs() -> bytes:
    """The busybox root file system of the containment tests, with ``/scratch`` (1777, as /tmp)
    and ``/seeded`` holding one file: what the engine copies into a volume when it starts."""
    data = io.BytesIO(_rootfs())
    with tarfile.open(fileobj=data, mode="a") as tar:
        for name, mode in [("scratch", 0o1777), ("seeded", 0o755)]:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        info = tarfile.TarInfo("seeded/hello")
        info.size, info.mode = len(SEED), 0o644
        tar.addfile(info, io.BytesIO(SEED))
    return data.getvalue()


@pytest.fixture(scope="session")
def volume_image(docker_client: Any) -> str:
    """An image that declares ``VOLUME /scratch`` and ``VOLUME /seeded`` (``docker import
    --change``): Docker makes an anonymous volume of each for every container made from it."""
    rootfs = _rootfs_with_volume_dirs()
    digest = hashlib.sha256(rootfs).hexdigest()[:16]
    with contextlib.suppress(docker.errors.ImageNotFound):
        if docker_client.images.get(VOLUME_IMAGE).labels.get("io.runplane.test-hash") == digest:
            return VOLUME_IMAGE
    repository, _, tag = VOLUME_IMAGE.partition(":")
    docker_client.api.import_image_from_data(
        rootfs, repository=repository, tag=tag,
        changes=["ENV PATH=/bin", "VOLUME /scratch", "VOLUME /seeded", f"LABEL io.runplane.test-hash={digest}"],
    )  # fmt: skip
    return VOLUME_IMAGE


class _Containers:
    """A client's ``containers`` that keeps every container it creates (as inspected then)."""

    def __init__(self, containers: Any, made: list[Any]) -> None:
        self._containers, self._made = containers, made

    def create(self, *args: Any, **kwargs: Any) -> Any:
        container = self._containers.create(*args, **kwargs)
        self._made.append(container)
        return container

    def __getattr__(self, name: str) -> Any:
        return getattr(self._containers, name)


class _NotingClient:
    """A Docker client that notes the containers made through it: the run's and the one that
    reads its image's accounts."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.made: list[Any] = []
        self.containers = _Containers(client.containers, self.made)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def volumes(self) -> list[str]:
        """The volumes of the containers made, as the engine said when it made them."""
        return [m["Name"] for c in self.made for m in c.attrs.get("Mounts") or [] if m.get("Type") == "volume"]


@pytest.fixture
def worker(aws_stack: Any, docker_client: Any, tmp_path: Path) -> Any:
    made = Worker(aws_stack, docker_client, tmp_path / "work")
    made.client = _NotingClient(docker_client)
    made.users = ImageUsers(made.client)
    yield made
    made.workdir.release()
    for name in _left(docker_client, made.client.volumes()):  # what a failing test left behind
        with contextlib.suppress(docker.errors.APIError):
            docker_client.volumes.get(name).remove(force=True)


def _left(client: Any, volumes: list[str]) -> list[str]:
    left = []
    for name in volumes:
        try:
            client.volumes.get(name)
        except docker.errors.NotFound:
            continue
        left.append(name)
    return left


def test_writing_past_the_disk_limit_through_a_volume_is_disk_limit_and_leaves_nothing(
    worker, docker_client, volume_image
):
    """The image's /scratch was an anonymous volume under the engine's data root: 5m written
    there passed a 1m disk limit (the run succeeded) and stayed on the worker after it."""
    executor = worker.start("dd if=/dev/zero of=/scratch/big bs=1M count=5 2>/dev/null", volume_image,
                            resources={"disk": "1m"})  # fmt: skip
    run = worker.finish(executor)
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "volumes 5120.0k" in message, message
    assert "over the 1m disk limit" in message
    volumes = worker.client.volumes()
    assert volumes, "the image's VOLUME paths were mounted as volumes"
    assert _left(docker_client, volumes) == []
    assert not executor.run_dir.exists()


def test_no_volume_of_a_runs_containers_is_left_on_the_engine(worker, docker_client, volume_image):
    """Containers were removed without their anonymous volumes: each run left one per VOLUME
    path of its image on the worker, with what it wrote there, and so did the container that
    reads the image's accounts (which gets a copy of what the image holds there)."""
    run = worker.run("echo written > /scratch/f", volume_image)
    assert run.state == RunState.SUCCEEDED, run.failure
    assert len(worker.client.made) == 2, "the run's container and the one that read the image's accounts"
    volumes = worker.client.volumes()
    assert len(volumes) == 4, "two VOLUME paths, each container"
    assert _left(docker_client, volumes) == []


def test_a_volume_starts_with_what_the_image_holds_there_and_is_nosuid(worker, volume_image):
    """What the image has at a VOLUME path is there, as Docker's own volume would have it; the
    directory it is kept in is on the run directory's nosuid,nodev mount."""
    run = worker.run("cat /seeded/hello; grep -E ' /(scratch|seeded) ' /proc/mounts", volume_image)
    assert run.state == RunState.SUCCEEDED, run.failure
    out = worker.log(run).decode()
    assert SEED.decode() in out
    mounts = [line.split()[3].split(",") for line in out.splitlines() if line.startswith("/")]
    assert len(mounts) == 2, out
    assert all({"nosuid", "nodev"} <= set(options) for options in mounts), out


def test_root_writing_the_engines_hosts_file_counts_against_disk(worker, volume_image):
    """/etc/hosts is the engine's file, bound writable into the container and kept outside its
    layer: root in a container (on a pool that allows root) wrote 5m there past a 1m limit."""
    run = worker.run("dd if=/dev/zero of=/etc/hosts bs=1M count=5 2>/dev/null", volume_image,
                     resources={"disk": "1m"}, allow_root=True, run_user="image")  # fmt: skip
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "container file system 5056k" in message, message  # 5m less what the engine may write there


class _EngineFilesElsewhere:
    """The engine's low-level API as an agent in a container of its own sees it: the engine
    names the files it binds into a container by paths under its data root, which that agent's
    file system does not have."""

    def __init__(self, api: Any, missing: Path) -> None:
        self._api, self._missing = api, missing

    def inspect_container(self, container: Any) -> dict[str, Any]:
        attrs = self._api.inspect_container(container)
        return {**attrs, **{key: str(self._missing / key) for key in ("HostsPath", "HostnamePath", "ResolvConfPath")}}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def test_an_agent_that_cannot_see_the_engines_files_asks_the_engine_their_size(worker, volume_image, tmp_path):
    """An agent in a container of its own (a Batch job or a Kubernetes pod given the engine's
    socket alone) cannot stat the engine's files: root's 5m in /etc/resolv.conf counted as 0."""
    missing = tmp_path / "not-on-this-file-system"
    worker.client.api = _EngineFilesElsewhere(worker.client._client.api, missing)
    run = worker.run("dd if=/dev/zero of=/etc/resolv.conf bs=1M count=5 2>/dev/null", volume_image,
                     resources={"disk": "1m"}, allow_root=True, run_user="image")  # fmt: skip
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "container file system 5056k" in message, message
    assert not missing.exists()
