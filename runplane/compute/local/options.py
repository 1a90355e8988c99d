"""The ``options`` of a ``local`` pool: none. Its workers are agent processes on the machine
that runs the dispatcher; a pool that gives it options is refused (a typo meant for another
backend, most likely)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from runplane.compute.options import check_options
from runplane.domain.pools import Pool


class LocalOptions(BaseModel):
    """The ``options`` of a local pool (docs/pools.md): none."""

    # built at its first check: pools load the models of the backends they use only
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def options(pool: Pool) -> LocalOptions:
    """The pool's options, checked. Raises InvalidRequest naming every unknown one."""
    return check_options(LocalOptions, pool)
