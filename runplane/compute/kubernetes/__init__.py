"""The ``kubernetes`` backend: each worker is a ``batch/v1`` Job running the agent image."""
