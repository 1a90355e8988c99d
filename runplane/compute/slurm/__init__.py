"""The ``slurm`` backend: each worker is a Slurm batch job running the agent, submitted with
sbatch or through slurmrestd."""

from runplane.compute.slurm.compute import SlurmCompute
from runplane.compute.slurm.jobs import job_script
from runplane.compute.slurm.options import SlurmOptions

__all__ = ["SlurmCompute", "SlurmOptions", "job_script"]
