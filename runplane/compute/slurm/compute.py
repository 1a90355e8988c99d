"""Workers as Slurm batch jobs, submitted with ``sbatch`` or through slurmrestd.

Pool ``options`` (all optional; see ``SlurmOptions``): ``partition``, ``account``,
``constraint``, ``nodelist``, ``exclude``, ``gpu_type`` (for ``--gres=gpu:TYPE:N``), ``time``
(the worker job's wall time, e.g. ``"1-00:00:00"``), ``python`` (the interpreter on the nodes;
default this one), ``log_dir`` (where job output goes; default ~/.runplane/slurm),
``environment`` (extra variables for the worker job), ``sbatch_args`` (extra sbatch arguments).

With ``rest_url`` (``http(s)://HOST:PORT`` or ``unix:/PATH``) workers go through slurmrestd
instead of the commands: ``jwt_token_file`` (required over TCP) holds the JWT, ``jwt_user``
names its user (default: the token's own ``sun`` claim), ``job_fields`` adds job fields
(``{qos: high}``) where the command line path takes ``sbatch_args``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from runplane.backend import BackendJob, ComputeBackend
from runplane.compute.options import new_worker_id
from runplane.compute.slurm.cli import Runner, SbatchTransport
from runplane.compute.slurm.jobs import JobSpec, SlurmJob, backend_job, job_spec, render_script
from runplane.compute.slurm.options import SlurmOptions
from runplane.compute.slurm.options import options as pool_options
from runplane.compute.slurm.rest import RestTransport
from runplane.domain.errors import BackendError
from runplane.domain.pools import Pool
from runplane.settings import StackSettings


class SlurmTransport(Protocol):
    """One way into Slurm. Job ids are decimal strings."""

    name: str
    local: bool  # whether the job's log directory can be made from here

    def submit(self, spec: JobSpec, script: str) -> str:
        """Submit one job; its id. Raises BackendError with Slurm's message when refused."""

    def jobs(self) -> list[SlurmJob]:
        """Jobs the controller holds, at least every pending and running one."""

    def job(self, job_id: str) -> SlurmJob | None:
        """One job, ended ones included while the controller remembers them; None if unknown."""

    def cancel(self, job_id: str) -> None:
        """Cancel a job; quiet for an ended or unknown one."""


class SlurmCompute(ComputeBackend):
    def __init__(
        self,
        python: str = sys.executable,
        runner: Runner = subprocess.run,
        log_dir: str = "~/.runplane/slurm",
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.python = python
        self.log_dir = str(Path(log_dir).expanduser())
        self.clock = clock
        self.environ = environ
        self.sbatch = SbatchTransport(runner, environ)
        self._rest: dict[tuple[str, str | None, str | None], RestTransport] = {}

    def transport(self, options: SlurmOptions) -> SlurmTransport:
        """The way into Slurm that a pool's options choose."""
        if options.rest_url is None:
            return self.sbatch
        key = (options.rest_url, options.jwt_token_file, options.jwt_user)
        if key not in self._rest:
            self._rest[key] = RestTransport(*key, clock=self.clock, environ=self.environ)
        return self._rest[key]

    def launch(self, pool: Pool, count: int, agent_args: Sequence[str]) -> list[BackendJob]:
        options = pool_options(pool)
        transport = self.transport(options)
        log_dir = str(Path(options.log_dir).expanduser()) if options.log_dir else self.log_dir
        if transport.local:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        python = options.python or self.python
        jobs: list[BackendJob] = []
        for _ in range(count):
            worker_id = new_worker_id(pool.name)
            spec = job_spec(pool, worker_id, log_dir, options)
            script = render_script(spec, agent_args, python)
            try:
                job_id = transport.submit(spec, script)
            except BackendError as e:
                raise BackendError(f"pool {pool.name}: the worker job was not submitted: {e.message}", jobs=jobs) from e
            detail = {"script": script, "via": transport.name}
            jobs.append(BackendJob(job_id, pool.name, "pending", worker_id, self.clock(), detail))
        return jobs

    def list(self, pool: Pool) -> list[BackendJob]:
        transport = self.transport(pool_options(pool))
        found = (backend_job(job, pool.name, transport.name) for job in transport.jobs())
        return [job for job in found if job is not None and job.alive]

    def describe(self, pool: Pool, job_id: str) -> BackendJob | None:
        """The job while the controller remembers it (``MinJobAge`` after it ends): ended
        jobs are ``finished`` (COMPLETED, CANCELLED) or ``failed`` with Slurm's reason."""
        transport = self.transport(pool_options(pool))
        if not _is_job_id(job_id):
            return None
        job = transport.job(job_id)
        return backend_job(job, pool.name, transport.name) if job is not None else None

    def cancel(self, pool: Pool, job_id: str) -> None:
        transport = self.transport(pool_options(pool))
        if _is_job_id(job_id):  # anything else was never a job of ours (and must not reach scancel as an option)
            transport.cancel(job_id)


def _is_job_id(text: str) -> bool:
    return text.isascii() and text.isdigit()


def build(settings: StackSettings) -> SlurmCompute:
    """The backend of ``slurm`` pools. Pools with ``rest_url`` talk to slurmrestd; the others need
    sbatch/squeue/scancel on PATH, and a missing command is a BackendError naming it when such a
    pool is dispatched. Jobs get this process's environment with ``settings`` in it."""
    return SlurmCompute(environ=settings.exported(os.environ))
