"""The compute backends, one entry each: the model of a pool's ``options``, the one ``options(pool)``
that checks them, the builder of its ``ComputeBackend`` and the extra that brings its SDK.

Every backend is a package of the same files: ``options.py`` (its options model and ``options(pool)``,
no SDK import, so that pools are checked wherever they load) and ``compute.py`` (its
``ComputeBackend`` and ``build(settings)``, which may import the SDK). The domain's ``Backend`` type
names the same backends (tests/unit/test_backend_registry.py ties the two together): a new backend
is its package, one entry here and its name there.

A backend whose extra is not installed is switched off: building it raises InvalidRequest with the
one line of ``runplane.extras.requirement`` (the pip command that installs it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

from pydantic import BaseModel

from runplane import extras
from runplane.compute.aws_batch import options as aws_batch
from runplane.compute.azure_batch import options as azure_batch
from runplane.compute.kubernetes import options as kubernetes
from runplane.compute.local import options as local
from runplane.compute.slurm import options as slurm
from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Backend, Pool
from runplane.ports import ComputeBackend
from runplane.settings import StackSettings


@dataclass(frozen=True)
class BackendEntry:
    """One backend: ``options(pool)`` returns the pool's options as ``model`` or raises
    InvalidRequest naming the pool and every bad option; ``build(settings)`` makes the backend
    (its SDK imported then); ``extra`` is the pip extra it needs (None: nothing beyond the core)."""

    model: type[BaseModel]
    options: Callable[[Pool], BaseModel]
    build: Callable[[StackSettings], ComputeBackend]
    extra: str | None


# The builders import their compute module when called, never at import: that module imports the
# backend's SDK, which a deployment without the backend's extra lacks.
def _local(settings: StackSettings) -> ComputeBackend:
    from runplane.compute.local.compute import build

    return build(settings)


def _slurm(settings: StackSettings) -> ComputeBackend:
    from runplane.compute.slurm.compute import build

    return build(settings)


def _aws_batch(settings: StackSettings) -> ComputeBackend:
    from runplane.compute.aws_batch.compute import build

    return build(settings)


def _kubernetes(settings: StackSettings) -> ComputeBackend:
    from runplane.compute.kubernetes.compute import build

    return build(settings)


def _azure_batch(settings: StackSettings) -> ComputeBackend:
    from runplane.compute.azure_batch.compute import build

    return build(settings)


BACKENDS: Mapping[Backend, BackendEntry] = MappingProxyType(
    {
        "local": BackendEntry(local.LocalOptions, local.options, _local, "agent"),
        "slurm": BackendEntry(slurm.SlurmOptions, slurm.options, _slurm, None),
        "aws-batch": BackendEntry(aws_batch.AwsBatchOptions, aws_batch.options, _aws_batch, "aws"),
        "kubernetes": BackendEntry(kubernetes.KubernetesOptions, kubernetes.options, _kubernetes, "kubernetes"),
        "azure-batch": BackendEntry(azure_batch.AzureBatchOptions, azure_batch.options, _azure_batch, "azure-batch"),
    }
)


def entry(name: str) -> BackendEntry:
    """The backend called ``name``; InvalidRequest when there is none."""
    found = BACKENDS.get(cast("Backend", name))  # any text may be asked for: a pool file, a test
    if found is None:
        raise InvalidRequest(f"compute backend {name!r} is not known; the backends are: {', '.join(BACKENDS)}")
    return found


def build_backend(name: str, settings: StackSettings) -> ComputeBackend:
    """The backend ``name`` for ``settings``. Raises InvalidRequest for a name that is no backend
    and, with the pip command, for one whose extra is not installed."""
    found = entry(name)
    missing = extras.requirement(f"compute backend {name!r}", (found.extra,)) if found.extra else None
    if missing is not None:
        raise InvalidRequest(missing)
    return found.build(settings)


def check_pool(pool: Pool) -> BaseModel:
    """``pool``'s options, checked by its backend (what ``load_pools`` runs on every pool as the
    pools load). Raises InvalidRequest: ``pool P: bad <backend> options: a: ...; b: ...``."""
    return entry(pool.backend).options(pool)
