"""A run's options are defined once: the SDK's ``RunOptions`` is held to ``RunSpec`` (and the fields
of ``Resources``, its shortcuts), ``run_body`` is the one place that builds the request, and the
flags of ``runplane run`` and ``runplane sweep run`` come from one table held to ``RunOptions``."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import get_type_hints

import pytest

from runplane.cli.common import CliError
from runplane.cli.run_options import FLAGS, NO_FLAG, options_from
from runplane.cli.runs import run as run_command
from runplane.cli.sweeps import run as sweep_command
from runplane.client import AsyncClient, Client, RetryRule, RunOptions
from runplane.client._options import run_body
from runplane.domain.runs import Resources, RunSpec


def test_the_sdk_options_are_the_fields_of_a_run_spec() -> None:
    spec_fields = set(RunSpec.model_fields) - {"command"}
    assert set(RunOptions.__annotations__) == spec_fields | set(Resources.model_fields)


@pytest.mark.parametrize("method", [Client.submit, Client.submit_sweep, AsyncClient.submit, AsyncClient.submit_sweep])
def test_submit_takes_the_options_as_typed_keywords(method: object) -> None:
    params = inspect.signature(method).parameters  # type: ignore[arg-type]
    spread = [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert len(spread) == 1
    assert "Unpack[RunOptions]" in str(spread[0].annotation)
    assert not set(params) & set(RunOptions.__annotations__)  # no option spelled out beside them


def test_the_body_holds_what_was_given_and_nothing_left_at_its_default() -> None:
    upstream = SimpleNamespace(id="r-up")  # a Run as submit returned it
    body = run_body(
        "echo hi",
        {
            "resources": Resources(cpus=2, memory="1g"),
            "memory": "2g",
            "time": None,
            "queue": "small",
            "env": {},
            "network": False,
            "priority": 0,
            "retry": RetryRule(attempts=2),
            "after": (upstream, "r-2"),
            "after_sweep": SimpleNamespace(id="s-1"),
        },
    )
    assert body == {
        "command": "echo hi",
        "resources": {"cpus": 2.0, "memory": "2g"},  # the shortcut overrides the model's field
        "queue": "small",
        "priority": 0,  # 0 is not the default (50): it is sent
        "retry": {"attempts": 2},
        "after": ["r-up", "r-2"],
        "after_sweep": "s-1",
    }
    assert RunSpec.model_validate(body).resources.memory == 2 * 1024**3


def test_an_option_a_run_does_not_have_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="'gpu'"):
        run_body("true", {"gpu": 1})
    with pytest.raises(TypeError, match="list of runs"):
        run_body("true", {"after": "r-1"})


def test_every_run_option_has_one_flag() -> None:
    flagged = {f.option for f in FLAGS}
    assert flagged | NO_FLAG == set(RunOptions.__annotations__) - {"resources"} | NO_FLAG
    assert flagged <= set(RunOptions.__annotations__)
    assert len({f.name for f in FLAGS}) == len(FLAGS)


def test_both_commands_take_the_flags_from_the_one_table() -> None:
    run_params = set(get_type_hints(run_command))
    sweep_params = set(get_type_hints(sweep_command))
    names = {f.name for f in FLAGS}
    assert names <= run_params
    assert names - {"name"} <= sweep_params  # a sweep's --name names the sweep, not each run
    assert "options" not in run_params | sweep_params


def test_flags_become_run_options() -> None:
    values = {f.name: f.default for f in FLAGS}
    assert options_from(values) == {}
    values |= {
        "time_limit": "2h",
        "env": ["A=1", "B=x=y"],
        "inputs": ["data=run:r-1/out"],
        "labels": ["exp=lr-3", "team=a=b"],
        "after": ["r-1,r-2", "r-3"],
        "attempts": 3,
        "retry_on": ["nonzero_exit"],
        "network": True,
        "priority": 0,
    }
    assert options_from(values) == {
        "time": "2h",
        "env": {"A": "1", "B": "x=y"},
        "inputs": {"data": "run:r-1/out"},
        "labels": {"exp": "lr-3", "team": "a=b"},
        "after": ["r-1", "r-2", "r-3"],
        "retry": {"attempts": 3, "on": ["nonzero_exit"]},
        "network": True,
        "priority": 0,  # given, though falsy
    }
    with pytest.raises(CliError, match="--attempts"):
        options_from({"retry_on": ["nonzero_exit"], "attempts": None})
    with pytest.raises(CliError, match="NAME=VALUE"):
        options_from({"env": ["novalue"]})
