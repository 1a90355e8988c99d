import json
from pathlib import Path

from runplane.compute.slurm.cli import parse_squeue
from runplane.compute.slurm.jobs import backend_job, job_script, job_spec, rest_job
from runplane.domain.pools import Pool

GPU_POOL = {
    "name": "gpu",
    "backend": "slurm",
    "cpus": 7.5,
    "gpus": 2,
    "gpu_type": "a100",
    "memory": "64g",
    "default_image": "x",
}
PLACEMENT = {"partition": "gpu", "account": "lab", "constraint": "ib", "exclude": "n3", "time": "1-00:00:00"}


def test_job_script_is_exact():
    pool = Pool.model_validate({**GPU_POOL, "options": {**PLACEMENT, "sbatch_args": ["--qos=high"]}})
    script = job_script(pool, "gpu-1234", ["--pool", "gpu", "--slots", "1"], "/opt/runplane/bin/python", "/logs")
    assert (
        script
        == """#!/bin/sh
#SBATCH --job-name=runplane-gpu--gpu-1234
#SBATCH --cpus-per-task=8
#SBATCH --mem=65536M
#SBATCH --output=/logs/gpu-1234.log
#SBATCH --signal=B:TERM@60
#SBATCH --gres=gpu:a100:2
#SBATCH --partition=gpu
#SBATCH --account=lab
#SBATCH --constraint=ib
#SBATCH --exclude=n3
#SBATCH --time=1-00:00:00
#SBATCH --qos=high
# the GPUs Slurm gave this job, and no others
gpus="${SLURM_JOB_GPUS:-}"
exec /opt/runplane/bin/python -m worker_agent --stop-budget-seconds 15 --pool gpu --slots 1 --id gpu-1234 \
--pass-down-termination ${gpus:+--gpuset "$gpus"}
""".replace("\\\n", "")
    )


def test_the_agents_stop_budget_fits_in_the_clusters_kill_wait():
    pool = Pool.model_validate({**GPU_POOL, "options": {"kill_wait_seconds": 120}})
    script = job_script(pool, "gpu-1234", ["--pool", "gpu"], "python3", "/logs")
    assert " -m worker_agent --stop-budget-seconds 100 --pool gpu " in script  # 20 s left to hand back and exit


def test_rest_job_carries_what_the_sbatch_lines_say():
    options = {
        **PLACEMENT,
        "nodelist": "n1",
        "rest_url": "unix:/run/slurmrestd.sock",
        "job_fields": {"qos": "high"},
        "environment": {"HTTPS_PROXY": "http://127.0.0.1:3128"},
    }
    pool = Pool.model_validate({**GPU_POOL, "options": options})
    spec = job_spec(pool, "gpu-1234", "/logs")
    assert rest_job(spec, {"PATH": "/bin", **spec.environment}) == {
        "name": "runplane-gpu--gpu-1234",
        "cpus_per_task": 8,
        "memory_per_node": 65536,
        "standard_output": "/logs/gpu-1234.log",
        "current_working_directory": "/logs",
        "environment": {"PATH": "/bin", "HTTPS_PROXY": "http://127.0.0.1:3128"},
        "gres": "gpu:a100:2",
        "partition": "gpu",
        "account": "lab",
        "constraints": "ib",
        "nodelist": "n1",
        "exclude_nodes": "n3",
        "time_limit": "1-00:00:00",
        "qos": "high",
    }


def test_a_cpu_pool_asks_for_no_gres_and_a_pool_gpu_type_falls_back():
    cpu = Pool.model_validate({**GPU_POOL, "gpus": 0, "options": {}})
    assert "gres" not in rest_job(job_spec(cpu, "gpu-1", "/l"), {})
    assert "--gres" not in job_script(cpu, "gpu-1", [], "python", "/l")
    untyped = Pool.model_validate({**GPU_POOL, "gpu_type": None, "options": {}})
    assert job_spec(untyped, "gpu-1", "/l").gres == "gpu:2"
    overridden = Pool.model_validate({**GPU_POOL, "options": {"gpu_type": "h100"}})
    assert job_spec(overridden, "gpu-1", "/l").gres == "gpu:h100:2"


def test_parse_squeue_keeps_this_pools_live_jobs():
    out = """17|runplane-cpu--cpu-aa|RUNNING|2026-11-22T10:00:00|None
18|runplane-cpu--cpu-bb|PENDING|2026-11-22T10:00:05|Resources
19|runplane-cpu--cpu-cc|CANCELLED|2026-11-22T10:00:06|None
20|runplane-cpu2--cpu2-dd|RUNNING|2026-11-22T10:00:07|None
21|someone-else|RUNNING|2026-11-22T10:00:08|None
22|runplane-cpu--cpu-ee|FAILED|2026-11-22T10:00:09|NonZeroExitCode
"""
    jobs = [b for j in parse_squeue(out) if (b := backend_job(j, "cpu", "sbatch")) is not None]
    assert [(j.id, j.worker_id, j.state, j.detail.get("reason")) for j in jobs] == [
        ("17", "cpu-aa", "running", None),
        ("18", "cpu-bb", "pending", None),
        ("19", "cpu-cc", "finished", None),
        ("22", "cpu-ee", "failed", "NonZeroExitCode"),
    ]
    assert [j.state for j in jobs if j.alive] == ["running", "pending"]


INFRA = Path(__file__).resolve().parents[2] / "infra" / "slurm"
DOCUMENTED = {
    "name": "a100",
    "backend": "slurm",
    "cpus": 16,
    "gpus": 4,
    "gpu_type": "a100",
    "memory": "200g",
    "default_image": "my/cuda:12",
    "options": {"partition": "gpu", "account": "mylab", "time": "1-00:00:00"},
}
DOCUMENTED_ARGS = ["--pool", "a100", "--slots", "1", "--idle-seconds", "600"]


def test_the_templates_in_infra_slurm_are_what_the_backend_submits():
    pool = Pool.model_validate(DOCUMENTED)
    python, logs = "/opt/runplane/bin/python", "/shared/runplane/slurm"
    script = job_script(pool, "a100-0123abcd", DOCUMENTED_ARGS, python, logs)
    assert (INFRA / "worker.sbatch").read_text() == script
    submission = json.loads((INFRA / "worker-submit.json").read_text())
    spec = job_spec(pool, "a100-0123abcd", logs)
    assert submission == {"job": rest_job(spec, submission["job"]["environment"]), "script": script}
    assert set(submission["job"]["environment"]) == {"PATH", "RUNPLANE_PREFIX", "RUNPLANE_AWS_REGION"}
