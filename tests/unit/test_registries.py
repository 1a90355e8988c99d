"""Which registry an image is from, which login a run pulls it with, and how the engine's refusals
read (worker_agent/registries.py). The engine's messages below were captured from the Docker engine
of this machine answering for Debian's docker-registry with htpasswd authentication (tests/registry.py),
except Docker Hub's, which is the engine's own text (moby distribution/errors.go)."""

import base64
import json

import docker
import docker.errors
import pytest

from runplane.domain.pools import RegistryLogin
from runplane.domain.runs import Run, RunSpec
from runplane.domain.secrets import (
    RegistryCredentials,
    SecretRecord,
    SecretUnavailable,
    context,
    group_scope,
    user_scope,
)
from runplane.domain.states import FailureReason, RunState
from worker_agent.containers import pull_failure
from worker_agent.images import anonymous
from worker_agent.registries import Login, LoginUnavailable, RegistryLogins, rate_limited, refused, registry_of
from worker_agent.secrets import RunSecrets


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("busybox", "docker.io"),
        ("busybox:1.36", "docker.io"),
        ("library/busybox:1.36", "docker.io"),
        ("pytorch/pytorch:2.3.0-cuda12.1", "docker.io"),
        ("docker.io/pytorch/pytorch:2.3.0", "docker.io"),
        ("index.docker.io/library/busybox", "docker.io"),
        ("registry-1.docker.io/library/busybox", "docker.io"),
        ("ghcr.io/lab/train:v1", "ghcr.io"),
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io"),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1", "123456789012.dkr.ecr.us-east-1.amazonaws.com"),
        ("lab.azurecr.io/train@sha256:" + "a" * 64, "lab.azurecr.io"),
        ("127.0.0.1:5000/lab/private:1", "127.0.0.1:5000"),
        ("localhost/lab/private", "localhost"),
        ("localhost:5000/private", "localhost:5000"),
        ("Registry/lab/private", "registry"),  # a capital: a host, by Docker's rule
        ("registry/lab/private", "docker.io"),  # no '.', ':' or capital: a Hub user named registry
        ("localhost", "docker.io"),  # no '/': an image called localhost
        ("busybox@sha256:" + "b" * 64, "docker.io"),
    ],
)
def test_the_registry_of_an_image_follows_dockers_rule(image, registry):
    assert registry_of(image) == registry


# (what the engine raised, the registry's answer) as this machine's engine reported them
ANONYMOUS = docker.errors.APIError(
    "500", explanation='Head "http://127.0.0.1:15123/v2/lab/private/manifests/1": no basic auth credentials'
)
WRONG_PASSWORD_CHECK = docker.errors.APIError("401", explanation="unauthorized: authentication required")
WRONG_PASSWORD_PULL = docker.errors.APIError("500", explanation="unauthorized: authentication required")
HUB_DENIED = docker.errors.NotFound(
    "404",
    explanation="pull access denied for lab/private, repository does not exist or may require 'docker login': "
    "denied: requested access to the resource is denied",
)
MISSING_CHECK = docker.errors.NotFound("404", explanation="manifest unknown: manifest unknown")
MISSING_PULL = docker.errors.NotFound(
    "404", explanation="manifest for 127.0.0.1:15123/lab/private:2 not found: manifest unknown: manifest unknown"
)
UNREACHABLE = docker.errors.APIError(
    "500", explanation='Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused'
)
NO_SUCH_HOST = docker.errors.APIError(
    "500",
    explanation='Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on '
    "10.255.255.53:53: no such host",
)

# Docker Hub's anonymous pull limit, as the engine reports it (moby: the registry's 429 error text)
RATE_LIMITED = docker.errors.APIError(
    "500",
    explanation="toomanyrequests: You have reached your pull rate limit. You may increase the limit by "
    "authenticating and upgrading: https://www.docker.com/increase-rate-limit",
)


def _status(error, code):
    error.response = type("R", (), {"status_code": code, "reason": ""})()
    return error


@pytest.mark.parametrize(
    ("error", "is_refusal"),
    [
        (_status(ANONYMOUS, 500), True),
        (_status(WRONG_PASSWORD_CHECK, 401), True),
        (_status(WRONG_PASSWORD_PULL, 500), True),
        (_status(HUB_DENIED, 404), True),
        (_status(MISSING_CHECK, 404), False),
        (_status(MISSING_PULL, 404), False),
        (_status(UNREACHABLE, 500), False),
        (_status(NO_SUCH_HOST, 500), False),
        (_status(RATE_LIMITED, 500), False),
        (_status(docker.errors.APIError("500", explanation="open /var/lib/docker/x: permission denied"), 500), False),
    ],
)
def test_a_refusal_is_told_from_a_missing_image_and_an_unreachable_registry(error, is_refusal):
    assert refused(error) is is_refusal


