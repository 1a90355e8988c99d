"""The flags that make a run, defined once for ``runplane run`` and ``runplane sweep run``.

``FLAGS`` holds each flag once; ``run_flags`` adds them to a command in place of its ``options``
parameter and hands the command one ``RunOptions`` (the SDK's keyword arguments, tied to
``RunSpec``), so a new run field is one flag here. A unit test holds ``FLAGS`` to ``RunOptions``.
"""

from __future__ import annotations

import functools
import inspect
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, cast

import typer

from runplane.cli.common import CliError
from runplane.client import RunOptions


def command_line(words: list[str]) -> str:
    """The shell command for the words after ``--``: one word is a command line as it is
    (``runplane run -- 'make && ./train'``); several are quoted back as the user's shell split
    them, so that ``-- sh -c 'echo a b'`` runs ``sh -c 'echo a b'``, not ``sh -c echo a b``."""
    return words[0] if len(words) == 1 else shlex.join(words)


def pairs(values: list[str] | None, what: str) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} must look like NAME=VALUE, got {item!r}")
        result[key] = value
    return result


def run_ids(values: list[str] | None) -> list[str] | None:
    """The run ids of ``--after`` (repeatable, or comma-separated); None when none is given.
    The API checks each (yours, and not ended without success)."""
    ids = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    return ids or None


def retry_rule(attempts: int | None, on: list[str] | None, memory_factor: float | None) -> dict[str, Any] | None:
    """The ``retry`` of a submit from ``--attempts``, ``--retry-on`` and ``--memory-factor`` (the
    API checks the reasons and the factor). Raises CliError for the last two without the first."""
    reasons = [r.strip() for item in on or [] for r in item.split(",") if r.strip()]
    if attempts is None:
        if reasons or memory_factor is not None:
            raise CliError("--retry-on and --memory-factor go with --attempts N")
        return None
    rule: dict[str, Any] = {"attempts": attempts, "on": reasons}
    if memory_factor is not None:
        rule["memory_factor"] = memory_factor
    return rule


@dataclass(frozen=True)
class Flag:
    """One flag: the parameter typer reads (``name``, its ``annotation`` and ``default``) and the
    run option it gives (``option``, a key of RunOptions)."""

    name: str
    annotation: Any
    option: str
    default: Any = None


