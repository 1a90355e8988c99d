"""The ``slurm`` backend: each worker is a Slurm batch job running the agent, submitted with
sbatch or through slurmrestd."""
