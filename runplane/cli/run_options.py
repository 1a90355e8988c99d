"""The flags that make a run, defined once for ``runplane run`` and ``runplane sweep run``.

``FLAGS`` holds each flag once, read off ``RunSpec``: a field of a plain type (text, a number, a
switch, a list, a mapping of text) gets its flag from the model (``derived``: its type, bounds and
help, the field's description), so a new plain run field needs no edit here; ``HAND`` holds the
flags that differ on purpose. ``run_flags`` adds them to a command in place of its ``options``
parameter and hands the command one ``RunOptions`` (the SDK's keyword arguments, tied to
``RunSpec``). A unit test holds ``FLAGS`` to ``RunOptions`` and their types to the model's.
"""

from __future__ import annotations

import functools
import inspect
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import GenericAlias, UnionType
from typing import Annotated, Any, Optional, Union, cast, get_args, get_origin

import annotated_types
import typer
from pydantic.fields import FieldInfo

from runplane.cli.common import CliError
from runplane.client import RunOptions
from runplane.domain.runs import RunSpec


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


def secret_refs(values: list[str] | None) -> dict[str, str] | None:
    """The ``secrets`` of ``--secret ENV=REF`` (repeatable): an ENV given twice is an error (which
    of two secrets a run gets must not depend on the order of the flags). The API checks each
    reference (a secret of yours, or of one of your groups)."""
    result: dict[str, str] = {}
    for item in values or []:
        key, sep, ref = item.partition("=")
        if not sep or not key or not ref:
            raise CliError(f"--secret must look like ENV=NAME or ENV=GROUP/NAME, got {item[:80]!r}")
        if key in result:
            raise CliError(f"--secret names {key} twice: give each variable one secret")
        result[key] = ref
    return result or None


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
    """One flag: the parameter typer reads (``name``, its ``annotation`` and ``default``), the run
    option it gives (``option``, a key of RunOptions) and how its value becomes the option's
    (``convert``; None: as typer read it)."""

    name: str
    annotation: Any
    option: str
    default: Any = None
    convert: Callable[[Any], Any] | None = None


