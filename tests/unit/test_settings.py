"""The stack's settings (``StackSettings``): read from RUNPLANE_* variables by ``from_env`` only,
each error naming its variable, and documented in README.md by a table made from the fields."""

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from runplane.bootstrap import build_stack
from runplane.domain.errors import Misconfigured
from runplane.settings import StackSettings, markdown_table

ROOT = Path(__file__).resolve().parents[2]


def readme_table() -> str:
    """The table of README.md's "Stack settings" section: its lines that start with '|'."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Stack settings\n") :]
    section = section[: section.index("\n## ", 1)]
    return "".join(line + "\n" for line in section.splitlines() if line.startswith("|"))


def test_readme_lists_exactly_the_settings():
    table = readme_table()
    documented = re.findall(r"^\| `(RUNPLANE_[A-Z0-9_]+)` \|", table, re.MULTILINE)
    assert documented == ["RUNPLANE_" + name.upper() for name in StackSettings.model_fields]
    assert table == markdown_table(), "README.md's table is stale: paste the output of python -m runplane.settings"


def test_every_setting_is_described():
    assert [name for name, field in StackSettings.model_fields.items() if not field.description] == []


def test_from_env_reads_each_variable_into_its_field():
    texts = [name for name, field in StackSettings.model_fields.items() if field.default in ("", None)]
    environ = {"RUNPLANE_" + name.upper(): "" for name in texts}
    environ |= {
        "RUNPLANE_CLOUD": "azure",
        "RUNPLANE_PREFIX": "prod",
        "RUNPLANE_WORKER_STALE_SECONDS": "45",
        "RUNPLANE_MAX_BODY_BYTES": "1024",
        "RUNPLANE_INPUT_BUCKETS": "public-data, shared",
        "RUNPLANE_AWS_REGION": "eu-west-1",
    }
    settings = StackSettings.from_env(environ)
    assert (settings.cloud, settings.prefix, settings.aws_region) == ("azure", "prod", "eu-west-1")
    assert (settings.worker_stale_seconds, settings.max_body_bytes) == (45, 1024)
    assert settings.input_bucket_allowlist() == {"*": frozenset({"public-data", "shared"})}
    # an empty endpoint is no endpoint; other empty strings stay what they say
    assert settings.aws_endpoint_url is None and settings.dynamodb_endpoint_url is None
    assert settings.runs_table == settings.pools == ""
    given = {"cloud", "prefix", "worker_stale_seconds", "max_body_bytes", "aws_region"}
    assert settings.model_fields_set == {*texts, *given}  # what an agent launched is passed on


def test_unknown_variables_are_ignored():
    """A variable a newer release reads (or a typo) never stops a function from starting."""
    settings = StackSettings.from_env({"RUNPLANE_PREFIX": "p", "RUNPLANE_NOT_A_SETTING": "1", "RUNPLANE_": "x"})
    assert settings.prefix == "p"
    assert settings.model_fields_set == {"prefix"}
    with pytest.raises(ValidationError):
        StackSettings(not_a_setting="1")  # constructed in code, a wrong name is a mistake


@pytest.mark.parametrize(
    ("environ", "region"),
    [
        ({}, "us-east-1"),
        ({"AWS_DEFAULT_REGION": "ap-south-1"}, "ap-south-1"),
        ({"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "ap-south-1"}, "eu-west-1"),
        ({"RUNPLANE_AWS_REGION": "sa-east-1", "AWS_REGION": "eu-west-1"}, "sa-east-1"),
        ({"RUNPLANE_AWS_REGION": "", "AWS_REGION": "eu-west-1"}, "eu-west-1"),
        ({"RUNPLANE_AWS_REGION": "", "AWS_REGION": "", "AWS_DEFAULT_REGION": ""}, "us-east-1"),
    ],
)
def test_region_falls_back_to_what_aws_sets(environ, region):
    assert StackSettings.from_env(environ).aws_region == region


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RUNPLANE_WORKER_STALE_SECONDS", "soon"),
        ("RUNPLANE_MAX_BODY_BYTES", "1.5"),
        ("RUNPLANE_CLOUD", "gcp"),
        ("RUNPLANE_INPUT_BUCKETS", "{not json"),
    ],
)
def test_a_bad_value_names_its_variable(variable, value):
    """The error's loc is the field: ``RUNPLANE_<FIELD>`` is the variable to name."""
    with pytest.raises(ValidationError) as caught:
        StackSettings.from_env({variable: value})
    (error,) = caught.value.errors()
    assert "RUNPLANE_" + "_".join(str(part) for part in error["loc"]).upper() == variable


