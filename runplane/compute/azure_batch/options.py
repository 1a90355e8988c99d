"""Pool ``options`` of the ``azure-batch`` backend, checked before anything is sent to Batch.

Unknown keys are refused (a misspelt option fails naming it instead of being ignored), ids are
checked against the Batch service's own rules, and nothing that looks like a credential may go
into a task's environment: Batch shows task environment settings to anyone who can read the job.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from runplane.compute.options import AbsolutePath, check_options, credentials_in
from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Pool
from runplane.domain.units import parse_duration

DEFAULT_IMAGE = "runplane/agent:local"
DEFAULT_WORK_DIR = "/var/lib/runplane"
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
BATCH_ID = r"^[A-Za-z0-9_-]{1,64}$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_IDENTITY = re.compile(
    r"^/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.managedidentity/userassignedidentities/[^/]+$",
    re.IGNORECASE,
)


def _identity(resource_id: str) -> str:
    if not _IDENTITY.match(resource_id):
        raise ValueError(
            "must be the ARM id of a user-assigned managed identity: /subscriptions/<id>/resourceGroups/<group>"
            "/providers/Microsoft.ManagedIdentity/userAssignedIdentities/<name>"
        )
    return resource_id


def _duration(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str | int | float) else value


IdentityId = Annotated[str, AfterValidator(_identity)]
BatchId = Annotated[str, Field(pattern=BATCH_ID)]


class _Strict(BaseModel):
    # built at its first check: pools load the models of the backends they use only
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Registry(_Strict):
    """Where the agent image is pulled from, with the pool's managed identity (ACR ``AcrPull``).
    Registries reached with a user name and password belong in the pool's own
    ``containerConfiguration.containerRegistries`` (pool.json), which pre-pulls the image."""

    server: str = Field(min_length=1, description="e.g. myregistry.azurecr.io")
    identity: IdentityId


class AzureBatchOptions(_Strict):
    """Everything the ``azure-batch`` backend reads from a pool's ``options``."""

    job_id: BatchId = Field(description="the Batch job the worker tasks are added to (it names the Batch pool)")
    batch_pool_id: BatchId | None = Field(default=None, description="the Batch pool of that job, for reference")
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="the agent image")
    registry: Registry | None = None
    container_run_options: str = Field(default="", description="extra `docker create` options for the agent")
    work_dir: AbsolutePath = DEFAULT_WORK_DIR
    docker_socket: AbsolutePath = DEFAULT_DOCKER_SOCKET
    required_slots: int = Field(default=1, ge=1, le=256, description="task slots one worker takes on a node")
    max_wall_clock: Annotated[float | None, BeforeValidator(_duration), Field(gt=0)] = None
    elevation_level: Literal["admin", "nonadmin"] = "admin"
    output_container_url: str | None = None
    output_identity: IdentityId | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    stop_timeout_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="SIGTERM to SIGKILL of the agent's container when it is stopped (its `--stop-timeout`): the "
        "agent's stop budget is fitted in it",
    )

    @field_validator("container_run_options")
    @classmethod
    def _shell_words(cls, value: str) -> str:
        try:
            shlex.split(value)
        except ValueError as e:
            raise ValueError(f"cannot split into words: {e}") from e
        return value

    @field_validator("output_container_url")
    @classmethod
    def _container_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        container = parts.path.strip("/")
        if parts.scheme != "https" or not parts.netloc or not container or "/" in container:
            raise ValueError("must be https://<account>.blob.core.windows.net/<container>[?<SAS token>]")
        return value

    @field_validator("environment")
    @classmethod
    def _environment(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        secrets = credentials_in(env)
        if secrets:
            raise ValueError(
                f"must not hold credentials ({', '.join(secrets)}): task environment settings are readable by "
                "anyone who can read the job; give the pool a managed identity instead"
            )
        return env

    def output_auth_ok(self) -> bool:
        """An upload destination needs a SAS token in its URL or an identity that may write."""
        return self.output_container_url is None or bool(
            self.output_identity or urlsplit(self.output_container_url).query
        )


def options(pool: Pool) -> AzureBatchOptions:
    """The pool's options, checked. Raises InvalidRequest naming every problem found."""
    options = check_options(AzureBatchOptions, pool)
    if not options.output_auth_ok():
        raise InvalidRequest(
            f"pool {pool.name}: bad azure-batch options: output_container_url needs a SAS token with write "
            "permission, or options.output_identity"
        )
    return options
