"""What both ways into Slurm share: the worker job's shape, its script, its name, and the
mapping of Slurm job states onto backend job states."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runplane.backend import BackendJob
from runplane.compute.options import job_name, stop_budget_args, worker_of
from runplane.compute.slurm.options import DEFAULT_KILL_WAIT, SlurmOptions
from runplane.compute.slurm.options import options as pool_options
from runplane.domain.pools import Pool

LIVE_STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",
    "REQUEUE_HOLD": "pending",
    "RESIZING": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "STOPPED": "running",
    "SUSPENDED": "running",
}
# Ended on purpose; every other ended state (FAILED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY,
# BOOT_FAIL, DEADLINE, PREEMPTED, ...) is a failure.
FINISHED_STATES = frozenset({"COMPLETED", "CANCELLED"})
# The warning the CLI path asks for: SIGTERM to the batch shell (the agent) a minute before
# the time limit. slurmrestd's v0.0.38 cannot express the B: flag.
WARNING_SIGNAL = "B:TERM@60"


def map_state(state: str) -> str:
    """pending | running | finished | failed for a Slurm job state (``CANCELLED by 0`` reads as CANCELLED)."""
    base = state.split()[0].upper() if state.strip() else ""
    if base in LIVE_STATES:
        return LIVE_STATES[base]
    return "finished" if base in FINISHED_STATES else "failed"


@dataclass(frozen=True)
class JobSpec:
    """One worker job as Slurm is asked for it, whichever way it is submitted."""

    name: str
    worker_id: str
    cpus: int
    memory_mb: int
    log_dir: str
    gres: str | None = None
    partition: str | None = None
    account: str | None = None
    constraint: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    time: str | None = None
    sbatch_args: tuple[str, ...] = ()
    job_fields: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    kill_wait: int = DEFAULT_KILL_WAIT
    """The cluster's KillWait: SIGTERM to SIGKILL of a cancelled job, which the agent's stop budget fits in."""

    @property
    def output(self) -> str:
        return f"{self.log_dir}/{self.worker_id}.log"


def job_spec(pool: Pool, worker_id: str, log_dir: str, options: SlurmOptions | None = None) -> JobSpec:
    """The worker job of ``pool``: one worker's shape plus the pool's placement options."""
    o = options or pool_options(pool)
    gres = None
    if pool.gpus:
        kind = o.gpu_type or pool.gpu_type
        gres = f"gpu:{kind}:{pool.gpus}" if kind else f"gpu:{pool.gpus}"
    return JobSpec(
        name=job_name(pool.name, worker_id),
        worker_id=worker_id,
        cpus=max(1, math.ceil(pool.cpus)),
        memory_mb=max(1, pool.memory // 2**20),
        log_dir=log_dir,
        gres=gres,
        partition=o.partition or None,
        account=o.account or None,
        constraint=o.constraint or None,
        nodelist=o.nodelist or None,
        exclude=o.exclude or None,
        time=o.time or None,
        sbatch_args=tuple(o.sbatch_args),
        job_fields=dict(o.job_fields),
        environment=dict(o.environment),
        kill_wait=o.kill_wait_seconds,
    )


def render_script(spec: JobSpec, agent_args: Sequence[str], python: str) -> str:
    """The batch script: ``#SBATCH`` lines (read by sbatch; slurmrestd takes the same values
    as job fields) and the agent, started with Slurm's GPU allocation as ``--gpuset``."""
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --cpus-per-task={spec.cpus}",
        f"#SBATCH --mem={spec.memory_mb}M",
        f"#SBATCH --output={spec.output}",
        f"#SBATCH --signal={WARNING_SIGNAL}",
    ]
    if spec.gres:
        lines.append(f"#SBATCH --gres={spec.gres}")
    for key in ("partition", "account", "constraint", "nodelist", "exclude", "time"):
        value = getattr(spec, key)
        if value:
            lines.append(f"#SBATCH --{key}={value}")
    lines += [f"#SBATCH {arg}" for arg in spec.sbatch_args]
    agent = " ".join(
        shlex.quote(a)
        for a in [
            *(python, "-m", "worker_agent", *stop_budget_args(spec.kill_wait), *agent_args),
            *("--id", spec.worker_id, "--pass-down-termination"),
        ]
    )
    lines += [
        "# the GPUs Slurm gave this job, and no others",
        'gpus="${SLURM_JOB_GPUS:-}"',
        f'exec {agent} ${{gpus:+--gpuset "$gpus"}}',
        "",
    ]
    return "\n".join(lines)


def job_script(pool: Pool, worker_id: str, agent_args: Sequence[str], python: str, log_dir: str) -> str:
    """The sbatch script that starts one worker agent for ``pool``.

    The job asks for one worker's shape, gets SIGTERM a minute before its time limit (the agent
    then hands its runs back), and passes Slurm's GPU allocation down as ``--gpuset``.
    """
    return render_script(job_spec(pool, worker_id, log_dir), agent_args, python)


def rest_job(spec: JobSpec, environment: Mapping[str, str]) -> dict[str, Any]:
    """The ``job`` of a slurmrestd v0.0.38 submission: the fields the script's ``#SBATCH``
    lines give sbatch (slurmrestd does not read them), with the job's whole environment.

    The early SIGTERM is left out: v0.0.38 only signals job steps, not the batch shell, so the
    agent gets SIGTERM at the time limit and KillWait to hand its runs back.
    """
    job: dict[str, Any] = {
        "name": spec.name,
        "cpus_per_task": spec.cpus,
        "memory_per_node": spec.memory_mb,
        "standard_output": spec.output,
        "current_working_directory": spec.log_dir,
        "environment": dict(environment),
    }
    fields = {
        "gres": spec.gres,
        "partition": spec.partition,
        "account": spec.account,
        "constraints": spec.constraint,
        "nodelist": spec.nodelist,
        "exclude_nodes": spec.exclude,
        "time_limit": spec.time,
    }
    job.update({k: v for k, v in fields.items() if v})
    job.update(spec.job_fields)
    return job


@dataclass(frozen=True)
class SlurmJob:
    """A job as Slurm reports it (squeue or slurmrestd), before it is read as a worker."""

    id: str
    name: str
    state: str
    reason: str
    submitted: float


def backend_job(job: SlurmJob, pool: str, via: str) -> BackendJob | None:
    """``job`` as a worker of ``pool``, or None when it is not one of that pool's jobs."""
    worker_id = worker_of(job.name, pool)
    if worker_id is None:
        return None
    state = map_state(job.state)
    detail: dict[str, Any] = {"slurm_state": job.state, "via": via}
    if state == "failed":
        detail["reason"] = job.reason if job.reason and job.reason != "None" else job.state
    return BackendJob(job.id, pool, state, worker_id, job.submitted, detail)
