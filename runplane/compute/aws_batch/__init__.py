"""The ``aws-batch`` backend: each worker is an AWS Batch job running the agent image."""
