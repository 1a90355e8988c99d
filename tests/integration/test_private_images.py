"""A run's image from a registry with authentication (tests/registry.py), on the real engine, as
RunContainer.ensure_image gets it for a run: pulled with the run's login, refused without it,
and a copy already on the worker used only after the run's own check with the registry."""

import contextlib
import time

import docker.errors
import pytest

from runplane.domain.runs import Run, RunSpec
from runplane.domain.secrets import RegistryCredentials, SecretUnavailable
from runplane.domain.states import FailureReason
from tests.conftest import TEST_IMAGE
from tests.registry import (  # noqa: F401
    PASSWORD,
    PrivateRegistry,
    build_image,
    private_registry,
    public_registry,
    push_image,
    stop,
)
from worker_agent.containers import RunContainer
from worker_agent.images import ImageCache
from worker_agent.registries import Login, LoginUnavailable


def box(client):
    run = Run(id="r-private", owner="a", queue="q", created_at=0, attempt=1, spec=RunSpec(command="true"))
    return RunContainer(client, run, "w-1", time.time)


def login(registry: PrivateRegistry, password: str = PASSWORD):
    credentials = RegistryCredentials.parse(registry.login(password))
    return lambda: Login(registry.server, credentials, "secret regcred")


def never_asked():
    raise AssertionError("the run's login was asked for")


@pytest.fixture
def registry(private_registry, docker_client):  # noqa: F811
    """The private registry, its image on no engine before and after the test."""
    private_registry.forget(docker_client)
    yield private_registry
    private_registry.forget(docker_client)


def test_a_private_image_is_pulled_with_the_runs_login_and_refused_without(docker_client, registry):
    anonymous = box(docker_client).ensure_image(registry.image, "missing", None, lambda: None)
    assert anonymous is not None and anonymous.reason == FailureReason.IMAGE_UNAUTHORIZED
    assert anonymous.message.startswith(
        f"registry {registry.server} needs a login for image {registry.image}: give image_pull_secret ("
    )
    wrong = box(docker_client).ensure_image(registry.image, "missing", None, login(registry, "not-it"))
    assert wrong is not None and wrong.reason == FailureReason.IMAGE_UNAUTHORIZED
    assert wrong.message.startswith(f"registry {registry.server} refused the credentials of secret regcred for image")
    assert "not-it" not in wrong.message
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(registry.image)
    missing = box(docker_client).ensure_image(registry.image[:-1] + "2", "missing", None, login(registry))
    assert missing is not None and missing.reason == FailureReason.IMAGE_NOT_FOUND
    pulled = box(docker_client)
    assert pulled.ensure_image(registry.image, "missing", None, login(registry)) is None
    assert f"PRIVATE_MARK={registry.mark}" in pulled.image.attrs["Config"]["Env"]
    assert pulled.image.attrs["RepoDigests"] == [f"{registry.image.rpartition(':')[0]}@{registry.digest}"]


def test_a_login_that_cannot_be_had_ends_the_run_before_any_pull(docker_client, registry):
    """The run's own image_pull_secret: secret_unavailable; the pool's login: image_unauthorized."""

    def missing():
        raise SecretUnavailable("secret regcred does not exist (or a may not use it)")

    def pools():
        raise LoginUnavailable(f"the pool's login for registry {registry.server} cannot be used: no ECR login")

    own = box(docker_client).ensure_image(registry.image, "missing", None, missing)
    assert own is not None and (own.reason, own.message) == (
        FailureReason.SECRET_UNAVAILABLE,
        "secret regcred does not exist (or a may not use it)",
    )
    pool = box(docker_client).ensure_image(registry.image, "missing", None, pools)
    assert pool is not None and pool.reason == FailureReason.IMAGE_UNAUTHORIZED
    assert (
        pool.message
        == f"image {registry.image}: the pool's login for registry {registry.server} cannot be used: no ECR login"
    )


def test_a_cached_private_image_is_used_only_after_the_runs_own_check(docker_client, registry, tmp_path):
    """Once one run's login pulled the image, a run without a login is refused before any
    container exists (it never gets the image), and one with the login gets that very image by
    id, pulling nothing. An agent that never pulls uses the image as it is."""
    cache = ImageCache(docker_client, tmp_path / "images.json", None)
    first = box(docker_client)
    assert first.ensure_image(registry.image, "missing", None, login(registry), cache) is None
    assert not first.public and not cache.public(first.image.id)  # pulled with a login: checked each time
    other = box(docker_client)
    refused = other.ensure_image(registry.image, "missing", None, lambda: None, cache)
    assert refused is not None and refused.reason == FailureReason.IMAGE_UNAUTHORIZED
    assert f"registry {registry.server} needs a login" in refused.message
    assert other.image is None
    wrong = box(docker_client).ensure_image(registry.image, "missing", None, login(registry, "not-it"))
    assert wrong is not None and wrong.reason == FailureReason.IMAGE_UNAUTHORIZED
    again = box(docker_client)
    assert again.ensure_image(registry.image, "missing", None, login(registry)) is None
    assert again.image.id == first.image.id
    offline = box(docker_client)
    assert offline.ensure_image(registry.image, "never", None, never_asked) is None
    assert offline.image.id == first.image.id


