"""The sweep record's pure parts: the grid's order, how values become environment variables, the
status codes of finished members, the counts read from them, and the CLI's --param."""

import itertools

import pytest
from pydantic import ValidationError

from runplane.cli.common import CliError
from runplane.cli.sweeps import parse_param
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.sweeps import OPEN, PENDING, SUCCEEDED, Sweep, SweepSpec, ended_code, reason_of, state_of

RUN = RunSpec(command="true")


def test_members_go_through_the_grid_last_axis_fastest_then_again_per_count():
    spec = SweepSpec(run=RUN, parameters={"A": [1, 2], "B": ["x", "y", "z"]}, count=2)
    assert (spec.grid, spec.size) == (6, 12)
    points = [(p["A"], p["B"]) for p in map(spec.point, range(spec.size))]
    assert points[:6] == list(itertools.product(["1", "2"], ["x", "y", "z"]))
    assert points[6:] == points[:6]
    assert list(spec.point(0)) == ["A", "B"]  # in the order given


def test_values_become_the_text_a_shell_would_see():
    spec = SweepSpec(run=RUN, parameters={"F": [0.1, 1e-3, 2.0], "B": [True, False], "I": [-3], "S": ["a b"]})
    got = [spec.point(i) for i in range(spec.size)]
    assert {p["F"] for p in got} == {"0.1", "0.001", "2.0"}
    assert {p["B"] for p in got} == {"true", "false"}
    assert {p["I"] for p in got} == {"-3"} and {p["S"] for p in got} == {"a b"}


def test_a_sweep_without_parameters_is_count_runs_with_no_point():
    spec = SweepSpec(run=RUN, count=3)
    assert (spec.size, spec.point(2)) == (3, {})
    assert SweepSpec(run=RUN).size == 1


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"count": 10_001}, "less than or equal to 10000"),
        ({"parameters": {"A": []}}, "has no values"),
        ({"parameters": {"RUNPLANE_X": [1]}}, "RUNPLANE_ prefix is reserved"),
        ({"parameters": {"LD_PRELOAD": ["x"]}}, "dynamic loader"),
        ({"parameters": {"A": ["\x07"]}}, "control character \\x07"),
        ({"parameters": {"A": [[1]]}}, "parameters.A.0"),
        ({"parameters": {"A": [float("nan")]}}, "parameters.A.0"),
        ({"max_parallel": 0}, "greater than or equal to 1"),
        ({"count": 2.5}, "count"),
        ({"name": "a\tb"}, "printable text on one line"),
    ],
)
def test_a_sweep_that_cannot_be_is_refused(extra, fragment):
    with pytest.raises(ValidationError) as refused:
        SweepSpec.model_validate({"run": {"command": "true"}, **extra})
    assert fragment in str(refused.value)


def test_a_parameter_may_not_also_be_in_the_templates_env():
    with pytest.raises(ValidationError, match=r"parameters \['A'\] are also in run.env"):
        SweepSpec(run=RunSpec(command="x", env={"A": "1"}), parameters={"A": [2]})


def test_every_failure_reason_has_its_own_code_and_stands_for_its_state():
    codes = {ended_code(RunState.FAILED, r) for r in FailureReason}
    assert len(codes) == len(FailureReason) and not codes & {PENDING, OPEN, SUCCEEDED}
    for reason in FailureReason:
        code = ended_code(RunState.FAILED, reason)
        assert reason_of(code) == reason
    assert state_of(ended_code(RunState.KILLED, FailureReason.KILLED)) == RunState.KILLED
    assert state_of(ended_code(RunState.TIMED_OUT, FailureReason.TIME_LIMIT)) == RunState.TIMED_OUT
    assert state_of(ended_code(RunState.FAILED, FailureReason.NONZERO_EXIT)) == RunState.FAILED
    assert state_of(ended_code(RunState.KILLED, None)) == RunState.KILLED  # a kill with no failure recorded
    assert (state_of(SUCCEEDED), state_of(OPEN), state_of(PENDING)) == (RunState.SUCCEEDED, None, None)
    # a letter a later release added for a reason this one does not know: a failure, read as agent_error
    assert (state_of("z"), reason_of("z")) == (RunState.FAILED, FailureReason.AGENT_ERROR)


def test_counts_are_read_from_the_status():
    status = "s" * 3 + "a" * 2 + "g" + "d" + OPEN * 2 + PENDING
    sweep = Sweep(id="s-1", owner="a", spec=SweepSpec(run=RUN, count=10), queue="q", created_at=1.0, status=status)
    counts, failures = sweep.tally()
    assert counts == {"succeeded": 3, "failed": 2, "killed": 1, "timed_out": 1, "queued": 3}
    assert failures == {"nonzero_exit": 2, "killed": 1, "time_limit": 1}
    assert (sweep.indices(OPEN), sweep.member_id(7)) == ([7, 8], "s-1-7")
    assert sweep.model_copy(update={"tries": {"7": 3}}).member_id(7) == "s-1-7-3"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("LR=0.1,0.01", ("LR", ["0.1", "0.01"])),
        ("SEED=1..3", ("SEED", ["1", "2", "3"])),
        ("N=-1..1", ("N", ["-1", "0", "1"])),
        ("X=1e-3", ("X", ["1e-3"])),  # as typed
        ("P=a=b", ("P", ["a=b"])),
    ],
)
def test_params_on_the_command_line(text, expected):
    assert parse_param(text) == expected


@pytest.mark.parametrize("text", ["LR", "=1", "LR=", "A=1,,2", "S=3..1", "S=0..10000"])
def test_bad_params_on_the_command_line(text):
    with pytest.raises(CliError):
        parse_param(text)
