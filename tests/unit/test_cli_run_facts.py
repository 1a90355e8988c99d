"""What ``runplane status`` says of a run's pieces, its pools to fall back to and its checkpoint."""

from datetime import UTC, datetime
from typing import cast

from runplane.api.models import RunView
from runplane.api.views import run_view
from runplane.cli.run_facts import checkpoint_text, fallback_text, pieces_text
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.units import format_size
from runplane.ports import Ports

RUN = RunView.model_config["json_schema_extra"]["examples"][0]  # type: ignore[index]
NOW = datetime(2026, 11, 23, 10, 30, 0, tzinfo=UTC).timestamp()


def view(spec: dict, **fields) -> RunView:
    return RunView.model_validate({**RUN, "spec": {"command": "train", **spec}, **fields})


PIECES = {"checkpoint": {"interval": 600, "exit_code": 85}}


def test_pieces_count_the_one_going_and_a_finished_run_says_how_many_it_went_in():
    first = view(PIECES, state="running", started_at="2026-11-23T10:00:00Z", pieces=0)
    assert pieces_text(first) == "piece 1 of at most 100 (exit code 85 starts it again)"
    third = view({"checkpoint": {"exit_code": 85, "max_pieces": 7}}, state="running", pieces=2)
    assert pieces_text(third) == "piece 3 of at most 7 (exit code 85 starts it again)"
    ended = {"state": "succeeded", "started_at": "2026-11-23T10:00:00Z", "finished_at": "2026-11-23T10:20:00Z"}
    assert pieces_text(view(PIECES, pieces=2, **ended)) == "went in 3 pieces"
    assert pieces_text(view(PIECES, pieces=0, **ended)) == "went in 1 piece"
    never = view(PIECES, state="killed", finished_at="2026-11-23T10:20:00Z")  # killed while queued
    assert pieces_text(never) is None
    assert pieces_text(view({"checkpoint": {"interval": 600}}, state="running")) is None


FALLBACK = {"queue": "spot", "fallback": ["ondemand"], "fallback_after": 15}


def test_fallback_names_the_pools_in_order_the_one_it_is_on_and_when_it_moves_on():
    queued = view(FALLBACK, state="queued", queue="spot", fallback_at="2026-11-23T10:30:12Z")
    assert fallback_text(queued, NOW) == (
        "pools spot → ondemand (now on spot); moves on after 15s queued; next move at 10:30:12 UTC (in 12s)"
    )
    moved = view(FALLBACK, state="running", queue="ondemand")
    assert fallback_text(moved, NOW) == "pools spot → ondemand (now on ondemand, the last)"
    both = {**FALLBACK, "fallback": ["ondemand", "cpu"], "fallback_after_preemptions": 3}
    preempted = view(both, state="running", queue="spot", preemptions=2)
    assert fallback_text(preempted, NOW) == (
        "pools spot → ondemand → cpu (now on spot); moves on after 15s queued or 3 preemptions there "
        "(preempted 2 times on spot)"
    )
    assert fallback_text(view({}, state="queued"), NOW) is None


def test_a_checkpoint_says_its_size_in_powers_of_1024_and_when_it_was_synced():
    synced = {"seq": 7, "attempt": 2, "files": 12, "bytes": 3_250_586, "synced_at": "2026-11-23T10:29:20Z"}
    shown = view(PIECES, state="running", checkpoint=synced)
    assert checkpoint_text(shown, NOW) == "7 (12 files, 3.1 MiB), synced 10:29:20 UTC (40s ago) by attempt 2"
    older = view(PIECES, checkpoint={**synced, "synced_at": "2026-11-21T08:00:00Z", "series": "r-source"})
    assert checkpoint_text(older, NOW) == (
        "7 of run r-source (12 files, 3.1 MiB), synced 2026-11-21 08:00:00 UTC (2d2h30m ago) by attempt 2"
    )
    assert checkpoint_text(view(PIECES, state="queued"), NOW) == (
        "none synced yet (synced every 10m and whenever the command exits)"
    )
    assert [format_size(n) for n in (1, 1023, 1024, 5 * 1024**3)] == ["1 byte", "1023 bytes", "1.0 KiB", "5.0 GiB"]


def test_the_view_shows_preemptions_and_the_fallback_time_of_a_queued_run_only():
    spec = RunSpec.model_validate({"command": "train", "queue": ["spot", "ondemand"], "fallback_after_preemptions": 3})
    queued = Run(id="r-1", owner="alice", queue="spot", spec=spec, created_at=NOW, fallback_at=NOW + 60, preemptions=2)
    shown = run_view(cast(Ports, None), queued)  # nothing of the stores is read for a queued run not kept
    assert (shown.preemptions, shown.fallback_at) == (2, datetime.fromtimestamp(NOW + 60, UTC))
    running = queued.model_copy(update={"state": RunState.RUNNING})
    assert run_view(cast(Ports, None), running).fallback_at is None  # a started run no longer falls back by time