def test_a_moved_tag_gets_the_image_the_registry_names(docker_client, registry):
    """The tag here names another image from the registry than the one the registry names for it:
    the run gets the image holding the registry's digest, by id (and pulled by digest once it is
    gone from here), never the one the local tag names."""
    first = box(docker_client)
    assert first.ensure_image(registry.image, "missing", None, login(registry)) is None
    other = f"{registry.server}/lab/other:1"
    build_image(docker_client, other, "other")
    try:
        push_image(docker_client, other)  # it has RepoDigests of its own now
        docker_client.images.get(other).tag(registry.image)  # the local tag moves to it
        moved = box(docker_client)
        assert moved.ensure_image(registry.image, "missing", None, login(registry)) is None
        assert moved.image.id == first.image.id != docker_client.images.get(registry.image).id
        docker_client.images.remove(f"{registry.image.rpartition(':')[0]}@{registry.digest}", force=True)
        pulled = box(docker_client)
        assert pulled.ensure_image(registry.image, "missing", None, login(registry)) is None
        assert pulled.image.id == first.image.id
    finally:
        for name in (other, registry.image):
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(name, force=True)


def test_a_cached_image_whose_registry_cannot_be_reached_is_not_used(docker_client, registry):
    """Its registry is asked and does not answer: the run fails image_not_found saying so, rather
    than start an image whose access no one checked."""
    assert box(docker_client).ensure_image(registry.image, "missing", None, login(registry)) is None
    gone = "127.0.0.1:1/lab/private:1"  # nothing listens on port 1
    docker_client.images.get(registry.image).tag(gone)
    try:
        unchecked = box(docker_client)
        outcome = unchecked.ensure_image(gone, "missing", None, lambda: None)
        assert outcome is not None and outcome.reason == FailureReason.IMAGE_NOT_FOUND
        assert outcome.message.startswith(f"image {gone} is on this worker but its registry did not confirm access")
        assert "connection refused" in outcome.message
        assert unchecked.image is None
    finally:
        docker_client.images.remove(gone, force=True)


def test_an_image_built_here_is_used_without_asking_a_registry(docker_client):
    """The tests' images have no RepoDigests (imported): no login is asked for, no registry."""
    assert not docker_client.images.get(TEST_IMAGE).attrs.get("RepoDigests")
    here = box(docker_client)
    assert here.ensure_image(TEST_IMAGE, "missing", None, never_asked) is None
    assert here.image.id == docker_client.images.get(TEST_IMAGE).id


def test_an_image_pulled_with_no_login_is_used_without_asking_its_registry_again(docker_client, tmp_path):
    """A registry that gives the image to anyone: once this worker pulled it with no login at all,
    a run uses it from here as it is, even with its registry gone (Docker Hub down, or limiting
    anonymous pulls). Without the cache's word the registry is asked, and its absence fails the run."""
    (tmp_path / "registry").mkdir()
    with public_registry(tmp_path / "registry") as (proc, server):
        image = f"{server}/lab/public:1"
        build_image(docker_client, image, "public")
        try:
            push_image(docker_client, image)
            built = docker_client.images.get(image).id
            docker_client.images.remove(built, force=True)  # a run must pull it
            cache = ImageCache(docker_client, tmp_path / "images.json", None)
            pulled = box(docker_client)
            assert pulled.ensure_image(image, "missing", None, lambda: None, cache) is None
            assert pulled.image.id == built and pulled.public and cache.public(built)
            stop(proc)
            unchecked = box(docker_client)
            assert unchecked.ensure_image(image, "missing", None, never_asked, cache) is None
            assert unchecked.image.id == built and unchecked.public
            asked = box(docker_client).ensure_image(image, "missing", None, lambda: None)
            assert asked is not None and asked.reason == FailureReason.IMAGE_NOT_FOUND
            assert asked.message.startswith(f"image {image} is on this worker but its registry did not confirm")
        finally:
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(image, force=True)


def test_an_image_pulled_by_digest_after_its_tag_moved_is_pruned(docker_client, registry, tmp_path):
    """The tag moved in the registry while the tag here still names the first image: the run pulls
    ``repository@digest``, an untagged image, which the cache records by id and prunes."""
    cache = ImageCache(docker_client, tmp_path / "images.json", max_bytes=1)
    tag = f"{registry.server}/lab/moving:1"
    ids: list[str] = []
    try:
        build_image(docker_client, tag, "first")
        push_image(docker_client, tag)
        first = box(docker_client)
        assert first.ensure_image(tag, "missing", None, login(registry), cache) is None
        ids.append(first.image.id)
        build_image(docker_client, tag, "second")
        push_image(docker_client, tag)  # the registry's tag names the second image now
        ids.append(docker_client.images.get(tag).id)
        docker_client.images.get(ids[0]).tag(tag)  # the tag here names the first again
        docker_client.images.remove(ids[1], force=True)
        moved = box(docker_client)
        assert moved.ensure_image(tag, "missing", None, login(registry), cache) is None
        assert moved.image.id == ids[1] and not moved.image.tags  # pulled by digest
        assert sorted(cache.prune()) == sorted(ids)
        for image_id in ids:
            with pytest.raises(docker.errors.ImageNotFound):
                docker_client.images.get(image_id)
    finally:
        for name in (tag, *ids):
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(name, force=True)
