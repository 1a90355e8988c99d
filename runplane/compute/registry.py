"""The compute backends, one entry each: the model of a pool's ``options``, the one ``options(pool)``
that checks them, the builder of its ``ComputeBackend`` and the extra that brings its SDK.

Every backend is a package of the same files: ``options.py`` (its options model and ``options(pool)``,
no SDK import, so that pools are checked wherever they load) and ``compute.py`` (its
``ComputeBackend`` and ``build(settings)``, which may import the SDK). The domain's ``Backend`` type
is the one spelling of their names: ``BACKENDS`` is keyed by it (tests/unit/test_backend_registry.py
holds the keys to it), and a backend gets its ``name`` from its key when it is built. A new backend
is its package, one entry here and its name there.

A backend whose extra is not installed is switched off: building it raises InvalidRequest with the
one line of ``runplane.extras.requirement`` (the pip command that installs it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

from pydantic import BaseModel

from runplane import extras
from runplane.backend import ComputeBackend
from runplane.compute.aws_batch import options as aws_batch
from runplane.compute.azure_batch import options as azure_batch
from runplane.compute.kubernetes import options as kubernetes
from runplane.compute.local import options as local
from runplane.compute.slurm import options as slurm
from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Backend, Pool
from runplane.settings import StackSettings


@dataclass(frozen=True)
class BackendEntry:
    """One backend: ``options(pool)`` returns the pool's options as ``model`` or raises
    InvalidRequest naming the pool and every bad option; ``extra`` is the pip extra it needs (None:
    nothing beyond the core). Its ``compute`` module is the ``compute.py`` beside ``model``'s."""

    model: type[BaseModel]
    options: Callable[[Pool], BaseModel]
    extra: str | None

    @property
    def compute(self) -> str:
        """The module whose ``build(settings)`` makes the backend (it imports the backend's SDK)."""
        return self.model.__module__.rpartition(".")[0] + ".compute"


BACKENDS: Mapping[Backend, BackendEntry] = MappingProxyType(
    {
        "local": BackendEntry(local.LocalOptions, local.options, "agent"),
        "slurm": BackendEntry(slurm.SlurmOptions, slurm.options, None),
        "aws-batch": BackendEntry(aws_batch.AwsBatchOptions, aws_batch.options, "aws"),
        "kubernetes": BackendEntry(kubernetes.KubernetesOptions, kubernetes.options, "kubernetes"),
        "azure-batch": BackendEntry(azure_batch.AzureBatchOptions, azure_batch.options, "azure-batch"),
    }
)
"""Every backend by its name, the one spelling of which is the domain's ``Backend``."""


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
    # imported now, never at import: the compute module imports the backend's SDK, which a
    # deployment without the backend's extra lacks (no circle: it does not import this module)
    backend: ComputeBackend = importlib.import_module(found.compute).build(settings)
    backend.name = name
    return backend


def check_pool(pool: Pool) -> BaseModel:
    """``pool``'s options, checked by its backend (what ``load_pools`` runs on every pool as the
    pools load). Raises InvalidRequest: ``pool P: bad <backend> options: a: ...; b: ...``."""
    return entry(pool.backend).options(pool)
