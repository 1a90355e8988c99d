"""What ``runplane keep`` and ``runplane status`` say of a run's retention: its dates (UTC days), what
is deleted already, what is kept for good, and a pin; ``runplane dev`` and ``serve`` refuse a
retention that cannot be read, before anything starts."""

from datetime import UTC, datetime

from runplane.api.models import RunView
from runplane.cli.app import run_cli
from runplane.cli.common import retention_settings
from runplane.cli.runs import keep_line, kept_until

RUN = RunView.model_config["json_schema_extra"]["examples"][0]  # type: ignore[index]
DAY = datetime(2026, 12, 29, 23, 30, tzinfo=UTC)


def view(**retention) -> RunView:
    shown = {"kept": False, "outputs_until": None, "logs_until": None, "record_until": None, "deleted": []}
    return RunView.model_validate({**RUN, "state": "succeeded", "retention": {**shown, **retention}})


def test_dates_deletions_and_for_good_are_said_part_by_part():
    dated = view(outputs_until=DAY, logs_until=DAY.replace(month=11), record_until=DAY.replace(year=2027))
    assert kept_until(dated) == "outputs 2026-12-29, logs 2026-11-29, record 2027-12-29"
    assert keep_line(dated) == (
        f"let go: run {RUN['id']}: outputs deleted on 2026-12-29, logs deleted on 2026-11-29, "
        "record deleted on 2027-12-29"
    )
    partly = view(outputs_until=DAY, record_until=DAY.replace(year=2027), deleted=["outputs"])
    assert kept_until(partly) == "outputs deleted, logs for good, record 2027-12-29"
    assert kept_until(view()) == "outputs for good, logs for good, record for good"
    assert keep_line(view()) == f"let go: run {RUN['id']} (its pool keeps runs for good)"


def test_a_kept_run_says_how_to_let_it_go_and_one_without_retention_says_nothing():
    kept = view(kept=True, deleted=["logs"])
    assert kept_until(kept) == f"kept, until you let it go (runplane keep --off {RUN['id']})"
    assert keep_line(kept).startswith(f"kept: run {RUN['id']} (its outputs, logs and record stay until")
    unseen = RunView.model_validate(RUN)  # queued and not kept, or a stack older than retention
    assert unseen.retention is None and kept_until(unseen) is None
    assert keep_line(unseen) == f"let go: run {RUN['id']} (its pool's retention applies once it ends)"


def test_a_bad_retention_stops_dev_and_serve_before_anything_starts(capsys, monkeypatch):
    monkeypatch.delenv("RUNPLANE_RETENTION", raising=False)
    for command in ("dev", "serve"):
        assert run_cli([command, "--retention", '{"outputs": "400d", "runs": "30d"}']) == 2
        said = capsys.readouterr().err.strip()
        assert said == (
            "error: --retention: retention: Value error, outputs cannot be kept longer than the run's record "
            "('runs'): they go with it"
        )
    monkeypatch.setenv("RUNPLANE_RETENTION", '{"output": "30d"}')  # read from the environment too
    assert run_cli(["serve"]) == 2
    assert capsys.readouterr().err.strip() == "error: --retention: output: Extra inputs are not permitted"
    assert retention_settings(' {"runs": "180d"} ') == {"retention": ' {"runs": "180d"} '}
    assert retention_settings("") == {}
