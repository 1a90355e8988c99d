from runplane.compute.slurm.compute import job_script, parse_squeue
from runplane.domain.models import Pool


def test_job_script_is_exact():
    pool = Pool.model_validate(
        {
            "name": "gpu",
            "backend": "slurm",
            "cpus": 7.5,
            "gpus": 2,
            "gpu_type": "a100",
            "memory": "64g",
            "default_image": "x",
            "options": {
                "partition": "gpu",
                "account": "lab",
                "constraint": "ib",
                "exclude": "n3",
                "time": "1-00:00:00",
                "sbatch_args": ["--qos=high"],
            },
        }
    )
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
exec /opt/runplane/bin/python -m worker_agent --pool gpu --slots 1 --id gpu-1234 --pass-down-termination \
${gpus:+--gpuset "$gpus"}
""".replace("\\\n", "")
    )


def test_parse_squeue_keeps_this_pools_live_jobs():
    out = """17|runplane-cpu--cpu-aa|RUNNING|2026-11-22T10:00:00
18|runplane-cpu--cpu-bb|PENDING|2026-11-22T10:00:05
19|runplane-cpu--cpu-cc|CANCELLED|2026-11-22T10:00:06
20|runplane-cpu2--cpu2-dd|RUNNING|2026-11-22T10:00:07
21|someone-else|RUNNING|2026-11-22T10:00:08
"""
    jobs = parse_squeue(out, "cpu")
    assert [(j.id, j.worker_id, j.state) for j in jobs] == [("17", "cpu-aa", "running"), ("18", "cpu-bb", "pending")]
