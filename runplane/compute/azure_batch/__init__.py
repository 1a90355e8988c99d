"""The ``azure-batch`` backend: each worker is an Azure Batch container task running the agent."""

from runplane.compute.azure_batch.compute import AzureBatchCompute, stack_environment, task_request
from runplane.compute.azure_batch.options import AzureBatchOptions, parse_options
from runplane.compute.azure_batch.rest import API_VERSION, BatchClient, BatchServiceError

__all__ = [
    "API_VERSION",
    "AzureBatchCompute",
    "AzureBatchOptions",
    "BatchClient",
    "BatchServiceError",
    "parse_options",
    "stack_environment",
    "task_request",
]
