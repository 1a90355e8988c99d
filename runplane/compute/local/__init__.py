"""The ``local`` backend: worker agents as processes on this machine."""

from runplane.compute.local.compute import LocalCompute

__all__ = ["LocalCompute"]
