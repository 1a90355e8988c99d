"""The ``slurm`` backend: each worker is a Slurm batch job running the agent."""

from runplane.compute.slurm.compute import SlurmCompute, job_script

__all__ = ["SlurmCompute", "job_script"]
