"""A new worker pulls its pool's prefetch_images before it takes its first run: on the local stack
and the real engine, from a registry of the test's own on loopback whose layer is held half sent
until the test lets it go. While it pulls, its item and the waiting reason of a queued run say which
image and how far; a prefetch that fails leaves the worker serving."""

import contextlib
import os
import socket
import threading
import time

import docker.errors
import pytest

from runplane.api.views import worker_view
from runplane.cli.fleet import worker_status
from runplane.domain.pools import RegistryLogin
from runplane.domain.runs import RunSpec
from runplane.domain.secrets import RegistryCredentials
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.domain.workers import Pulling, Worker
from runplane.services.overview import why_waiting
from runplane.services.runs import submit_run
from tests.conftest import TEST_IMAGE, wait_for
from tests.integration.test_images import Registry
from tests.registry import private_registry  # noqa: F401
from worker_agent.agent import Agent
from worker_agent.prefetch import Prefetch
from worker_agent.registries import RegistryLogins
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig
from worker_agent.secrets import RunSecrets

pytestmark = pytest.mark.docker

MiB = 1024**2


class Held(bytes):
    """A blob whose second half is sent only once ``gate`` is set."""

    gate: threading.Event

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice) and (index.start or 0) >= len(self) // 2:
            self.gate.wait(120)
        return bytes.__getitem__(self, index)


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


def start_agent(stack, docker_client, tmp_path, images):
    work_dir = tmp_path / "w-pre"
    config = AgentConfig(
        pool="manual",
        worker_id="w-pre",
        work_dir=work_dir,
        cpuset=(0,),
        poll_seconds=1,
        heartbeat_seconds=0.5,
        executor=ExecutorConfig(worker_id="w-pre", work_dir=work_dir, stack_id=stack.settings.stack_id()),
    )
    ports = AgentPorts(stack.store, stack.queue, stack.objects)
    agent = Agent(
        config, ports, stack.workers, docker_client, time.time, prefetch=Prefetch(docker_client, images, every=0.2)
    )
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return agent, thread


def submit(stack):
    spec = RunSpec.model_validate({"command": "true", "queue": "manual", "image": TEST_IMAGE})
    return submit_run(stack.ports, Principal(user="a"), spec, None).run


def claimed_at(stack, run_id: str) -> float:
    """When this test's worker claimed the run (waited for)."""

    def claim() -> float | None:
        events = stack.store.get(run_id).events
        return next((e.at for e in events if e.message.startswith("attempt 1 claimed by worker w-pre")), None)

    found: float = wait_for(claim, 60, 0.1, "the run's claim")
    return found


def item(stack) -> Worker | None:
    return next((w for w in stack.workers.list("manual") if w.id == "w-pre"), None)


def test_a_new_worker_takes_its_first_run_once_its_pools_images_are_pulled(
    local_stack, docker_client, tmp_path, registry
):
    gate = threading.Event()
    ref = registry.publish("runplane/prefetch", os.urandom(4 * MiB))
    layer = registry.layer.rsplit("/", 1)[1]
    held = Held(registry.blobs[layer][0])
    held.gate = gate
    registry.blobs[layer] = (held, registry.blobs[layer][1])
    run = submit(local_stack)
    agent, thread = start_agent(local_stack, docker_client, tmp_path, [ref])
    try:
        pulling = wait_for(
            lambda: (w := item(local_stack)) and w.pulling and w.pulling.done and w, 60, 0.1, "the pull's progress"
        )
        assert pulling.status == "starting" and pulling.pulling.image == ref
        assert 0 < pulling.pulling.done < pulling.pulling.total
        waiting = local_stack.store.get(run.id)
        assert waiting.state == RunState.QUEUED
        why = why_waiting(local_stack.ports, waiting)
        assert why is not None and why.startswith(f"worker pulling image {ref} (") and why.endswith(" MiB)"), why
        shown = worker_status(worker_view(pulling))  # `runplane workers`, from the API's view of the item
        assert shown.startswith(f"starting: pulling {ref} (") and shown.endswith(" MiB)"), shown
        released_at = time.time()
        gate.set()
        assert claimed_at(local_stack, run.id) >= released_at  # not before its images were here
        assert docker_client.images.get(ref)
        pulled = wait_for(lambda: (w := item(local_stack)) and w.pulling is None and w.status != "starting" and w, 10)
        assert worker_status(worker_view(pulled)) == pulled.status
    finally:
        gate.set()
        agent.stop()
        thread.join(60)


def test_a_worker_whose_prefetch_fails_goes_on_and_takes_runs(local_stack, docker_client, tmp_path, registry, caplog):
    absent = f"{registry.host}/runplane/absent:1"
    run = submit(local_stack)
    agent, thread = start_agent(local_stack, docker_client, tmp_path, [absent])
    try:
        assert claimed_at(local_stack, run.id)
        assert any(f"prefetch of image {absent} failed" in r.getMessage() for r in caplog.records)
        assert (w := item(local_stack)) is not None and w.pulling is None
    finally:
        agent.stop()
        thread.join(60)


@pytest.fixture
def private(private_registry, docker_client):  # noqa: F811
    """The registry with authentication (tests/registry.py), its image on no engine before and after."""
    private_registry.forget(docker_client)
    yield private_registry
    private_registry.forget(docker_client)


