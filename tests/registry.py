"""A private container registry with authentication on loopback: Debian's ``docker-registry`` (the
distribution registry) with an htpasswd file, on a free port of 127.0.0.1 (the engine pulls from
127.0.0.0/8 over plain HTTP), holding one small image of this session's own. The image is pushed
with the login given to the engine for that push alone (no ``docker login``: no Docker
configuration, the engine-wide ``~/.docker/config.json`` least of all, ever holds it) and removed
from the engine afterwards, so that a run must pull it. scripts/setup.sh --test installs the
packages (``docker-registry``, ``apache2-utils``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.devstack.stack import free_port

BASE_IMAGE = "runplane/test-busybox:1"
USERNAME, PASSWORD = "labuser", "labpass"


@dataclass(frozen=True)
class PrivateRegistry:
    """``image`` (``server/lab/private:1``) is in the registry at ``server`` only; its ``mark``
    (the image's environment variable ``PRIVATE_MARK``) says a run got this image."""

    server: str
    image: str
    digest: str
    mark: str

    def login(self, password: str = PASSWORD) -> str:
        """A secret's value holding a login (``password`` a wrong one to see it refused)."""
        return json.dumps({"username": USERNAME, "password": password})

    def forget(self, client: Any) -> None:
        """Remove every copy of the image from the engine (by tag and by digest), as before a first pull."""
        for name in (self.image, f"{self.image.rpartition(':')[0]}@{self.digest}"):
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name, force=True)


def _start(directory: Path, authenticate: bool = True) -> tuple[subprocess.Popen[bytes], str]:
    """The registry, serving ``directory``; ``authenticate`` False: one that gives anything to anyone."""
    binary, htpasswd = shutil.which("docker-registry"), shutil.which("htpasswd")
    if binary is None or htpasswd is None:
        pytest.fail("docker-registry and htpasswd are needed: scripts/setup.sh --test installs them")
    users = subprocess.run([htpasswd, "-Bbn", USERNAME, PASSWORD], capture_output=True, check=True).stdout
    (directory / "htpasswd").write_bytes(users)
    server = f"127.0.0.1:{free_port()}"
    (directory / "config.yml").write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {directory / 'data'}}}}}\n"
        f"http: {{addr: {server}}}\n"
        + (f"auth: {{htpasswd: {{realm: test, path: {directory / 'htpasswd'}}}}}\n" if authenticate else "")
    )
    log = (directory / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(directory / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://{server}/v2/", timeout=2)
        except urllib.error.HTTPError as e:
            if e.code == 401:  # up, and asking for a login
                return proc, server
        except OSError:
            pass
        else:
            if not authenticate:  # up, and asking for nothing
                return proc, server
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"docker-registry did not start:\n{(directory / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.05)


def build_image(client: Any, tag: str, mark: str) -> None:
    """An image of the base image's files and an environment variable of its own: an image id no
    other image on the engine has."""
    context = io.BytesIO()
    dockerfile = f"FROM {BASE_IMAGE}\nENV PRIVATE_MARK={mark}\n".encode()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, network_mode="none")


def push_image(client: Any, image: str) -> str:
    repository, _, tag = image.rpartition(":")
    auth = {"username": USERNAME, "password": PASSWORD}
    digest = ""
    for event in client.api.push(repository, tag=tag, auth_config=auth, stream=True, decode=True):
        if event.get("error"):
            raise AssertionError(f"push of {image} failed: {event['error']}")
        digest = (event.get("aux") or {}).get("Digest") or digest
    assert digest.startswith("sha256:"), f"the push of {image} named no digest"
    return digest


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def public_registry(directory: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A registry without authentication (its process, to stop it early, and its ``host:port``)."""
    proc, server = _start(directory, authenticate=False)
    try:
        yield proc, server
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def private_registry(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRegistry]:
    directory = tmp_path_factory.mktemp("registry")
    proc, server = _start(directory)
    mark = os.urandom(6).hex()
    image = f"{server}/lab/private:1"
    try:
        build_image(docker_client, image, mark)
        registry = PrivateRegistry(server=server, image=image, digest=push_image(docker_client, image), mark=mark)
        registry.forget(docker_client)
        yield registry
        registry.forget(docker_client)
    finally:
        stop(proc)
