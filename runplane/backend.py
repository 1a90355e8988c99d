"""The port of compute engines: what starts and stops worker agents (one backend a package under
``runplane/compute``), and a worker as the engine sees it."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runplane.domain.pools import Pool


@dataclass(frozen=True)
class BackendJob:
    """A worker as the compute backend sees it."""

    id: str
    pool: str
    state: str  # pending | running | finished | failed
    worker_id: str
    created_at: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.state in ("pending", "running")


class ComputeBackend(abc.ABC):
    """Starts and stops worker agents on some compute engine."""

    name: str

    @abc.abstractmethod
    def launch(self, pool: Pool, count: int, agent_args: Sequence[str]) -> list[BackendJob]:
        """Start ``count`` workers for ``pool``, each running ``runplane-agent`` with ``agent_args``.

        Raises BackendError if the engine refuses; jobs started before the failure are returned
        in ``details['jobs']``.
        """

    @abc.abstractmethod
    def list(self, pool: Pool) -> list[BackendJob]:
        """Jobs of this pool that are pending or running."""

    @abc.abstractmethod
    def cancel(self, pool: Pool, job_id: str) -> None:
        """Stop a job. Idempotent and quiet when the job is already gone."""

    def describe(self, pool: Pool, job_id: str) -> BackendJob | None:
        """One job as the engine sees it now, or None when the engine does not know it.

        Never raises for an unknown id. Backends whose engine remembers ended jobs override
        this to report them as ``finished``/``failed`` with the engine's reason in
        ``detail['reason']`` (the dispatcher counts failed launches from it); the default
        only finds jobs that ``list`` still shows.
        """
        return next((job for job in self.list(pool) if job.id == job_id), None)
