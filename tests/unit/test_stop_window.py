"""A preemption notice's moment: read from EC2's and Azure's notices, and how it cuts a run's grace
and final sync when it is handed back."""

from __future__ import annotations

import pytest

from worker_agent.preemption import azure_not_before, ec2_time
from worker_agent.stop_window import GRACE_SHARE, MARGIN_SECONDS, cut_grace, earlier, final_sync_seconds, stop_by

# -- reading the moment -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("2017-09-18T08:22:00Z", 1505722920.0),  # as EC2 writes it
        ("2017-09-18T08:22:00+00:00", 1505722920.0),
        ("2017-09-18T10:22:00+02:00", 1505722920.0),
        ("2017-09-18T08:22:00", 1505722920.0),  # no zone: UTC, as EC2 means it
    ],
)
def test_ec2_time_is_read_as_utc(value, seconds):
    assert ec2_time(value) == seconds


@pytest.mark.parametrize("value", [None, "", "  ", "soon", "2017-13-40T08:22:00Z", 1505722920, ["2017-09-18"]])
def test_ec2_time_that_is_not_one_is_unknown(value):
    assert ec2_time(value) is None


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("Mon, 19 Sep 2016 18:29:47 GMT", 1474309787.0),  # as Azure writes it
        ("Mon, 19 Sep 2016 20:29:47 +0200", 1474309787.0),
    ],
)
def test_azure_not_before_is_read_as_an_http_date(value, seconds):
    assert azure_not_before(value) == seconds


@pytest.mark.parametrize("value", [None, "", " ", "now", "Mon, 45 Foo 2016 99:29:47 GMT", "2016-09-19T18:29:47Z", 5])
def test_azure_not_before_empty_or_garbage_is_unknown(value):
    assert azure_not_before(value) is None


# -- the stop's window --------------------------------------------------------------------------


def test_stop_by_is_the_moment_less_the_margin_on_the_executors_clock():
    # the executor's clock reads 500 while the epoch's reads 1000: the machine goes 60 s from now
    assert stop_by(1060.0, now=500.0, wall=1000.0) == 500.0 + 60 - MARGIN_SECONDS
    assert stop_by(None, now=500.0, wall=1000.0) is None


def test_earlier_keeps_the_known_sooner_moment():
    assert earlier(None, None) is None
    assert earlier(5.0, None) == earlier(None, 5.0) == 5.0
    assert earlier(7.0, 5.0) == 5.0


def test_grace_is_cut_to_its_share_of_what_is_left_before_the_notices_moment():
    assert cut_grace(75.0, by=140.0, now=100.0) == 40 * GRACE_SHARE  # 30 s, not the 75 s of the rule and budget
    assert cut_grace(10.0, by=140.0, now=100.0) == 10.0  # a shorter grace stays: never longer than today's cap
    assert cut_grace(75.0, by=None, now=100.0) == 75.0  # an unknown moment changes nothing
    assert cut_grace(75.0, by=90.0, now=100.0) == 0.0  # past it: signalled, then stopped at once


def test_final_sync_ends_by_the_notices_moment_within_the_stop_budget():
    # upload deadline 300, stop budget 100 asked at 100: 70 s left of the budget at 130
    assert final_sync_seconds(300.0, 100.0, asked=100.0, by=None, now=130.0) == 70.0
    assert final_sync_seconds(300.0, 100.0, asked=100.0, by=140.0, now=130.0) == 10.0
    assert final_sync_seconds(300.0, 100.0, asked=100.0, by=120.0, now=130.0) == 0.0
    assert final_sync_seconds(300.0, 100.0, asked=None, by=None, now=130.0) == 300.0  # no stop: the run ended
    # the grace's share and the sync's rest add up to what was left: the whole stop ends by the moment
    grace = cut_grace(75.0, by=140.0, now=100.0)
    assert grace + final_sync_seconds(300.0, 1000.0, 100.0, 140.0, 100.0 + grace) == 40.0
