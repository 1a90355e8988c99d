"""What a run's time on a worker is worth: GPU-seconds and cost, recorded by its agent as it runs
and at its end (``Usage.gpu_seconds``, ``Usage.cost``)."""

from __future__ import annotations

from dataclasses import dataclass

from runplane.domain.asks import Resources


@dataclass(frozen=True)
class Rates:
    """What an agent knows of its pool to charge runs: its workers' shape and their price."""

    cpus: float = 0.0
    gpus: int = 0
    memory: int = 0
    """Bytes of memory a worker has: the most an out_of_memory retry grows a run's limit to."""
    price_per_hour: float | None = None


def share(resources: Resources, rates: Rates) -> float:
    """The part of one worker a run of ``resources`` holds: the larger of its part of the worker's
    GPUs (none on a worker without GPUs) and its part of the worker's cpus."""
    gpus = resources.gpus / rates.gpus if rates.gpus else 0.0
    cpus = resources.cpus / rates.cpus if rates.cpus else 0.0
    return max(gpus, cpus)


def charge(resources: Resources, rates: Rates, seconds: float) -> tuple[float, float | None]:
    """(GPU-seconds, cost) of ``seconds`` of a run of ``resources`` on a worker of ``rates``: its
    GPUs times the seconds, and the price of an hour of the worker times the hours times its
    ``share`` (None without a price)."""
    seconds = max(0.0, seconds)
    cost = None if rates.price_per_hour is None else rates.price_per_hour * seconds / 3600 * share(resources, rates)
    return resources.gpus * seconds, cost
