"""The ``aws-batch`` backend: each worker is an AWS Batch job running the agent image."""

from runplane.compute.aws_batch.compute import AwsBatchCompute, job_definition_request, submit_job_request

__all__ = ["AwsBatchCompute", "job_definition_request", "submit_job_request"]