FLAGS: tuple[Flag, ...] = (
    Flag("image", Annotated[str | None, typer.Option(help="Docker image (default: the pool's)")], "image"),
    Flag("cpus", Annotated[float | None, typer.Option(help="cpus, e.g. 0.5 or 4")], "cpus"),
    Flag("gpus", Annotated[int | None, typer.Option(help="number of GPUs")], "gpus"),
    Flag("memory", Annotated[str | None, typer.Option(help="memory, e.g. 512m or 8g")], "memory"),
    Flag("disk", Annotated[str | None, typer.Option(help="output disk, e.g. 10g")], "disk"),
    Flag("time_limit", Annotated[str | None, typer.Option("--time", help="time limit, e.g. 90s, 2h")], "time"),
    Flag("queue", Annotated[str | None, typer.Option(help="pool to run on (default: smallest that fits)")], "queue"),
    Flag("name", Annotated[str | None, typer.Option(help="a name for the run")], "name"),
    Flag(
        "labels",
        Annotated[
            list[str] | None,
            typer.Option("--label", help="KEY=VALUE, a label of yours (runplane ls --label filters by it); repeatable"),
        ],
        "labels",
    ),
    Flag("tag", Annotated[str | None, typer.Option(help="only workers started with --tag TAG take it")], "tag"),
    Flag(
        "group",
        Annotated[
            str | None, typer.Option(help="the group of yours it is charged to (default: your only group, if one)")
        ],
        "group",
    ),
    Flag(
        "priority",
        Annotated[
            int | None,
            typer.Option(
                min=0,
                max=100,
                help="0..100 (default 50): starts before waiting runs of lower priority; "
                "above the pool's max_user_priority only for admins",
                show_default=False,
            ),
        ],
        "priority",
    ),
    Flag(
        "attempts",
        Annotated[
            int | None,
            typer.Option(
                min=1,
                max=10,
                help="retry: the most times it goes, 1..10 (a lost worker is always retried within these)",
                show_default=False,
            ),
        ],
        "retry",
    ),
    Flag(
        "retry_on",
        Annotated[
            list[str] | None,
            typer.Option(
                "--retry-on",
                help="retry: a failure reason that runs it again (nonzero_exit, out_of_memory, …); repeatable or "
                "comma-separated; needs --attempts",
                show_default=False,
            ),
        ],
        "retry",
    ),
    Flag(
        "memory_factor",
        Annotated[
            float | None,
            typer.Option(
                help="retry: an out_of_memory attempt goes again with its memory times this; needs --attempts",
                show_default=False,
            ),
        ],
        "retry",
    ),
    Flag("env", Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V, repeatable")], "env"),
    Flag(
        "inputs",
        Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=s3://… or run:<id>, repeatable")],
        "inputs",
    ),
    Flag("network", Annotated[bool, typer.Option("--network", help="give the run a network")], "network", False),
    Flag(
        "after",
        Annotated[
            list[str] | None,
            typer.Option(
                "--after",
                help="a run of yours to wait for: it stays queued, holding no worker, until that run has succeeded "
                "(fails dependency_failed if it does not); repeatable or comma-separated",
                show_default=False,
            ),
        ],
        "after",
    ),
    Flag(
        "after_sweep",
        Annotated[
            str | None,
            typer.Option(help="a sweep of yours to wait for: until every member has succeeded", show_default=False),
        ],
        "after_sweep",
    ),
)
"""Every flag that makes a run, in the order ``--help`` lists them."""

NO_FLAG = frozenset({"resources"})
"""Run options the command line gives no flag of its own (``resources``: its fields' flags)."""


_BUILT = frozenset({"env", "inputs", "labels", "after", "retry"})
"""The options built from their flags' text rather than taken as typed."""


def options_from(values: Mapping[str, Any]) -> RunOptions:
    """The run options of the flags' ``values`` (by parameter name): only what was given.
    Raises CliError for a pair that is not NAME=VALUE, or retry flags without --attempts."""
    given = {f.name: values[f.name] for f in FLAGS if values.get(f.name, f.default) != f.default}
    options = {f.option: given[f.name] for f in FLAGS if f.name in given and f.option not in _BUILT}
    options["env"] = pairs(given.get("env"), "--env") or None
    options["inputs"] = pairs(given.get("inputs"), "--input") or None
    options["labels"] = pairs(given.get("labels"), "--label") or None
    options["after"] = run_ids(given.get("after"))
    options["retry"] = retry_rule(given.get("attempts"), given.get("retry_on"), given.get("memory_factor"))
    return cast(RunOptions, {k: v for k, v in options.items() if v is not None})


def run_flags(*, leave_out: frozenset[str] = frozenset()) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command with ``FLAGS`` (but those whose option is in ``leave_out``) in place of its
    keyword-only parameter ``options``, which it is called with: a RunOptions of what they say."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        flags = [f for f in FLAGS if f.option not in leave_out]
        names = {f.name for f in flags}
        own = inspect.signature(command, eval_str=True).parameters
        params: list[inspect.Parameter] = []
        for param in own.values():
            if param.name != "options":
                params.append(param)
                continue
            kind = inspect.Parameter.KEYWORD_ONLY
            params += [inspect.Parameter(f.name, kind, default=f.default, annotation=f.annotation) for f in flags]

        @functools.wraps(command)
        def with_options(*args: Any, **kwargs: Any) -> None:
            values = {name: kwargs.pop(name) for name in names if name in kwargs}
            command(*args, options=options_from(values), **kwargs)

        with_options.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in params}
        return with_options

    return decorate