def test_a_prefetch_pulls_a_private_image_with_the_pools_login(docker_client, private):
    """The pool's entry for the registry gives the login (here the worker's own cloud login, the
    kind ``acr``); without one the registry refuses, and the prefetch says it could not pull."""
    credentials = RegistryCredentials.parse(private.login())
    asked: list[str] = []
    entry = RegistryLogin(server=private.server, acr=True)
    logins = RegistryLogins(
        RunSecrets(None, None), [entry], {"acr": lambda server: asked.append(server) or credentials}
    )
    seen: list[object] = []
    assert Prefetch(docker_client, [private.image], logins, every=0).run(seen.append, threading.Event()) == []
    assert asked == [private.server]
    assert f"PRIVATE_MARK={private.mark}" in docker_client.images.get(private.image).attrs["Config"]["Env"]
    assert seen[0] == Pulling(image=private.image) and seen[-1] is None
    private.forget(docker_client)
    assert Prefetch(docker_client, [private.image]).run(seen.append, threading.Event()) == [private.image]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(private.image)


def test_a_worker_told_to_stop_gives_up_its_prefetch(local_stack, docker_client, tmp_path, registry):
    """A pull held half way (a stalled layer) is given up when the worker stops: it does not wait for it."""
    gate = threading.Event()
    ref = registry.publish("runplane/prefetch-stop", os.urandom(4 * MiB))
    layer = registry.layer.rsplit("/", 1)[1]
    held = Held(registry.blobs[layer][0])
    held.gate = gate
    registry.blobs[layer] = (held, registry.blobs[layer][1])
    agent, thread = start_agent(local_stack, docker_client, tmp_path, [ref])
    try:
        wait_for(lambda: (w := item(local_stack)) and w.pulling and w.pulling.done, 60, 0.1, "the pull's progress")
        agent.stop()
        thread.join(60)
        assert not thread.is_alive() and not gate.is_set()  # ended while its layer was still held
        assert agent.exit_reason == "asked to stop"
        assert (w := item(local_stack)) is not None and w.status == "offline" and w.pulling is None
    finally:
        gate.set()
        agent.stop()
        thread.join(60)


def held_image(registry) -> tuple[str, threading.Event]:
    """An image of the registry whose layer is sent half, the rest only once the event is set."""
    gate = threading.Event()
    ref = registry.publish("runplane/prefetch-stall", os.urandom(4 * MiB))
    layer = registry.layer.rsplit("/", 1)[1]
    held = Held(registry.blobs[layer][0])
    held.gate = gate
    registry.blobs[layer] = (held, registry.blobs[layer][1])
    return ref, gate


@pytest.mark.parametrize("limit", ["stall", "whole"])
def test_a_prefetch_gives_up_a_pull_that_stalls(docker_client, registry, caplog, limit):
    """A registry that stops sending does not hold a new worker in its prefetch: the pull is given
    up once the engine has said nothing for the stall limit, or once the whole prefetch's time is up
    (the images after it are not begun), and the worker goes on with its layer still held."""
    ref, gate = held_image(registry)
    later = f"{registry.host}/runplane/never-begun:1"
    bounds = {"stall_seconds": 2.0} if limit == "stall" else {"stall_seconds": 600.0, "limit_seconds": 3.0}
    prefetch = Prefetch(docker_client, [ref, later], every=0.2, **bounds)
    seen: list[Pulling | None] = []
    done = threading.Event()
    failed: list[str] = []
    thread = threading.Thread(target=lambda: (failed.extend(prefetch.run(seen.append, threading.Event())), done.set()))
    try:
        thread.start()
        assert done.wait(60), "the prefetch waited on the stalled registry"
        assert not gate.is_set()  # ended while its layer was still held
        assert ref in failed and seen[-1] is None
        given_up = [r.getMessage() for r in caplog.records if f"prefetch of image {ref} given up" in r.getMessage()]
        if limit == "stall":
            assert given_up and "sent nothing for 2s" in given_up[0], given_up
            assert failed == [ref, later]  # the next image was tried (its registry has none)
        else:
            assert given_up and "ran out of time" in given_up[0], given_up
            assert failed == [ref, later]
            assert not any(f"prefetch of image {later}" in r.getMessage() for r in caplog.records)  # never begun
    finally:
        gate.set()
        thread.join(60)


def test_a_prefetch_gives_up_on_a_registry_that_never_answers(docker_client, caplog):
    """A registry that takes the connection and says nothing: the engine answers nothing either
    until its own limits pass (15s a try); the prefetch gives up at its stall limit, not theirs."""
    listener = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []

    def take() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                taken.append(listener.accept()[0])

    threading.Thread(target=take, daemon=True).start()
    image = f"127.0.0.1:{listener.getsockname()[1]}/runplane/silent:1"
    try:
        assert Prefetch(docker_client, [image], stall_seconds=2.0).run(lambda _: None, threading.Event()) == [image]
        assert taken  # the engine did ask the registry
        said = [r.getMessage() for r in caplog.records if f"prefetch of image {image} given up" in r.getMessage()]
        assert said and "sent nothing for 2s" in said[0], said
    finally:
        listener.close()
        for connection in taken:
            connection.close()