def _plain(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` and ``None``: ``str | None`` -> ``str``."""
    if get_origin(annotation) is Annotated:
        return _plain(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return _plain(rest[0]) if len(rest) == 1 else annotation
    return annotation


def _bounds(field: FieldInfo) -> dict[str, Any]:
    """The ``min``/``max`` typer checks, from the field's ``ge``/``le``."""
    found: dict[str, Any] = {}
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            found["min"] = item.ge
        elif isinstance(item, annotated_types.Le):
            found["max"] = item.le
    return found


def derived(name: str, field: FieldInfo) -> Flag | None:
    """The flag of a plain ``RunSpec`` field, read off the model: ``--<name>`` of its type (text, a
    number, a switch, a repeated value, or repeated KEY=VALUE pairs for a mapping of text), its
    help the field's description, its bounds the field's. None for a field of another type (such
    a field needs its flags in HAND)."""
    flag = "--" + name.replace("_", "-")
    text = field.description or name.replace("_", " ")
    kind = _plain(field.annotation)
    origin, args = get_origin(kind), [_plain(a) for a in get_args(kind)]
    if kind is bool and field.default is False:
        return Flag(name, Annotated[bool, typer.Option(flag, help=text)], name, False)
    if kind in (str, int, float):
        option = typer.Option(flag, help=text, show_default=False, **_bounds(field))
        return Flag(name, Annotated[Optional[kind], option], name)  # noqa: UP045 (kind is a value)
    if origin is list and args and args[0] in (str, int, float):
        option = typer.Option(flag, help=f"{text}; repeatable", show_default=False)
        return Flag(name, Annotated[Optional[GenericAlias(list, args[0])], option], name)  # noqa: UP045
    if origin is dict and args == [str, str]:
        option = typer.Option(flag, help=f"KEY=VALUE: {text}; repeatable", show_default=False)
        return Flag(name, Annotated[list[str] | None, option], name, convert=_pairs_of(flag))
    return None


def _pairs_of(flag: str) -> Callable[[Any], Any]:
    return lambda values: pairs(values, flag) or None


def _retry(name: str, annotation: Any, option: Any) -> Flag:
    return Flag(name, Annotated[annotation, option], "retry")


def _checkpoint(name: str, annotation: Any, option: Any) -> Flag:
    return Flag(name, Annotated[annotation, option], "checkpoint")


def queues(values: list[str] | None) -> str | list[str] | None:
    """The ``queue`` of ``--queue`` (repeatable, or comma-separated): one pool as itself, several as
    the list of pools in order (the first, then those it falls back to). The API checks each."""
    names = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    if len(names) > 1:
        return names
    return names[0] if names else None


CHECKPOINT_FLAGS = {
    "checkpoint_interval": "interval",
    "checkpoint_signal": "signal",
    "checkpoint_grace": "grace",
    "checkpoint_exit_code": "exit_code",
    "max_pieces": "max_pieces",
}
"""The flags of ``checkpoint``'s rule (by parameter name) and the field of the rule each gives."""


def checkpoint_rule(values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``checkpoint`` of a submit from its flags' ``values`` (by parameter name): any of them
    makes the rule; none: no rule. The API checks the values (a duration, a signal, 3..125)."""
    rule = {field: values[name] for name, field in CHECKPOINT_FLAGS.items() if values.get(name) is not None}
    return rule or None


HAND: dict[str, tuple[Flag, ...]] = {
    "resources": (
        Flag("cpus", Annotated[float | None, typer.Option(help="cpus, e.g. 0.5 or 4")], "cpus"),
        Flag("gpus", Annotated[int | None, typer.Option(help="number of GPUs")], "gpus"),
        Flag("memory", Annotated[str | None, typer.Option(help="memory, e.g. 512m or 8g")], "memory"),
        Flag("disk", Annotated[str | None, typer.Option(help="output disk, e.g. 10g")], "disk"),
        Flag("time_limit", Annotated[str | None, typer.Option("--time", help="time limit, e.g. 90s, 2h")], "time"),
    ),
    "env": (
        Flag(
            "env",
            Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V, repeatable")],
            "env",
            convert=_pairs_of("--env"),
        ),
    ),
    "inputs": (
        Flag(
            "inputs",
            Annotated[list[str] | None, typer.Option("--input", help="NAME=s3://… or run:<id>, repeatable")],
            "inputs",
            convert=_pairs_of("--input"),
        ),
    ),
    "interactive": (
        Flag(
            "interactive",
            Annotated[
                bool,
                typer.Option(
                    "--interactive",
                    "-i",
                    help="your stdin goes to the run's command (as docker run -i): runplane run waits for it to start "
                    "and attaches; killed after the pool's max_idle_interactive without input",
                ),
            ],
            "interactive",
            False,
        ),
    ),
    "tty": (
        Flag(
            "tty",
            Annotated[bool, typer.Option("--tty", "-t", help="with -i: the command has a terminal (yours: -it)")],
            "tty",
            False,
        ),
    ),
    "labels": (
        Flag(
            "labels",
            Annotated[
                list[str] | None,
                typer.Option(
                    "--label", help="KEY=VALUE, a label of yours (runplane ls --label filters by it); repeatable"
                ),
            ],
            "labels",
            convert=_pairs_of("--label"),
        ),
    ),
    "retry": (
        _retry(
            "attempts",
            int | None,
            typer.Option(
                min=1,
                max=10,
                help="retry: the most times it goes, 1..10 (a lost worker is always retried within these)",
                show_default=False,
            ),
        ),
        _retry(
            "retry_on",
            list[str] | None,
            typer.Option(
                "--retry-on",
                help="retry: a failure reason that runs it again (nonzero_exit, out_of_memory, …); repeatable or "
                "comma-separated; needs --attempts",
                show_default=False,
            ),
        ),
        _retry(
            "memory_factor",
            float | None,
            typer.Option(
                help="retry: an out_of_memory attempt goes again with its memory times this; needs --attempts",
                show_default=False,
            ),
        ),
    ),
    "secrets": (
        Flag(
            "secrets",
            Annotated[
                list[str] | None,
                typer.Option(
                    "--secret",
                    help="ENV=NAME or ENV=GROUP/NAME: the variable ENV holds that secret's value (yours, or a "
                    "group's); the run stores the name only, and its logs show the value as ***; repeatable",
                    show_default=False,
                ),
            ],
            "secrets",
            convert=secret_refs,
        ),
    ),
    "queue": (
        Flag(
            "queue",
            Annotated[
                list[str] | None,
                typer.Option(
                    "--queue",
                    metavar="POOL[,POOL...]",
                    help="the pool to run on (default: the smallest that fits); several (comma-separated or "
                    "repeated): the pools in order, the first, then those it falls back to (--fallback-after)",
                    show_default=False,
                ),
            ],
            "queue",
            convert=queues,
        ),
    ),
    "fallback": (),
    "fallback_after": (
        Flag(
            "fallback_after",
            Annotated[
                str | None,
                typer.Option(
                    "--fallback-after",
                    help="with several --queue: how long the run waits queued on a pool before it moves on to the "
                    "next, e.g. 20m",
                    show_default=False,
                ),
            ],
            "fallback_after",
        ),
    ),
    "checkpoint": (
        _checkpoint(
            "checkpoint_interval",
            str | None,
            typer.Option(
                "--checkpoint",
                help="the run checkpoints: $RUNPLANE_CHECKPOINT_DIR is synced every INTERVAL (e.g. 10m) and "
                "whenever the command exits, and every attempt starts from it as it was last synced",
                show_default=False,
            ),
        ),
        _checkpoint(
            "checkpoint_signal",
            str | None,
            typer.Option(
                help="checkpoint: sent to the command before it is stopped (SIGTERM, SIGINT, SIGHUP, SIGUSR1, "
                "SIGUSR2; default SIGTERM)",
                show_default=False,
            ),
        ),
        _checkpoint(
            "checkpoint_grace",
            str | None,
            typer.Option(
                help="checkpoint: how long the command has after the signal to exit, e.g. 60s (default 30s; at most "
                "3/4 of its worker's stop budget: 75s of the default 100s; less when a preemption notice "
                "says the machine goes sooner)",
                show_default=False,
            ),
        ),
        _checkpoint(
            "checkpoint_exit_code",
            int | None,
            typer.Option(
                min=3,
                max=125,
                help="checkpoint: the exit status by which the command says 'checkpointed, start me again' (3..125: "
                "1 and 2 are what any crash exits with)",
                show_default=False,
            ),
        ),
        _checkpoint(
            "max_pieces",
            int | None,
            typer.Option(
                min=1,
                max=10_000,
                help="checkpoint: with --checkpoint-exit-code, the most pieces the run goes in, all attempts together "
                "(default 100, at most 10,000)",
                show_default=False,
            ),
        ),
    ),
    "after": (
        Flag(
            "after",
            Annotated[
                list[str] | None,
                typer.Option(
                    "--after",
                    help="a run of yours to wait for: it stays queued, holding no worker, until that run has "
                    "succeeded (fails dependency_failed if it does not); repeatable or comma-separated",
                    show_default=False,
                ),
            ],
            "after",
            convert=run_ids,
        ),
    ),
}
"""The flags that differ on purpose from what ``derived`` would make of their field: the size and
time shortcuts of ``resources``, the KEY=VALUE flags with names of their own, ``retry``'s three,
``after``'s comma-separated ids, ``--secret``'s ENV=REF pairs (one secret per variable), the rule
of ``checkpoint`` (``--checkpoint INTERVAL`` and four more), ``--queue``'s list of pools (which gives
``fallback`` too: no flag of its own) and ``--fallback-after``'s duration as text. Every other
field's flag is derived."""


def _flags() -> tuple[Flag, ...]:
    flags: list[Flag] = []
    for name, field in RunSpec.model_fields.items():
        if name == "command":
            continue
        if name in HAND:
            flags += HAND[name]
        elif (flag := derived(name, field)) is not None:
            flags.append(flag)
    return tuple(flags)


FLAGS: tuple[Flag, ...] = _flags()
"""Every flag that makes a run, in the order of ``RunSpec``'s fields (as ``--help`` lists them)."""

NO_FLAG = frozenset({"resources", "fallback"})
"""Run options the command line gives no flag of its own (``resources``: its fields' flags;
``fallback``: the pools after the first of ``--queue``)."""

_COMPOSED = frozenset({"retry", "checkpoint"})
"""The options several flags make together."""


def options_from(values: Mapping[str, Any]) -> RunOptions:
    """The run options of the flags' ``values`` (by parameter name): only what was given.
    Raises CliError for a pair that is not NAME=VALUE, retry flags without --attempts, or a
    variable given both by --env and by --secret."""
    given = {f.name: values[f.name] for f in FLAGS if values.get(f.name, f.default) != f.default}
    options: dict[str, Any] = {}
    for f in FLAGS:
        if f.name in given and f.option not in _COMPOSED:
            options[f.option] = f.convert(given[f.name]) if f.convert else given[f.name]
    options["retry"] = retry_rule(given.get("attempts"), given.get("retry_on"), given.get("memory_factor"))
    options["checkpoint"] = checkpoint_rule(given)
    both = sorted(set(options.get("env") or {}) & set(options.get("secrets") or {}))
    if both:
        raise CliError(f"{', '.join(both)[:200]} is given by --env and by --secret: name each variable once")
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
