"""The request schemas of the OpenAPI document are no looser than the models that read the requests:
a value a field's pattern allows is one its model takes (what schemathesis' positive-data check
relies on, here at unit cost), and a number JSON Schema calls an integer (71.0) is one the server
takes where it wants an integer, while text, booleans and fractions stay refused."""

import re
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from runplane.api.requests import LIFETIME_PATTERN, QuotaLimits, SetPriority, SweepPatch, TokenCreate
from runplane.domain.runs import RunSpec
from runplane.domain.sweeps import SweepSpec

RUN = RunSpec.model_json_schema(mode="validation")["properties"]
SWEEP = SweepSpec.model_json_schema(mode="validation")["properties"]
FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def allowed(pattern: str) -> st.SearchStrategy[str]:
    """Strings a JSON Schema validator (the one schemathesis judges with) takes for ``pattern``."""
    judge = jsonschema_rs.validator_for({"type": "string", "pattern": pattern})
    return st.from_regex(pattern).filter(judge.is_valid)


def accepted(model: Any, body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


@FAST
@given(allowed(RUN["env"]["propertyNames"]["pattern"]), allowed(RUN["env"]["additionalProperties"]["pattern"]))
def test_an_environment_variable_the_document_allows_is_taken(name, value):
    assert accepted(RunSpec, {"command": "true", "env": {name: value}}), (name, value)


@FAST
@given(allowed(RUN["inputs"]["propertyNames"]["pattern"]), allowed(RUN["inputs"]["additionalProperties"]["pattern"]))
def test_an_input_the_document_allows_is_taken(name, source):
    assert accepted(RunSpec, {"command": "true", "inputs": {name: source}}), (name, source)


@FAST
@given(allowed(RUN["command"]["pattern"]), allowed(RUN["name"]["pattern"]), allowed(RUN["image"]["pattern"]))
def test_text_the_document_allows_is_taken(command, name, image):
    spec = {"command": command[:65536], "name": name[:200], "image": image[:512] or "busybox"}
    assert accepted(RunSpec, spec), spec


@FAST
@given(allowed(SWEEP["parameters"]["propertyNames"]["pattern"]), allowed(SWEEP["name"]["pattern"]))
def test_a_sweep_parameter_and_name_the_document_allows_are_taken(parameter, name):
    values = SWEEP["parameters"]["additionalProperties"]["items"]["anyOf"][2]["pattern"]
    assert SWEEP["parameters"]["additionalProperties"]["minItems"] == 1
    body = {"run": {"command": "true"}, "name": name[:200], "parameters": {parameter: ["a", 1, 0.5, True]}}
    assert accepted(SweepSpec, body), body
    assert re.search(values, "a\tb") and not re.search(values, "a\x01b")


@FAST
@given(allowed(LIFETIME_PATTERN))
def test_a_token_lifetime_the_document_allows_is_taken(lifetime):
    assert accepted(TokenCreate, {"user": "ada", "expires_in": lifetime}), lifetime


@pytest.mark.parametrize(
    ("text", "allowed_there"),
    [
        ("LD_PRELOAD", False),
        ("ld_library_path", False),
        ("RUNPLANE_TOKEN", False),
        ("gconv_path", False),
        ("A=B", False),
        ("", False),
        ("GCONV_PATHS", True),
        ("LR", True),
    ],
)
def test_the_document_refuses_the_environment_names_the_server_refuses(text, allowed_there):
    assert bool(re.search(RUN["env"]["propertyNames"]["pattern"], text)) is allowed_there
    assert accepted(RunSpec, {"command": "true", "env": {text: "1"}}) is allowed_there


@pytest.mark.parametrize(
    ("model", "body", "field"),
    [
        (RunSpec, {"command": "true", "priority": 71.0}, "priority"),
        (RunSpec, {"command": "true", "retry": {"attempts": 6.0}}, "retry"),
        (SweepSpec, {"run": {"command": "true"}, "count": 2.0, "max_parallel": 1.0}, "count"),
        (QuotaLimits, {"max_running": 125.0, "max_gpus": 2.0}, "max_running"),
        (SetPriority, {"priority": 80.0}, "priority"),
        (SweepPatch, {"max_parallel": 1.0}, "max_parallel"),
    ],
)
def test_a_whole_number_written_as_a_float_is_an_integer(model, body, field):
    read = model.model_validate(body)
    value = read.retry.attempts if field == "retry" else getattr(read, field)
    assert type(value) is int, read
    for bad in (True, "3", 1.5):
        changed = {**body, field: bad} if field != "retry" else {**body, "retry": {"attempts": bad}}
        assert not accepted(model, changed), changed
