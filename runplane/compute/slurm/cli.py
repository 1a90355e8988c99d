"""Slurm through its commands: sbatch, squeue, scancel, run where the dispatcher runs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from datetime import datetime

from runplane.compute.slurm.jobs import JobSpec, SlurmJob
from runplane.domain.errors import BackendError

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
SQUEUE_FORMAT = "%i|%j|%T|%V|%r"


class SbatchTransport:
    """Submits the script to ``sbatch`` (which reads its ``#SBATCH`` lines); the job inherits
    the dispatcher's environment with the pool's ``environment`` laid over it."""

    name = "sbatch"
    local = True  # the log directory is on this machine (or a file system it shares)

    def __init__(self, runner: Runner = subprocess.run, environ: Mapping[str, str] | None = None) -> None:
        self.runner = runner
        self.environ = environ

    def _run(
        self, args: list[str], stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        extra = {"env": dict(env)} if env is not None else {}
        try:
            return self.runner(args, input=stdin, capture_output=True, text=True, timeout=60, check=False, **extra)
        except (OSError, subprocess.SubprocessError) as e:
            raise BackendError(f"{args[0]} failed: {e}") from e

    def submit(self, spec: JobSpec, script: str) -> str:
        env = None  # sbatch passes its own environment down to the job
        if self.environ is not None or spec.environment:
            env = {**(os.environ if self.environ is None else self.environ), **spec.environment}
        done = self._run(["sbatch", "--parsable"], stdin=script, env=env)
        if done.returncode != 0:
            raise BackendError(f"sbatch refused the job: {done.stderr.strip()}")
        job_id = done.stdout.strip().split(";")[0]  # --parsable: ID or ID;CLUSTER
        if not (job_id.isascii() and job_id.isdigit()):
            raise BackendError(f"sbatch answered without a job id: {done.stdout.strip()!r}")
        return job_id

    def jobs(self) -> list[SlurmJob]:
        done = self._run(["squeue", "--noheader", f"--format={SQUEUE_FORMAT}"])
        if done.returncode != 0:
            raise BackendError(f"squeue failed: {done.stderr.strip()}")
        return parse_squeue(done.stdout)

    def job(self, job_id: str) -> SlurmJob | None:
        # every job the controller still holds, ended ones included: asking for one id makes
        # squeue fail for an id it does not know, which reads like any other failure
        done = self._run(["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"])
        if done.returncode != 0:
            raise BackendError(f"squeue failed: {done.stderr.strip()}")
        return next((job for job in parse_squeue(done.stdout) if job.id == job_id), None)

    def cancel(self, job_id: str) -> None:
        # SIGTERM, then SIGKILL after KillWait: the agent hands its runs back. --quiet: no error
        # for a job that has already ended or that the controller no longer knows.
        done = self._run(["scancel", "--quiet", job_id])
        if done.returncode != 0:
            raise BackendError(f"scancel {job_id} failed: {done.stderr.strip()}")


def parse_squeue(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue --format=%i|%j|%T|%V|%r`` output."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        job_id, name, state, submitted, reason = parts
        jobs.append(SlurmJob(job_id, name, state, reason, _when(submitted)))
    return jobs


def _when(text: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()  # squeue prints local time without a zone
    except ValueError:
        return 0.0
