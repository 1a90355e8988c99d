"""What the backends share: worker ids and job names, the stack settings handed to agents,
which environment names hold credentials (never passed to workers as plain values), and
absolute paths."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Annotated

from pydantic import AfterValidator

CREDENTIAL_NAMES = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_CLIENT_SECRET",
        "AZURE_CLIENT_CERTIFICATE_PASSWORD",
        "AZURE_PASSWORD",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_CONNECTION_STRING",
        "RUNPLANE_AZURE_STORAGE_CONNECTION_STRING",
        "RUNPLANE_AZURE_BATCH_ACCOUNT_KEY",
    }
)


def new_worker_id(pool: str) -> str:
    """A fresh worker id of ``pool``: ``<pool>-<8 hex>``."""
    return f"{pool}-{uuid.uuid4().hex[:8]}"


def job_name(pool: str, worker_id: str) -> str:
    """The engine-side name of a worker's job (Slurm, AWS Batch; Azure Batch's display name)."""
    return f"runplane-{pool}--{worker_id}"


def worker_of(name: str, pool: str) -> str | None:
    """The worker id in a job name of ``pool``, or None for anyone else's job (worker ids start
    with their pool's name, so pool ``a`` never claims the jobs of pool ``a-``)."""
    prefix = job_name(pool, "")
    worker_id = name[len(prefix) :]
    return worker_id if name.startswith(prefix) and worker_id.startswith(f"{pool}-") else None


def stack_environment(environ: Mapping[str, str], hide_credentials: bool) -> dict[str, str]:
    """What an agent needs to find the stack: the ``RUNPLANE_*`` settings of ``environ``, less
    the agent arguments (they go on its command line) and, with ``hide_credentials``, less the
    credentials (for engines whose workers have an identity of their own)."""
    return {
        k: v
        for k, v in environ.items()
        if k.startswith("RUNPLANE_") and k != "RUNPLANE_AGENT_ARGS" and not (hide_credentials and k in CREDENTIAL_NAMES)
    }


def credentials_in(names: Iterable[str]) -> list[str]:
    """The credential names among ``names``, sorted (empty when there are none)."""
    return sorted(CREDENTIAL_NAMES & set(names))


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not an absolute path")
    return path


AbsolutePath = Annotated[str, AfterValidator(_absolute)]
