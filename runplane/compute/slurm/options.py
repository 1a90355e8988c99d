"""The ``options`` of a slurm pool, checked once per call with a clear error."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runplane.compute.options import check_options, credentials_in
from runplane.domain.pools import Pool

DEFAULT_KILL_WAIT = 30
"""Slurm's own KillWait (slurm.conf): SIGTERM to SIGKILL of a cancelled job."""


class SlurmOptions(BaseModel):
    """What a pool with ``backend: slurm`` may set in ``options``.

    Without ``rest_url`` workers are submitted with ``sbatch`` on the dispatcher's machine; with
    it, through slurmrestd (``http(s)://HOST:PORT`` with a JWT, or ``unix:/PATH`` with local auth).
    """

    # built at its first check: pools load the models of the backends they use only
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True, defer_build=True)

    partition: str | None = None
    account: str | None = None
    constraint: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    gpu_type: str | None = None
    time: str | None = None
    python: str | None = None
    log_dir: str | None = None
    sbatch_args: list[str] = Field(default_factory=list)
    environment: dict[str, str] = Field(default_factory=dict)
    rest_url: str | None = None
    jwt_token_file: str | None = None
    jwt_user: str | None = None
    job_fields: dict[str, Any] = Field(default_factory=dict)
    kill_wait_seconds: int = Field(default=DEFAULT_KILL_WAIT, ge=0)
    """The cluster's KillWait: the agent's stop budget is fitted in it (``stop_budget_args``)."""

    @field_validator("environment")
    @classmethod
    def _no_credentials(cls, env: dict[str, str]) -> dict[str, str]:
        secrets = credentials_in(env)
        if secrets:
            raise ValueError(
                f"must not hold credentials ({', '.join(secrets)}); point AWS_SHARED_CREDENTIALS_FILE at a file "
                "on the nodes or give them an instance profile"
            )
        return env

    @field_validator("rest_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if url.startswith("unix:"):
            if not url[len("unix:") :].startswith("/"):
                raise ValueError(f"{url!r}: a unix socket is written unix:/absolute/path")
            return url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r}: expected http://HOST:PORT, https://HOST:PORT or unix:/PATH")
        if parts.query or parts.fragment:
            raise ValueError(f"{url!r}: no query or fragment, please")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _transport(self) -> SlurmOptions:
        if self.rest_url is None:
            for name in ("jwt_token_file", "jwt_user", "job_fields"):
                if getattr(self, name):
                    raise ValueError(f"{name} needs rest_url (it applies to slurmrestd only)")
            return self
        if self.sbatch_args:
            raise ValueError("sbatch_args apply to sbatch only; with rest_url give extra job fields in job_fields")
        if self.jwt_user and not self.jwt_token_file:
            raise ValueError("jwt_user needs jwt_token_file")
        if not self.rest_url.startswith("unix:") and not self.jwt_token_file:
            raise ValueError("slurmrestd over TCP authenticates with a JWT: set jwt_token_file")
        return self

    @property
    def uses_rest(self) -> bool:
        return self.rest_url is not None


def options(pool: Pool) -> SlurmOptions:
    """The checked options of ``pool``; raises InvalidRequest naming each bad option."""
    return check_options(SlurmOptions, pool)