LOGIN = json.dumps({"username": "labuser", "password": "labpass"})
SERVER = "127.0.0.1:5000"
IMAGE = f"{SERVER}/lab/private:1"


def _run(owner="alice", groups=(), pull_secret=None, image=IMAGE):
    spec = RunSpec(command="true", image=image, image_pull_secret=pull_secret)
    return Run(id="r-1", owner=owner, owner_groups=list(groups), queue="manual", created_at=0.0, spec=spec,
               state=RunState.PREPARING, attempt=1)  # fmt: skip


def _put(stack, scope, name, value):
    sealed = stack.sealer.seal(value.encode(), context(scope, name))
    stack.secrets.put(SecretRecord(scope=scope, name=name, sealed=sealed, updated_at=0.0, updated_by="t"))


@pytest.fixture
def logins(local_stack):
    """The pool's login for SERVER is group vision's secret regcred; alice has a regcred of her own."""
    _put(local_stack, user_scope("alice"), "regcred", json.dumps({"username": "alice", "password": "hers"}))
    _put(local_stack, group_scope("vision"), "regcred", LOGIN)
    secrets = RunSecrets(local_stack.secrets, local_stack.opener)
    return RegistryLogins(secrets, [RegistryLogin(server=SERVER, secret="vision/regcred")])


def test_a_runs_own_pull_secret_comes_first(logins):
    login = logins.for_run(_run(groups=["vision"], pull_secret="regcred"), IMAGE)
    assert (login.server, login.credentials.username, login.source) == (SERVER, "alice", "secret regcred")
    assert login.auth_config() == {"username": "alice", "password": "hers", "serveraddress": SERVER}
    assert "hers" not in repr(login) and "hers" not in repr(login.credentials)


def test_the_pools_group_login_is_for_the_groups_members_and_its_registry_only(logins):
    member = logins.for_run(_run(owner="carol", groups=["vision"]), IMAGE)
    assert (member.credentials.username, member.source) == ("labuser", "the pool's secret vision/regcred")
    assert logins.for_run(_run(owner="bob"), IMAGE) is None  # not in vision: no login of runplane's
    assert logins.for_run(_run(owner="carol", groups=["vision"]), "ghcr.io/lab/x:1") is None
    assert logins.for_pool(IMAGE).credentials.username == "labuser"  # a prefetch, for no run


def test_a_pull_secret_the_run_may_not_use_is_unavailable(logins):
    with pytest.raises(SecretUnavailable, match="vision/regcred does not exist"):
        logins.for_run(_run(owner="bob", pull_secret="vision/regcred"), IMAGE)
    with pytest.raises(SecretUnavailable, match="regcred does not exist"):
        logins.for_run(_run(owner="bob", pull_secret="regcred"), IMAGE)  # alice's reads as missing


def test_a_pool_login_that_cannot_be_had_says_so(local_stack):
    secrets = RunSecrets(local_stack.secrets, local_stack.opener)
    gone = RegistryLogins(secrets, [RegistryLogin(server=SERVER, secret="vision/regcred")])
    with pytest.raises(LoginUnavailable, match=f"registry {SERVER} cannot be used: secret vision/regcred"):
        gone.for_run(_run(owner="carol", groups=["vision"]), IMAGE)
    ecr = RegistryLogins(secrets, [RegistryLogin(server=SERVER, ecr=True)])
    with pytest.raises(LoginUnavailable, match="this worker has no ECR login"):
        ecr.for_run(_run(), IMAGE)
    asked = []
    given = RegistryLogins(
        secrets,
        [RegistryLogin(server=SERVER, acr=True)],
        {"acr": lambda server: asked.append(server) or RegistryCredentials.parse(LOGIN)},
    )
    assert given.for_run(_run(), IMAGE).source == "the worker's ACR login"
    assert asked == [SERVER]


def _auth(user, password):
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


# ~/.docker/config.json as `docker login` writes it (Hub under its v1 address), with entries other
# tools wrote (a scheme on ghcr.io, a path on a private registry) and the headers a client adds
DOCKER_CONFIG = {
    "auths": {
        "https://index.docker.io/v1/": _auth("hubuser", "hub-token"),
        "https://ghcr.io": _auth("ghuser", "ghp_token"),
        "nvcr.io": _auth("$oauthtoken", "nvapi-key"),
        "https://Registry.Lab.Example:5000/v2/": {"username": "lab", "password": "lab-pass"},
    },
    "HttpHeaders": {"User-Agent": "Docker-Client/24.0.7 (linux)"},
}


