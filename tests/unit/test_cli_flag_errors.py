"""A submit's refusals say the flags of ``runplane run``, not the API's fields, and a duration's
bounds as durations (the messages are the API's own: its model's, through its validation answer)."""

import pytest
from pydantic import ValidationError

from runplane.api.routing import validation_message
from runplane.cli.flag_errors import flagged
from runplane.domain.runs import RunSpec
from runplane.domain.sweeps import SweepSpec


def refusal(**fields) -> str:
    with pytest.raises(ValidationError) as refused:
        RunSpec.model_validate({"command": "true", **fields})
    return flagged(validation_message(refused.value))


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"checkpoint": {"interval": "10m", "grace": "2h"}}, "--checkpoint-grace: at most 1h"),
        ({"checkpoint": {"interval": "0s"}}, "--checkpoint: at least 1s"),
        ({"checkpoint": {"interval": "10m", "max_pieces": 100_000}}, "--max-pieces: at most 10000"),
        ({"fallback_after": "0s"}, "--fallback-after: at least 1s"),
        ({"queue": ["a", "b"], "fallback_after_preemptions": 0}, "--fallback-after-preemptions: at least 1"),
        ({"queue": []}, "--queue: name 1 to "),
        ({"resources": {"memory": "5x"}}, "--memory: cannot read size '5x'"),
        ({"checkpoint": {"max_pieces": 5}}, "checkpoint: --max-pieces bounds the pieces an --checkpoint-exit-code"),
    ],
)
def test_the_fields_of_a_refusal_are_said_as_flags(fields, said):
    assert refusal(**fields).startswith(said)


def test_a_sweeps_fields_are_said_as_flags_and_what_names_no_field_of_theirs_as_it_is():
    with pytest.raises(ValidationError) as refused:
        SweepSpec.model_validate({"run": {"command": "true", "checkpoint": {"grace": "2h"}}, "count": 2})
    assert flagged(validation_message(refused.value)) == "--checkpoint-grace: at most 1h"
    missing = "fallback pool 'gpu' does not exist; pools are: a, b"
    assert flagged(missing) == missing
    assert flagged("labels.team: too long") == "labels.team: too long"
