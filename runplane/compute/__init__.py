"""Compute backends, one package each. A backend whose SDK is missing is switched off."""

from __future__ import annotations

import importlib.util
import shlex
from collections.abc import Callable

from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Pool
from runplane.ports import ComputeBackend
from runplane.settings import StackSettings


def _local(settings: StackSettings) -> ComputeBackend:
    from runplane.compute.local import LocalCompute  # imported on demand: backends are optional

    return LocalCompute(settings.local_state_dir)


def _slurm(settings: StackSettings) -> ComputeBackend:
    # Pools with rest_url talk to slurmrestd; the others need sbatch/squeue/scancel on PATH, and
    # a missing command is a BackendError naming it when such a pool is dispatched.
    from runplane.compute.slurm import SlurmCompute

    return SlurmCompute()


def _aws_batch(settings: StackSettings) -> ComputeBackend:
    from runplane.adapters.aws.clients import AwsConfig, make_client
    from runplane.compute.aws_batch import AwsBatchCompute

    return AwsBatchCompute(
        make_client("batch", AwsConfig(region=settings.aws_region, endpoint_url=settings.aws_endpoint_url))
    )


def _kubernetes(settings: StackSettings) -> ComputeBackend:
    if importlib.util.find_spec("kubernetes") is None:
        raise InvalidRequest(
            "compute backend 'kubernetes' needs the kubernetes package: pip install 'runplane[kubernetes]'"
        )
    from runplane.compute.kubernetes import KubernetesCompute

    # Each pool picks its cluster (options kubeconfig/context, else the in-cluster config); a
    # config that cannot be loaded fails that pool's calls with InvalidRequest.
    return KubernetesCompute()


def _azure_batch(settings: StackSettings) -> ComputeBackend:
    try:
        from runplane.compute.azure_batch import AzureBatchCompute
    except ImportError as e:
        raise InvalidRequest(
            "compute backend 'azure-batch' needs azure-core: pip install 'runplane[azure-batch]'"
        ) from e
    return AzureBatchCompute.from_settings(settings)


BUILDERS: dict[str, Callable[[StackSettings], ComputeBackend]] = {
    "local": _local,
    "slurm": _slurm,
    "aws-batch": _aws_batch,
    "kubernetes": _kubernetes,
    "azure-batch": _azure_batch,
}


def build_backend(name: str, settings: StackSettings) -> ComputeBackend:
    builder = BUILDERS.get(name)
    if builder is None:
        raise InvalidRequest(f"compute backend {name!r} is not available in this installation")
    return builder(settings)


def agent_args_for(pool: Pool, extra: str = "") -> list[str]:
    """The agent command line every backend passes down to the workers of ``pool``."""
    args = ["--pool", pool.name, "--slots", str(pool.slots), "--idle-seconds", f"{pool.idle_seconds:g}"]
    if pool.runs_per_worker:
        args += ["--exit-after-num-runs", str(pool.runs_per_worker)]
    return args + shlex.split(extra)
