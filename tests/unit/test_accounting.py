"""What a run's time on a worker is charged: GPU-seconds and its share of the worker's price."""

import pytest

from runplane.domain.accounting import Rates, charge, share
from runplane.domain.asks import Resources

GPU_BOX = Rates(cpus=32, gpus=8, price_per_hour=24.0)


@pytest.mark.parametrize(
    ("resources", "rates", "expected"),
    [
        (Resources(cpus=4, gpus=2), GPU_BOX, 0.25),  # 2 of 8 GPUs outweighs 4 of 32 cpus
        (Resources(cpus=16, gpus=1), GPU_BOX, 0.5),  # half the cpus outweighs 1 of 8 GPUs
        (Resources(cpus=1), Rates(cpus=2), 0.5),  # a pool without GPUs: its cpus alone
        (Resources(cpus=2, gpus=1), Rates(cpus=2), 1.0),
    ],
)
def test_a_runs_share_is_the_larger_of_its_gpus_and_its_cpus(resources, rates, expected):
    assert share(resources, rates) == expected


def test_gpu_seconds_and_cost_of_an_hour_and_a_half():
    gpu_seconds, cost = charge(Resources(cpus=4, gpus=2), GPU_BOX, 5400)
    assert gpu_seconds == 10800
    assert cost == pytest.approx(24.0 * 1.5 * 0.25)


def test_a_pool_without_a_price_charges_gpu_seconds_only():
    assert charge(Resources(cpus=1, gpus=1), Rates(cpus=8, gpus=4), 60) == (60, None)
    assert charge(Resources(cpus=1), Rates(cpus=8), 60) == (0, None)
    assert charge(Resources(cpus=1), Rates(cpus=8, price_per_hour=0), 60) == (0, 0)


def test_no_time_is_charged_nothing():
    assert charge(Resources(cpus=1, gpus=1), GPU_BOX, -3) == (0, 0)
