"""The ``options`` of an ``aws-batch`` pool.

Pool ``options``:

- ``job_queue`` (required): the Batch job queue the workers are submitted to.
- ``image``: the agent image (default ``runplane/agent:local``); its entrypoint is
  ``runplane-agent``.
- ``job_role_arn``: the IAM role the worker container runs as. Credentials come from this role
  (the container credentials endpoint); AWS keys are never put in a job definition.
- ``work_dir``: a host path mounted at the same path in the agent container (default
  ``/var/lib/runplane``). The agent starts run containers through the host's Docker engine,
  which bind-mounts run directories by host path: the path must be the same on both sides.
- ``docker_socket``: the host's Docker socket (default ``/var/run/docker.sock``), mounted at
  ``/var/run/docker.sock``.
- ``environment``: extra environment for the worker container (settings such as
  ``RUNPLANE_AGENT_*`` flags, not credentials: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``
  and ``AWS_SESSION_TOKEN`` are refused).
- ``tags``: extra tags for the job definition and the jobs.
- ``stop_timeout_seconds``: SIGTERM to SIGKILL of a worker's container when its job is terminated:
  the ECS agent's ``ECS_CONTAINER_STOP_TIMEOUT`` on the compute environment's instances (default 30 s;
  raise it in their launch template's ``/etc/ecs/ecs.config``, and here). The agent's stop budget is
  fitted in it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runplane.compute.options import AbsolutePath, check_options, credentials_in
from runplane.domain.pools import Pool

DEFAULT_IMAGE = "runplane/agent:local"
DEFAULT_WORK_DIR = "/var/lib/runplane"
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
DEFAULT_STOP_TIMEOUT = 30
"""ECS's own ECS_CONTAINER_STOP_TIMEOUT (a job terminated: SIGTERM, then SIGKILL 30 s later)."""


class AwsBatchOptions(BaseModel):
    """The ``options`` of an aws-batch pool (docs/pools.md)."""

    # built at its first check: pools load the models of the backends they use only
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    job_queue: str = Field(min_length=1)
    image: str = DEFAULT_IMAGE
    job_role_arn: str | None = None
    work_dir: AbsolutePath = DEFAULT_WORK_DIR
    docker_socket: AbsolutePath = DEFAULT_DOCKER_SOCKET
    environment: dict[str, str] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    stop_timeout_seconds: int = Field(default=DEFAULT_STOP_TIMEOUT, ge=0)

    @field_validator("environment")
    @classmethod
    def _no_credentials(cls, env: dict[str, str]) -> dict[str, str]:
        secrets = credentials_in(env)
        if secrets:
            raise ValueError(
                f"must not hold credentials ({', '.join(secrets)}); give the workers a job_role_arn instead"
            )
        return env


def options(pool: Pool) -> AwsBatchOptions:
    """The pool's options, checked. Raises InvalidRequest naming every problem found."""
    return check_options(AwsBatchOptions, pool)
