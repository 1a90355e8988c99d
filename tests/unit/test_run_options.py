"""A run's options are defined once: the SDK's ``RunOptions`` is held to ``RunSpec`` (and the fields
of ``Resources``, its shortcuts), ``run_body`` is the one place that builds the request, and the
flags of ``runplane run`` and ``runplane sweep run`` come from one table held to ``RunOptions``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from types import SimpleNamespace, UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import pytest
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from runplane.cli.common import CliError
from runplane.cli.run_options import FLAGS, HAND, NO_FLAG, derived, options_from
from runplane.cli.runs import run as run_command
from runplane.cli.sweeps import run as sweep_command
from runplane.client import AsyncClient, CheckpointRule, Client, RetryRule, RunOptions
from runplane.client._options import OPTIONS, run_body
from runplane.domain.asks import Resources
from runplane.domain.runs import RunSpec


def test_the_sdk_options_are_the_fields_of_a_run_spec() -> None:
    spec_fields = set(RunSpec.model_fields) - {"command"}
    assert set(RunOptions.__annotations__) == spec_fields | set(Resources.model_fields) == OPTIONS


def _plain(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` anywhere in it and without ``None``."""
    if get_origin(annotation) is Annotated:
        return _plain(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        rest = [_plain(a) for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007
    if get_origin(annotation) in (list, dict):
        return get_origin(annotation)[tuple(_plain(a) for a in get_args(annotation))]
    return annotation


def _sdk_type(field: FieldInfo) -> Any:
    """The type an SDK option of ``field`` has: the model's, None allowed (None: the API's default),
    a model given as itself or as its fields, a list as any sequence, a dict as any mapping, and a
    switch that is off by default as the switch alone."""
    kind = _plain(field.annotation)
    if kind is bool and field.default is False:
        return bool
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind | Mapping[str, Any] | None
    if get_origin(kind) is list:
        return Sequence[get_args(kind)] | None  # type: ignore[misc]
    if get_origin(kind) is dict:
        return Mapping[get_args(kind)] | None  # type: ignore[misc]
    return kind | None


WIDER = {
    "memory": str | int | None,  # a size as text ("8g") too
    "disk": str | int | None,
    "time": str | float | None,  # a duration as text ("2h") too
    "after": Sequence[Any] | None,  # the runs themselves (``Run`` objects), for their ids
    "after_sweep": Any,  # the sweep itself (a ``Sweep`` object), for its id
    "queue": str | Sequence[str] | None,  # the pools in order too (the field's before-validator splits them)
    "fallback_after": str | float | None,  # a duration as text ("20m") too
}
"""The options whose SDK type is wider on purpose than the field's."""


def test_each_sdk_option_has_the_type_of_its_field() -> None:
    hints = get_type_hints(RunOptions)
    fields = {**RunSpec.model_fields, **Resources.model_fields}
    for name, hint in hints.items():
        expected = WIDER.get(name) or _sdk_type(fields[name])
        assert _plain(hint) == _plain(expected) and (type(None) in get_args(hint)) == (
            type(None) in get_args(expected)
        ), f"RunOptions[{name!r}] is {hint}, its field makes it {expected}"


def test_a_plain_fields_flag_is_derived_from_the_field() -> None:
    """Every field but those of HAND has its flag read off the model: its type, its bounds, its help."""
    hand = {f.option for flags in HAND.values() for f in flags}
    derived_flags = {f.option: f for f in FLAGS if f.option not in hand}
    assert set(derived_flags) == set(RunSpec.model_fields) - {"command", *HAND}
    for name, flag in derived_flags.items():
        field = RunSpec.model_fields[name]
        made = derived(name, field)
        assert made is not None and (flag.name, flag.default) == (made.name, made.default)
        assert flag.default is (False if field.default is False else None)  # not given: the API's default
        kind, option = get_args(flag.annotation)
        assert _plain(kind) == _plain(field.annotation), name
        assert option.help.startswith(field.description or "")
        assert "--" + name.replace("_", "-") in (option.default, *option.param_decls)  # typer's first is the flag
    priority = get_args(derived_flags["priority"].annotation)[1]
    assert (priority.min, priority.max) == (0, 100)  # the field's ge and le


def test_a_new_plain_field_gets_its_flag_without_an_edit() -> None:
    class Spec(BaseModel):
        seed: int | None = Field(default=None, ge=0, description="the random seed")
        dry: bool = Field(default=False, description="only check it")
        notes: dict[str, str] = Field(default_factory=dict, description="notes of yours")
        tags: list[str] = Field(default_factory=list, description="tags")
        plan: RetryRule | None = None

    flags = {name: derived(name, field) for name, field in Spec.model_fields.items()}
    assert flags["plan"] is None  # a model of its own needs flags of its own (HAND)
    seed = get_args(flags["seed"].annotation)  # type: ignore[union-attr]
    assert (_plain(seed[0]), seed[1].min, seed[1].help) == (int, 0, "the random seed")
    assert flags["dry"].default is False and get_args(flags["dry"].annotation)[0] is bool  # type: ignore[union-attr]
    assert flags["notes"].convert(["a=1", "b=2=3"]) == {"a": "1", "b": "2=3"}  # type: ignore[union-attr,misc]
    with pytest.raises(CliError, match="--notes must look like NAME=VALUE"):
        flags["notes"].convert(["a"])  # type: ignore[union-attr,misc]
    assert _plain(get_args(flags["tags"].annotation)[0]) == list[str]  # type: ignore[union-attr]


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
    # a sweep's --name names the sweep, not each run; its runs cannot be interactive (the API refuses)
    assert names - {"name", "interactive", "tty"} <= sweep_params
    assert not {"interactive", "tty"} & sweep_params
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


def test_secret_flags_become_references_and_a_variable_is_named_once() -> None:
    values = {f.name: f.default for f in FLAGS} | {
        "secrets": ["WANDB_API_KEY=wandb", "HF_TOKEN=vision/hf-token"],
        "image_pull_secret": "vision/registry",
        "env": ["A=1"],
    }
    assert options_from(values) == {
        "env": {"A": "1"},
        "secrets": {"WANDB_API_KEY": "wandb", "HF_TOKEN": "vision/hf-token"},
        "image_pull_secret": "vision/registry",
    }
    body = run_body("true", options_from(values))
    assert RunSpec.model_validate(body).secrets == {"WANDB_API_KEY": "wandb", "HF_TOKEN": "vision/hf-token"}
    with pytest.raises(CliError, match=r"^--secret names TOKEN twice: give each variable one secret$"):
        options_from({"secrets": ["TOKEN=a", "TOKEN=b"]})
    with pytest.raises(CliError, match=r"^TOKEN is given by --env and by --secret: name each variable once$"):
        options_from({"secrets": ["TOKEN=a"], "env": ["TOKEN=plain"]})
    for bad in ("TOKEN", "=a", "TOKEN="):
        with pytest.raises(CliError, match="--secret must look like ENV=NAME"):
            options_from({"secrets": [bad]})


def test_queue_and_checkpoint_flags_become_run_options() -> None:
    values = {f.name: f.default for f in FLAGS}
    assert options_from(values | {"queue": ["gpu"]}) == {"queue": "gpu"}
    given = values | {
        "queue": ["gpu-spot,gpu-ondemand", "cpu"],
        "fallback_after": "20m",
        "fallback_after_preemptions": 2,
        "checkpoint_interval": "10m",
        "checkpoint_exit_code": 85,
        "from_checkpoint": "r-1",
    }
    options = options_from(given)
    assert options == {
        "queue": ["gpu-spot", "gpu-ondemand", "cpu"],
        "fallback_after": "20m",
        "fallback_after_preemptions": 2,
        "checkpoint": {"interval": "10m", "exit_code": 85},
        "from_checkpoint": "r-1",
    }
    spec = RunSpec.model_validate(run_body("true", options))
    assert (spec.queue, spec.fallback, spec.fallback_after) == ("gpu-spot", ["gpu-ondemand", "cpu"], 1200)
    assert spec.checkpoint is not None and (spec.checkpoint.interval, spec.checkpoint.exit_code) == (600, 85)
    assert spec.from_checkpoint == "r-1"
    # any one of the rule's flags makes the rule; none of them: no rule
    signal_only = options_from(values | {"checkpoint_signal": "SIGUSR1"})
    assert signal_only == {"checkpoint": {"signal": "SIGUSR1"}}
    assert RunSpec.model_validate(run_body("true", signal_only)).checkpoint.stop_grace == 30  # type: ignore[union-attr]


def test_sdk_checkpoint_and_pools_reach_the_body() -> None:
    body = run_body(
        "true",
        {"queue": ("a", "b"), "checkpoint": CheckpointRule(grace="1m"), "fallback_after_preemptions": 1},
    )
    assert body == {
        "command": "true",
        "queue": ["a", "b"],
        "checkpoint": {"grace": 60.0},
        "fallback_after_preemptions": 1,
    }
    assert RunSpec.model_validate(body).fallback == ["b"]
