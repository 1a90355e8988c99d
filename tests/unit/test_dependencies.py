"""What a run waits for, as its spec names it: run: inputs, after, after_sweep; once each, in order;
and how a queued run that waits is filed apart from its pool's line."""

import pytest
from pydantic import ValidationError

from runplane.domain.runs import Run, RunSpec, listed_state
from runplane.domain.states import RunState


def test_a_run_waits_for_its_run_inputs_after_and_after_sweep_each_once_in_order():
    spec = RunSpec(
        command="true",
        inputs={"a": "run:r-1/x", "b": "s3://bucket/key", "c": "run:r-2", "d": "run:r-1/y"},
        after=["r-3", "r-2"],
        after_sweep="s-9",
    )
    assert spec.upstreams() == ["r-1", "r-2", "r-3", "sweep:s-9"]
    assert RunSpec(command="true").upstreams() == []


@pytest.mark.parametrize("bad", [{"after": ["sweep:s-1"]}, {"after": ["r 1"]}, {"after_sweep": "s-1/x"}])
def test_upstream_ids_are_ids(bad):
    with pytest.raises(ValidationError):
        RunSpec(command="true", **bad)


def test_only_a_queued_run_with_something_left_to_wait_for_is_filed_as_waiting():
    run = Run(id="r-1", owner="a", spec=RunSpec(command="true"), queue="p", created_at=1.0)
    assert listed_state(run) == "queued"
    assert listed_state(run.model_copy(update={"waiting_on": ["r-0"]})) == "waiting"
    ended = run.model_copy(update={"waiting_on": ["r-0"], "state": RunState.FAILED})
    assert listed_state(ended) == "failed"
