"""Which registry an image is from, which login a run pulls it with, and how the engine's refusals
read (worker_agent/registries.py). The engine's messages below were captured from the Docker engine
of this machine answering for Debian's docker-registry with htpasswd authentication (tests/registry.py),
except Docker Hub's, which is the engine's own text (moby distribution/errors.go)."""

import json

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
from runplane.domain.states import RunState
from worker_agent.registries import LoginUnavailable, RegistryLogins, refused, registry_of
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