def test_only_from_env_reads_the_environment(monkeypatch):
    monkeypatch.setenv("RUNPLANE_PREFIX", "from-env")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert (StackSettings().prefix, StackSettings().aws_region) == ("runplane", "us-east-1")
    assert StackSettings(prefix="given").prefix == "given"
    assert (StackSettings.from_env().prefix, StackSettings.from_env().aws_region) == ("from-env", "eu-west-1")


def test_settings_are_frozen():
    settings = StackSettings.from_env({})
    with pytest.raises(ValidationError):
        settings.prefix = "other"


def test_the_environment_of_settings_reads_back_as_the_same_settings():
    settings = StackSettings(prefix="p", worker_stale_seconds=30, aws_endpoint_url="http://127.0.0.1:5000", cloud="aws")
    assert settings.environment() == {
        "RUNPLANE_AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
        "RUNPLANE_CLOUD": "aws",
        "RUNPLANE_PREFIX": "p",
        "RUNPLANE_WORKER_STALE_SECONDS": "30.0",
    }
    assert StackSettings.from_env(settings.environment()) == settings


def test_exported_settings_replace_the_ones_of_the_environment_and_keep_the_rest():
    environ = {"PATH": "/bin", "RUNPLANE_RUNS_TABLE": "someone-elses", "RUNPLANE_AGENT_PULL": "never"}
    exported = StackSettings(prefix="p").exported(environ)
    assert exported == {"PATH": "/bin", "RUNPLANE_AGENT_PULL": "never", "RUNPLANE_PREFIX": "p"}
    assert StackSettings.from_env(exported) == StackSettings(prefix="p")


def test_upload_retention_days_take_the_place_of_retentions_uploads():
    """RUNPLANE_UPLOAD_RETENTION_DAYS (the templates' UploadRetentionDays) sets when uploads expire, so
    that submits renew the uploads they name, whatever RUNPLANE_RETENTION says of uploads; 0 leaves it."""
    both = {"RUNPLANE_RETENTION": '{"outputs": "30d", "uploads": "1d"}', "RUNPLANE_UPLOAD_RETENTION_DAYS": "14"}
    kept = StackSettings.from_env(both).kept()
    assert (kept.seconds("uploads"), kept.seconds("outputs")) == (14 * 86400, 30 * 86400)
    assert StackSettings.from_env({"RUNPLANE_UPLOAD_RETENTION_DAYS": "3"}).kept().seconds("uploads") == 3 * 86400
    assert StackSettings.from_env({"RUNPLANE_UPLOAD_RETENTION_DAYS": "0"}).kept().sets_any is False
    assert StackSettings.from_env({**both, "RUNPLANE_UPLOAD_RETENTION_DAYS": "0"}).kept().seconds("uploads") == 86400
    with pytest.raises(ValidationError, match="upload_retention_days"):
        StackSettings.from_env({"RUNPLANE_UPLOAD_RETENTION_DAYS": "-1"})


def test_a_bad_setting_is_one_line_naming_its_variable():
    """What a deployment logs (Misconfigured) or a CLI prints for a bad RUNPLANE_RETENTION: its variable,
    each field's problem, no pydantic prefixes."""
    bad = {"RUNPLANE_RETENTION": '{"outputs": "3x", "logs": "40d", "runs": "30d"}', "RUNPLANE_SCHEDULE_CALLS": "0"}
    with pytest.raises(ValidationError) as e:
        StackSettings.from_env(bad)
    said = StackSettings.problem(e.value)
    assert said == (
        "RUNPLANE_SCHEDULE_CALLS: Input should be greater than or equal to 1; RUNPLANE_RETENTION: outputs: cannot "
        "read duration '3x': use seconds or e.g. '90s', '30m', '1h30m', '2d'"
    )
    with pytest.raises(ValidationError) as e:
        StackSettings.from_env({"RUNPLANE_RETENTION": '{"logs": "40d", "runs": "30d"}'})
    assert StackSettings.problem(e.value) == (
        "RUNPLANE_RETENTION: logs cannot be kept longer than the run's record ('runs'): they go with it"
    )


def test_a_stack_of_a_bad_environment_is_misconfigured_naming_the_variable(monkeypatch):
    """build_stack from the environment: a bad setting is Misconfigured (what the fronts answer 503 with
    and agents print), one line naming the variable, not pydantic's report."""
    monkeypatch.setenv("RUNPLANE_CLOUD", "local")
    monkeypatch.setenv("RUNPLANE_RETENTION", '{"outputs": "3x"}')
    with pytest.raises(Misconfigured) as e:
        build_stack()
    assert e.value.message == (
        "RUNPLANE_RETENTION: outputs: cannot read duration '3x': use seconds or e.g. '90s', '30m', '1h30m', '2d'"
    )