@pytest.mark.parametrize(
    ("server", "username"),
    [
        ("docker.io", "hubuser"),
        ("index.docker.io", "hubuser"),
        ("registry-1.docker.io", "hubuser"),
        ("ghcr.io", "ghuser"),
        ("GHCR.io", "ghuser"),
        ("nvcr.io", "$oauthtoken"),
        ("registry.lab.example:5000", "lab"),
    ],
)
def test_a_pasted_docker_config_gives_the_entry_of_the_images_registry(server, username):
    assert RegistryCredentials.parse(json.dumps(DOCKER_CONFIG), server).username == username
    assert RegistryCredentials.parse(json.dumps(DOCKER_CONFIG), registry_of(f"{server}/lab/x:1")).username == username


def test_a_docker_config_without_the_registry_says_so():
    with pytest.raises(ValueError, match=r"holds no auths entry for quay\.io") as raised:
        RegistryCredentials.parse(json.dumps(DOCKER_CONFIG), "quay.io")
    assert "token" not in str(raised.value)
    assert RegistryCredentials.parse(json.dumps(DOCKER_CONFIG), "https://index.docker.io/v1/").username == "hubuser"
    podman = {"auths": {"ghcr.io/lab": _auth("ghuser", "ghp_token")}}  # podman's auth.json: a namespace too
    assert RegistryCredentials.parse(json.dumps(podman), "quay.io").username == "ghuser"  # its one entry
    assert RegistryCredentials.parse(json.dumps(podman | DOCKER_CONFIG), "ghcr.io").username == "ghuser"


HUB_IMAGE = "lab/private:1"


@pytest.mark.parametrize("code", [500, 429])
def test_a_rate_limit_is_a_passing_failure_not_a_refusal(code):
    error = _status(docker.errors.APIError("x", explanation=RATE_LIMITED.explanation), code)
    assert rate_limited(error) and not refused(error)
    outcome = pull_failure(HUB_IMAGE, None, error, "could not be pulled")
    assert outcome.reason == FailureReason.IMAGE_NOT_FOUND
    assert outcome.message.startswith(
        "registry docker.io is limiting how often it is asked (a passing failure: a later try, or a login, "
        f"may get image {HUB_IMAGE}): toomanyrequests"
    )
    assert not rate_limited(_status(ANONYMOUS, 500)) and not rate_limited(_status(MISSING_PULL, 404))


def test_hubs_denial_without_a_login_says_the_image_may_not_exist():
    """Hub answers alike for a repository that does not exist and one that needs a login."""
    anonymous = pull_failure(HUB_IMAGE, None, _status(HUB_DENIED, 404), "could not be pulled")
    assert anonymous.reason == FailureReason.IMAGE_UNAUTHORIZED
    assert anonymous.message.startswith(
        f"image {HUB_IMAGE} does not exist on registry docker.io, or needs a login (give image_pull_secret) ("
    )
    who = Login("docker.io", RegistryCredentials.parse(LOGIN), "secret regcred")
    logged_in = pull_failure(HUB_IMAGE, who, _status(HUB_DENIED, 404), "could not be pulled")
    assert logged_in.message.startswith(
        f"image {HUB_IMAGE} does not exist on registry docker.io, or secret regcred may not pull it ("
    )
    private = pull_failure(IMAGE, None, _status(ANONYMOUS, 500), "could not be pulled")
    assert private.message.startswith(f"registry {SERVER} needs a login for image {IMAGE}: give image_pull_secret (")


def test_an_image_is_anonymous_unless_the_agents_docker_config_holds_a_login_for_its_registry(tmp_path, monkeypatch):
    """What a pull without a login of runplane's sends: the agent's own Docker configuration's
    login for the image's registry, if it holds one (then the image is not known to be public)."""
    (tmp_path / "config.json").write_text(json.dumps(DOCKER_CONFIG))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.43")  # never connects
    assert not anonymous(client, "pytorch/pytorch:2.3.0")  # Hub: `docker login`'s entry
    assert not anonymous(client, "ghcr.io/lab/train:1")
    assert anonymous(client, "quay.io/lab/train:1")
    assert anonymous(client, f"{SERVER}/lab/private:1")
