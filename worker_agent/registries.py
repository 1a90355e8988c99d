"""Which login a run's image is pulled with, and how a registry's refusal reads.

A run's image is pulled (and a cached copy of it checked, images.py) with, in this order: the
run's own ``image_pull_secret``; else its pool's ``registries`` entry for the image's registry (a
group's secret, for runs of that group's members; or the worker's own cloud identity, ``ecr`` or
``acr``); else no login of runplane's (the worker's own Docker configuration, if any, as before).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import docker.errors

from runplane.domain.pools import RegistryLogin
from runplane.domain.runs import Run
from runplane.domain.secrets import (
    DOCKER_HUB,
    RegistryCredentials,
    SecretRef,
    SecretUnavailable,
    group_scope,
    registry_host,
)
from worker_agent.secrets import RunSecrets

DEFAULT_REGISTRY = DOCKER_HUB
"""The registry of an image whose name has no registry host (Docker Hub)."""

Provider = Callable[[str], RegistryCredentials]
"""A login the worker gets for a registry with its own cloud identity, by the registry's host
(worker_agent/ecr.py, acr.py); raises SecretUnavailable saying why there is none."""

REFUSALS = (
    "unauthorized",
    "no basic auth credentials",
    "authentication required",
    "pull access denied",
    "denied: requested access",
    "access to the resource is denied",
)
"""What the engine says when a registry refused the credentials it was given, or their absence
(captured from a registry with htpasswd authentication; Docker Hub's from the engine's source:
tests/unit/test_registries.py). The engine reports most as HTTP 500 with the registry's words, so
only the words tell a refusal from a missing image or a registry that cannot be reached."""


def registry_of(image: str) -> str:
    """The registry host of ``image``, by Docker's rule: the first component of its name is a host
    when there is a '/' after it and it holds a '.' or a ':', is ``localhost``, or has capitals;
    otherwise the image is Docker Hub's (``docker.io``). Named as ``registry_host`` names a pool's
    ``server`` and a Docker config's ``auths`` keys: lower-cased, Hub's other names as ``docker.io``."""
    name = image.partition("@")[0]
    first, slash, _ = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        return registry_host(first)
    return DEFAULT_REGISTRY


RATE_LIMITS = ("toomanyrequests", "too many requests", "rate limit")
"""What the engine says when a registry limits how often it is asked (Docker Hub's anonymous pull
limit: "toomanyrequests: You have reached your pull rate limit")."""


def _words(error: Exception) -> str:
    return (str(error.explanation or error) if isinstance(error, docker.errors.APIError) else str(error)).lower()


def rate_limited(error: Exception) -> bool:
    """Whether an engine error says the registry limits how often it is asked: a passing refusal,
    of no login and no image in particular (it is not ``refused``)."""
    if isinstance(error, docker.errors.APIError) and error.status_code == 429:
        return True
    return any(words in _words(error) for words in RATE_LIMITS)


def refused(error: Exception) -> bool:
    """Whether an engine error says the registry refused the credentials (or asked for some).
    Docker Hub's refusal comes as a 404 ("pull access denied ... repository does not exist or may
    require 'docker login'"): Hub says the same of a repository that does not exist, and of one
    the login may not read, so that one reads as a refusal too (``hub_denied`` tells it apart)."""
    if rate_limited(error):
        return False
    if isinstance(error, docker.errors.APIError) and error.status_code in (401, 403):
        return True
    return any(words in _words(error) for words in REFUSALS)


def hub_denied(error: Exception) -> bool:
    """Whether the refusal is Docker Hub's "pull access denied", which it gives alike for a
    repository that does not exist and for one the login may not read."""
    return "pull access denied" in _words(error)


@dataclass(frozen=True)
class Login:
    """A login for ``server``; ``source`` names where it came from in messages (never the value)."""

    server: str
    credentials: RegistryCredentials = field(repr=False)
    source: str

    def auth_config(self) -> dict[str, str]:
        """The engine's ``auth_config`` (the ``X-Registry-Auth`` of a pull or a distribution check)."""
        return {
            "username": self.credentials.username,
            "password": self.credentials.password,
            "serveraddress": self.server,
        }


class LoginUnavailable(Exception):
    """The pool's login for a registry cannot be had (its group's secret gone, an ECR or ACR token
    refused); the message says which and why."""


class RegistryLogins:
    """The logins of one pool's runs: ``secrets`` opens secrets, ``registries`` are the pool's
    entries, ``providers`` the worker's cloud logins by kind (``"ecr"``, ``"acr"``)."""

    def __init__(
        self,
        secrets: RunSecrets,
        registries: Sequence[RegistryLogin] = (),
        providers: Mapping[str, Provider] | None = None,
    ) -> None:
        self.secrets = secrets
        self.registries = tuple(registries)
        self.providers = dict(providers or {})

    def for_run(self, run: Run, image: str) -> Login | None:
        """The login ``run`` pulls ``image`` with (None: none of runplane's). Raises
        SecretUnavailable when the run's own ``image_pull_secret`` cannot be used, and
        LoginUnavailable when the pool's login for the image's registry cannot be had."""
        server = registry_of(image)
        ref = run.spec.image_pull_secret
        if ref:
            return Login(server, self.secrets.registry_login(run, ref, server), f"secret {ref}")
        entry = self._entry(server)
        if entry is None:
            return None
        if entry.secret is not None and SecretRef.parse(entry.secret).group not in run.owner_groups:
            return None  # a group's login is for its members' runs
        return self._pool_login(entry, server)

    def for_pool(self, image: str) -> Login | None:
        """The pool's own login for ``image`` (a worker's prefetch, for no run in particular: a
        run still checks a cached image with its own login). Raises LoginUnavailable."""
        server = registry_of(image)
        entry = self._entry(server)
        return None if entry is None else self._pool_login(entry, server)

    def _entry(self, server: str) -> RegistryLogin | None:
        return next((r for r in self.registries if registry_host(r.server) == server), None)

    def _pool_login(self, entry: RegistryLogin, server: str) -> Login:
        try:
            if entry.secret is not None:
                ref = SecretRef.parse(entry.secret)
                group = ref.group or ""
                value = self.secrets.opened(
                    group_scope(group), ref.name, f"{entry.secret} (the pool's login for {server}) does not exist"
                )
                try:
                    credentials = RegistryCredentials.parse(value, entry.server)
                except ValueError as e:
                    raise SecretUnavailable(f"secret {entry.secret} {e}") from None
                return Login(server, credentials, f"the pool's secret {entry.secret}")
            kind = "ecr" if entry.ecr else "acr"
            provider = self.providers.get(kind)
            if provider is None:
                raise SecretUnavailable(f"this worker has no {kind.upper()} login")
            return Login(server, provider(entry.server), f"the worker's {kind.upper()} login")
        except SecretUnavailable as e:
            raise LoginUnavailable(f"the pool's login for registry {server} cannot be used: {e}") from None
