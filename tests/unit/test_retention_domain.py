"""Retention settings as an operator writes them, and the dates and due times of a finished run."""

import math

import pytest
from pydantic import ValidationError

from runplane.domain.pools import Pool
from runplane.domain.retention import Retention, RunRetention, dates, purge_due, ttl_at
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.settings import StackSettings

DAY = 86400.0


def test_durations_forever_and_bounds():
    r = Retention.model_validate({"outputs": "30d", "logs": "12h", "runs": "400d", "uploads": "forever"})
    assert (r.outputs, r.logs, r.runs, r.uploads) == (30 * DAY, 12 * 3600, 400 * DAY, math.inf)
    assert r.seconds("uploads") is None and r.seconds("outputs") == 30 * DAY
    for bad in ({"outputs": "5m"}, {"logs": "soon"}, {"runs": True}, {"outputs": "40000000d"}, {"other": "1d"}):
        with pytest.raises(ValidationError):
            Retention.model_validate(bad)
    with pytest.raises(ValidationError, match="longer than the run's record"):
        Retention.model_validate({"outputs": "31d", "runs": "30d"})


def test_a_pool_overrides_the_stack_field_by_field():
    stack = StackSettings(retention='{"outputs": "30d", "runs": "180d", "uploads": "14d"}').kept()
    pool = Pool(name="gpu", cpus=1, memory=1024**3, default_image="x", retention={"outputs": "forever"})
    kept = pool.kept(stack)
    assert (kept.seconds("outputs"), kept.seconds("runs"), kept.seconds("logs")) == (None, 180 * DAY, None)
    assert Pool(name="cpu", cpus=1, memory=1024**3, default_image="x").kept(stack) == stack
    with pytest.raises(ValidationError, match="stack's"):
        Pool(name="gpu", cpus=1, memory=1024**3, default_image="x", retention={"uploads": "1d"})
    with pytest.raises(ValidationError):
        StackSettings(retention='{"outputs": "1 week"}')
    assert not StackSettings().kept().sets_any


def _finished(**update):
    run = Run(id="r1", owner="a", queue="q", spec=RunSpec(command="x"), created_at=100.0)
    return run.model_copy(update={"state": RunState.SUCCEEDED, "finished_at": 1000.0, **update})


def test_dates_go_with_the_record_and_the_due_time_follows_them():
    kept = Retention.model_validate({"outputs": "2d", "runs": "10d"})
    checked = dates(1000.0, kept, now=2000.0)
    assert (checked.outputs_at, checked.logs_at, checked.record_at) == (
        1000 + 2 * DAY,
        1000 + 10 * DAY,
        1000 + 10 * DAY,
    )
    assert purge_due(_finished()) == 1000.0  # not looked at yet: due from its end
    assert purge_due(_finished(retention=checked)) == 1000 + 2 * DAY
    gone = checked.model_copy(update={"deleted": ["outputs", "logs"]})
    assert purge_due(_finished(retention=gone)) == 1000 + 10 * DAY
    assert ttl_at(_finished(retention=gone)) > 1000 + 10 * DAY
    # nothing left to delete: out of the index (no rewrite every so often), and no store expiry
    forever = RunRetention(checked_at=5000.0)
    assert purge_due(_finished(retention=forever)) is None and ttl_at(_finished(retention=forever)) is None
    outputs_only = RunRetention(checked_at=5000.0, outputs_at=1000 + 2 * DAY)
    assert purge_due(_finished(retention=outputs_only)) == 1000 + 2 * DAY
    assert purge_due(_finished(retention=outputs_only.model_copy(update={"deleted": ["outputs"]}))) is None
    assert purge_due(_finished(retention=checked, kept=True)) is None and ttl_at(_finished(kept=True)) is None
    assert purge_due(_finished(state=RunState.RUNNING)) is None


def test_a_record_dated_after_its_date_leaves_the_sweep_its_days_before_the_stores_expiry():
    late = RunRetention(checked_at=1000 + 30 * DAY, outputs_at=1000 + 2 * DAY, record_at=1000 + 10 * DAY)
    assert ttl_at(_finished(retention=late)) >= 1000 + 30 * DAY + 86400
