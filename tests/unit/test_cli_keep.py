"""What ``runplane keep`` and ``runplane status`` say of a run's retention: its dates (UTC, to the
minute), what is deleted already, what is kept for good, and a pin; what an empty download or log says
of parts retention deleted; ``runplane dev`` and ``serve`` refuse a
retention that cannot be read, before anything starts."""

from datetime import UTC, datetime, timedelta, timezone

from runplane.api.models import RunView
from runplane.cli.app import run_cli
from runplane.cli.common import deleted_by_retention, retention_settings
from runplane.cli.runs import keep_line, kept_until

RUN = RunView.model_config["json_schema_extra"]["examples"][0]  # type: ignore[index]
DAY = datetime(2026, 12, 29, 23, 30, tzinfo=UTC)


def view(**retention) -> RunView:
    shown = {"kept": False, "outputs_until": None, "logs_until": None, "record_until": None, "deleted": []}
    return RunView.model_validate({**RUN, "state": "succeeded", "retention": {**shown, **retention}})


def test_dates_deletions_and_for_good_are_said_part_by_part_to_the_minute_in_utc():
    dated = view(outputs_until=DAY, logs_until=DAY.replace(month=11), record_until=DAY.replace(year=2027))
    assert kept_until(dated) == (
        "outputs until 2026-12-29 23:30 UTC, logs until 2026-11-29 23:30 UTC, record until 2027-12-29 23:30 UTC"
    )
    assert keep_line(dated) == (
        f"let go: run {RUN['id']}: outputs deleted on 2026-12-29 23:30 UTC, logs deleted on 2026-11-29 23:30 UTC, "
        "record deleted on 2027-12-29 23:30 UTC"
    )
    elsewhere = view(outputs_until=DAY.astimezone(timezone(timedelta(hours=-5))))  # said in UTC whatever it came in
    assert kept_until(elsewhere) == "outputs until 2026-12-29 23:30 UTC, logs kept for good, record kept for good"
    partly = view(outputs_until=DAY, record_until=DAY.replace(year=2027), deleted=["outputs"])
    assert kept_until(partly) == (
        "outputs deleted on 2026-12-29 23:30 UTC, logs kept for good, record until 2027-12-29 23:30 UTC"
    )
    assert kept_until(view()) == "kept for good"
    assert keep_line(view()) == f"let go: run {RUN['id']} (its pool keeps runs for good)"


def test_a_kept_run_says_how_to_let_it_go_and_what_is_gone_already_and_one_without_retention_says_nothing():
    hint = f"runplane keep --off {RUN['id']}"
    kept = view(kept=True)
    assert kept_until(kept) == f"kept ({hint} lets it go)"
    assert keep_line(kept) == f"kept: run {RUN['id']} (its outputs, logs and record stay until you let it go: {hint})"
    partly = view(kept=True, deleted=["logs"])
    assert kept_until(partly) == f"kept ({hint} lets it go; logs already deleted)"
    assert keep_line(partly) == (
        f"kept: run {RUN['id']} (its outputs and record stay until you let it go: {hint}; logs already deleted)"
    )
    both = view(kept=True, deleted=["outputs", "logs"])
    assert kept_until(both) == f"kept ({hint} lets it go; outputs and logs already deleted)"
    assert keep_line(both) == (
        f"kept: run {RUN['id']} (its record stays until you let it go: {hint}; outputs and logs already deleted)"
    )
    unseen = RunView.model_validate(RUN)  # queued and not kept, or a stack older than retention
    assert unseen.retention is None and kept_until(unseen) is None
    assert keep_line(unseen) == f"let go: run {RUN['id']} (its pool's retention applies once it ends)"


def test_an_empty_listing_says_when_retention_deleted_it():
    gone = view(outputs_until=DAY, logs_until=DAY, record_until=DAY.replace(year=2027), deleted=["outputs"])
    assert deleted_by_retention(gone, "outputs") == f"{RUN['id']}: outputs deleted by retention on 2026-12-29 23:30 UTC"
    assert deleted_by_retention(gone, "logs") is None  # still there: an empty log is just empty
    kept = view(kept=True, deleted=["outputs", "logs"])  # a kept run shows no dates
    assert deleted_by_retention(kept, "logs") == f"{RUN['id']}: logs deleted by retention"
    assert deleted_by_retention(RunView.model_validate(RUN), "outputs") is None


def test_a_bad_retention_stops_dev_and_serve_before_anything_starts(capsys, monkeypatch):
    monkeypatch.delenv("RUNPLANE_RETENTION", raising=False)
    for command in ("dev", "serve"):
        assert run_cli([command, "--retention", '{"outputs": "400d", "runs": "30d"}']) == 2
        said = capsys.readouterr().err.strip()
        assert said == (
            "error: --retention: outputs cannot be kept longer than the run's record ('runs'): they go with it"
        )
    # read from the environment too, and then named as it was given
    monkeypatch.setenv("RUNPLANE_RETENTION", '{"output": "30d", "logs": "3x"}')
    for command in ("dev", "serve"):
        assert run_cli([command]) == 2
        assert capsys.readouterr().err.strip() == (
            "error: RUNPLANE_RETENTION: logs: cannot read duration '3x': use seconds or e.g. '90s', '30m', "
            "'1h30m', '2d'; output: Extra inputs are not permitted"
        )
    assert retention_settings(None, ' {"runs": "180d"} ') == {"retention": ' {"runs": "180d"} '}
    assert retention_settings(None, "") == {}
