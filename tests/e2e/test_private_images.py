"""Private images end to end on the local stack: a registry with authentication on loopback
(tests/registry.py), logins held in secrets, an agent that pulls. A run with ``image_pull_secret``
runs the image; one without ends ``image_unauthorized`` naming the registry; another user, with the
image already on the worker, ends the same way and their command never runs; a pool's login with a
group's secret lets the group's members pull with no ``image_pull_secret``."""

import time
from datetime import datetime

import pytest

from runplane.client import Client
from tests.conftest import POOLS_FILE, TERMINAL, wait_for, wait_state
from tests.registry import private_registry  # noqa: F401 (a fixture)

pytestmark = pytest.mark.docker


@pytest.fixture
def registry(private_registry, docker_client):  # noqa: F811
    private_registry.forget(docker_client)
    yield private_registry
    private_registry.forget(docker_client)


@pytest.fixture
def agent(agents, devstack, registry, tmp_path, docker_client):
    """An agent of pool "manual" that pulls, the pool logging in to the registry with group
    vision's secret regcred (a pools file of this test's own: the stack's own leaves manual bare)."""
    text = POOLS_FILE.read_text()
    assert text.count("\n  - name: manual\n") == 1
    pools = tmp_path / "pools.yaml"
    entry = f"    registries: [{{server: '{registry.server}', secret: vision/regcred}}]\n"
    pools.write_text(text.replace("\n  - name: manual\n", f"\n  - name: manual\n{entry}"))
    started = agents("--pull", "missing", "--idle-seconds", "120", env={"RUNPLANE_POOLS": str(pools)})
    workers = Client(devstack.api_url, "admin-token")
    wait_for(
        lambda: started.proc.poll() is not None or any(w["id"] == started.id for w in _workers(workers)),
        30,
        0.2,
        f"agent {started.id} to register",
    )
    assert started.proc.poll() is None, started.log.read_text()[-3000:]
    # The API holds a run's later fields to the pool's agents as the dispatcher last counted them:
    # once it has counted this one, what a submit is told no longer depends on the dispatcher's pace.
    registered = time.time()
    wait_for(lambda: _counted_since(workers, registered), 30, 0.2, "the dispatcher to count the agent")
    return started


def _counted_since(client, since):
    pool = next(p for p in client.request("GET", "/v1/pools")["pools"] if p["name"] == "manual")
    counted = pool["counted_at"] and datetime.fromisoformat(pool["counted_at"].replace("Z", "+00:00")).timestamp()
    return bool(counted) and counted >= since and sum(pool["agent_versions"].values()) >= 1


def _workers(client):
    return client.request("GET", "/v1/workers")["workers"]


def _outputs(client, run_id):
    return client.request("GET", f"/v1/runs/{run_id}/outputs")["files"]


def _logs(client, run_id):
    return client.request("GET", f"/v1/runs/{run_id}/logs", query={"stream": "stdout"})["data"]


def _refused(client, run, registry, words):
    done = wait_state(client, run["id"], TERMINAL, timeout=90)
    assert done["state"] == "failed", f"the run {done['state']}: {_logs(client, run['id'])!r}"
    assert done["failure"]["reason"] == "image_unauthorized", done["failure"]
    assert done["failure"]["message"].startswith(f"registry {registry.server} {words}")
    assert [e["state"] for e in done["events"] if e["state"]] == ["queued", "preparing", "failed"]
    assert _outputs(client, run["id"]) == []  # the command, which writes a file, never ran
    return done


COMMAND = 'echo "mark=$PRIVATE_MARK" > ran; echo "mark=$PRIVATE_MARK"'
"""What every run here runs: it prints the image's mark, and writes a file (an output) if it runs."""


def _ran(client, run, registry):
    done = wait_state(client, run["id"], TERMINAL, timeout=90)
    assert done["state"] == "succeeded", done.get("failure")
    assert _logs(client, run["id"]) == f"mark={registry.mark}\n"
    assert [f["path"] for f in _outputs(client, run["id"])] == ["ran"]
    return done


def test_a_pools_group_login_pulls_for_members_and_a_cached_image_is_refused_to_others(
    devstack, alice, bob, agent, registry, docker_client
):
    """alice (not in vision) is refused the pull; carol (group vision) pulls through the pool's
    login; then bob, with the image on the worker, is refused before his command runs."""
    admin = Client(devstack.api_url, "admin-token")
    carol = Client(devstack.api_url, "carol-token")
    admin.request("PUT", "/v1/groups/vision/secrets/regcred", {"value": registry.login()})
    body = {"command": COMMAND, "image": registry.image, "queue": "manual"}
    try:
        words = f"needs a login for image {registry.image}: give image_pull_secret"
        _refused(alice, alice.request("POST", "/v1/runs", body), registry, words)
        member = _ran(carol, carol.request("POST", "/v1/runs", body), registry)
        cached = docker_client.images.get(registry.image)  # carol's pull left it on the worker
        bobs = bob.request("POST", "/v1/runs", body)
        _refused(bob, bobs, registry, words)
        assert member["worker_id"] == wait_state(bob, bobs["id"], TERMINAL)["worker_id"] == agent.id
        assert docker_client.images.get(registry.image).id == cached.id  # still there: bob was refused it
    finally:
        admin.request("DELETE", "/v1/groups/vision/secrets/regcred")


def test_a_private_image_runs_with_its_pull_secret_only(devstack, alice, bob, agent, registry):
    """alice's run with her secret regcred runs the image; hers without it and bob's, after hers
    left the image on the worker, are refused before their command runs."""
    alice.request("PUT", "/v1/secrets/regcred", {"value": registry.login()})
    body = {"command": COMMAND, "image": registry.image, "queue": "manual"}
    try:
        _ran(alice, alice.request("POST", "/v1/runs", {**body, "image_pull_secret": "regcred"}), registry)
        _refused(alice, alice.request("POST", "/v1/runs", body), registry, "needs a login")
        _refused(bob, bob.request("POST", "/v1/runs", body), registry, "needs a login")
    finally:
        alice.request("DELETE", "/v1/secrets/regcred")
