"""What the backends share: worker ids and job names, the agent's command line, the stack settings
handed to agents, which environment names hold credentials (never passed to workers as plain
values), absolute paths, and the check of a pool's options against its backend's model."""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ValidationError

from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Pool

Options = TypeVar("Options", bound=BaseModel)

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


def agent_args_for(pool: Pool, extra: str = "") -> list[str]:
    """The agent command line every backend passes down to the workers of ``pool``."""
    args = ["--pool", pool.name, "--slots", str(pool.slots), "--idle-seconds", f"{pool.idle_seconds:g}"]
    if pool.runs_per_worker:
        args += ["--exit-after-num-runs", str(pool.runs_per_worker)]
    return args + shlex.split(extra)


STOP_MARGIN_SECONDS = 20.0
"""What an agent keeps of its kill window past its stop budget, to hand its runs back and exit (the
systemd unit's TimeoutStopSec=120 over the agent's default budget of 100 s)."""


def stop_budget_args(kill_window: float) -> list[str]:
    """The agent flag that fits its stop budget (a stopped run's checkpoint grace and final sync) in
    ``kill_window``, the seconds its engine gives it from SIGTERM to SIGKILL: the window less
    ``STOP_MARGIN_SECONDS``, and never less than half of it. Given before the operator's agent arguments,
    which may set the budget themselves (the last one given counts)."""
    budget = max(kill_window - STOP_MARGIN_SECONDS, kill_window / 2, 1.0)
    return ["--stop-budget-seconds", f"{budget:g}"]


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


def _problem(error: Any, known: str) -> str:
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown option {where!r}" + (f" (known: {known})" if len(error["loc"]) == 1 else "")
    if error["type"] == "missing":
        return f"{where}: required"
    cause = error.get("ctx", {}).get("error")
    message = str(cause) if cause is not None else str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def check_options(model: type[Options], pool: Pool) -> Options:
    """``pool.options`` checked against ``model`` (pydantic, ``extra="forbid"``). Raises
    InvalidRequest naming every problem: ``pool P: bad <backend> options: a: ...; b: ...``."""
    try:
        return model.model_validate(pool.options)
    except ValidationError as e:
        known = ", ".join(model.model_fields) or "none"
        problems = "; ".join(_problem(error, known) for error in e.errors())
        raise InvalidRequest(f"pool {pool.name}: bad {pool.backend} options: {problems}") from e
