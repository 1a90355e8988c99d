"""The ``azure-batch`` backend: each worker is an Azure Batch container task running the agent."""
