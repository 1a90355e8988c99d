"""The ``kubernetes`` backend: each worker is a ``batch/v1`` Job running the agent image."""

from runplane.compute.kubernetes.compute import KubernetesCompute, job_manifest, job_state, load_api_client
from runplane.compute.kubernetes.options import KubernetesOptions, parse_options

__all__ = ["KubernetesCompute", "KubernetesOptions", "job_manifest", "job_state", "load_api_client", "parse_options"]
