"""Workers as Slurm batch jobs, through the sbatch/squeue/scancel commands.

Pool ``options`` (all optional): ``partition``, ``account``, ``constraint``, ``nodelist``,
``exclude``, ``gpu_type`` (for ``--gres=gpu:TYPE:N``), ``time`` (the worker job's wall time, e.g.
``"1-00:00:00"``), ``python`` (the interpreter on the nodes; default this one), ``sbatch_args``
(a list of extra arguments), ``log_dir`` (where job output goes; default ~/.runplane/slurm).
"""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from runplane.domain.errors import BackendError
from runplane.domain.models import Pool
from runplane.ports import BackendJob, ComputeBackend

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "RESIZING": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
}


def job_name(pool: str, worker_id: str) -> str:
    return f"runplane-{pool}--{worker_id}"


def job_script(pool: Pool, worker_id: str, agent_args: Sequence[str], python: str, log_dir: str) -> str:
    """The sbatch script that starts one worker agent for ``pool``.

    The job asks for one worker's shape, gets SIGTERM a minute before its time limit (the agent
    then hands its runs back), and passes Slurm's GPU allocation down as ``--gpuset``.
    """
    o = pool.options
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name={job_name(pool.name, worker_id)}",
        f"#SBATCH --cpus-per-task={max(1, math.ceil(pool.cpus))}",
        f"#SBATCH --mem={max(1, pool.memory // 2**20)}M",
        f"#SBATCH --output={log_dir}/{worker_id}.log",
        "#SBATCH --signal=B:TERM@60",
    ]
    if pool.gpus:
        kind = o.get("gpu_type") or pool.gpu_type
        lines.append(f"#SBATCH --gres=gpu:{kind}:{pool.gpus}" if kind else f"#SBATCH --gres=gpu:{pool.gpus}")
    for key in ("partition", "account", "constraint", "nodelist", "exclude", "time"):
        if o.get(key):
            lines.append(f"#SBATCH --{key}={o[key]}")
    lines += [f"#SBATCH {arg}" for arg in o.get("sbatch_args", [])]
    agent = " ".join(
        shlex.quote(a)
        for a in [python, "-m", "worker_agent", *agent_args, "--id", worker_id, "--pass-down-termination"]
    )
    lines += [
        "# the GPUs Slurm gave this job, and no others",
        'gpus="${SLURM_JOB_GPUS:-}"',
        f'exec {agent} ${{gpus:+--gpuset "$gpus"}}',
        "",
    ]
    return "\n".join(lines)


class SlurmCompute(ComputeBackend):
    name = "slurm"

    def __init__(
        self,
        python: str = sys.executable,
        runner: Runner = subprocess.run,
        log_dir: str = "~/.runplane/slurm",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.python = python
        self.runner = runner
        self.log_dir = str(Path(log_dir).expanduser())
        self.clock = clock

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return self.runner(args, input=stdin, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            raise BackendError(f"{args[0]} failed: {e}") from e

    def launch(self, pool: Pool, count: int, agent_args: Sequence[str]) -> list[BackendJob]:
        log_dir = pool.options.get("log_dir") or self.log_dir
        Path(log_dir).expanduser().mkdir(parents=True, exist_ok=True)
        jobs: list[BackendJob] = []
        for _ in range(count):
            worker_id = f"{pool.name}-{uuid.uuid4().hex[:8]}"
            script = job_script(pool, worker_id, agent_args, pool.options.get("python") or self.python, log_dir)
            done = self._run(["sbatch", "--parsable"], stdin=script)
            if done.returncode != 0:
                raise BackendError(f"sbatch refused the worker job: {done.stderr.strip()}", jobs=jobs)
            job_id = done.stdout.strip().split(";")[0]
            jobs.append(BackendJob(job_id, pool.name, "pending", worker_id, self.clock(), {"script": script}))
        return jobs

    def list(self, pool: Pool) -> list[BackendJob]:
        done = self._run(["squeue", "--noheader", "--format=%i|%j|%T|%V"])
        if done.returncode != 0:
            raise BackendError(f"squeue failed: {done.stderr.strip()}")
        return parse_squeue(done.stdout, pool.name)

    def cancel(self, pool: Pool, job_id: str) -> None:
        done = self._run(["scancel", job_id])  # SIGTERM, then SIGKILL after KillWait: the agent hands back
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise BackendError(f"scancel {job_id} failed: {done.stderr.strip()}")


def parse_squeue(text: str, pool: str) -> list[BackendJob]:
    """Jobs of ``pool`` from ``squeue --format=%i|%j|%T|%V`` output, pending or running only."""
    prefix = f"runplane-{pool}--"
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[1].startswith(prefix):
            continue
        job_id, name, state, submitted = parts
        mapped = STATES.get(state.split()[0])
        if mapped is None:
            continue
        jobs.append(BackendJob(job_id, pool, mapped, name[len(prefix) :], _when(submitted), {"slurm_state": state}))
    return jobs


def _when(text: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()  # squeue prints local time without a zone
    except ValueError:
        return 0.0
