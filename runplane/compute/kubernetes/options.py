"""Pool ``options`` of the ``kubernetes`` backend, checked before anything is sent to the API server.

Every option is typed and unknown keys are refused, so a misspelt option fails with a message
that names it instead of being ignored. Names of Kubernetes objects are checked against the
API server's own rules (DNS labels and subdomains).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runplane.compute.options import AbsolutePath, check_options, credentials_in
from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Pool

DEFAULT_WORK_DIR = "/var/lib/runplane"
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


ObjectName = Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN)]


class _Strict(BaseModel):
    # built at its first check: pools load the models of the backends they use only
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class NfsShare(_Strict):
    server: str = Field(min_length=1)
    path: AbsolutePath


class WorkDir(_Strict):
    """Where the agent keeps run directories and its input cache: exactly one of ``host_path``,
    ``nfs`` or ``pvc``, mounted in the agent container at ``mount_path``."""

    host_path: AbsolutePath | None = None
    nfs: NfsShare | None = None
    pvc: ObjectName | None = None
    mount_path: AbsolutePath | None = None

    @model_validator(mode="after")
    def _one_source(self) -> WorkDir:
        given = [k for k in ("host_path", "nfs", "pvc") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"work_dir needs exactly one of host_path, nfs or pvc (got {given or 'none'})")
        if self.host_path is not None and self.mount_path not in (None, self.host_path):
            # The node's Docker engine bind-mounts run directories by path: both sides must agree.
            raise ValueError("work_dir: with host_path the mount path is the host path; leave mount_path out")
        return self

    @property
    def path(self) -> str:
        """The agent's ``--work-dir``."""
        return self.host_path or self.mount_path or DEFAULT_WORK_DIR

    def volume(self, name: str) -> dict[str, Any]:
        if self.nfs is not None:
            return {"name": name, "nfs": {"server": self.nfs.server, "path": self.nfs.path}}
        if self.pvc is not None:
            return {"name": name, "persistentVolumeClaim": {"claimName": self.pvc}}
        return {"name": name, "hostPath": {"path": self.path, "type": "DirectoryOrCreate"}}


class Toleration(_Strict):
    """A pod toleration, in Kubernetes' own spelling."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds", ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("a toleration with operator Equal needs a key")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds only applies to effect NoExecute")
        return self

    def manifest(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class KubernetesOptions(_Strict):
    """Everything the ``kubernetes`` backend reads from a pool's ``options``."""

    image: str = Field(min_length=1, description="the agent image; its runplane-agent is started")
    namespace: Annotated[str, Field(pattern=DNS_LABEL)] = "default"
    kubeconfig: str | None = Field(default=None, min_length=1)
    context: str | None = Field(default=None, min_length=1)
    service_account: ObjectName | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    image_pull_secrets: list[ObjectName] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    env_from_secrets: list[ObjectName] = Field(default_factory=list)
    env_from_config_maps: list[ObjectName] = Field(default_factory=list)
    priority_class: ObjectName | None = None
    work_dir: WorkDir = WorkDir(host_path=DEFAULT_WORK_DIR)
    docker_socket: AbsolutePath = DEFAULT_DOCKER_SOCKET
    ttl_seconds_after_finished: int = Field(default=600, ge=0)
    active_deadline_seconds: int | None = Field(default=None, gt=0)
    termination_grace_seconds: int = Field(default=120, ge=0)
    """SIGTERM to SIGKILL of a worker's pod: the agent's stop budget is fitted in it (``stop_budget_args``)."""

    @field_validator("env")
    @classmethod
    def _plain_env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        secrets = credentials_in(env)
        if secrets:
            raise ValueError(
                f"must not hold credentials ({', '.join(secrets)}): put them in a Secret named in env_from_secrets"
            )
        return env

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, selector: dict[str, str]) -> dict[str, str]:
        for key, value in selector.items():
            if not key:
                raise ValueError("a node_selector key is empty")
            if value and not _LABEL_VALUE.match(value):
                raise ValueError(f"{value!r} is not a valid label value")
        return selector


def options(pool: Pool) -> KubernetesOptions:
    """The pool's options, checked. Raises InvalidRequest naming every problem found."""
    if not _LABEL_VALUE.match(pool.name):
        raise InvalidRequest(f"pool {pool.name}: a kubernetes pool's name must end with a letter or digit")
    return check_options(KubernetesOptions, pool)
