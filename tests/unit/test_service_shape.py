"""One shape for a use case: a service function (public or private, or a class's ``__init__``)
that reaches more than one port, or the time, takes one bundle of them first, as ``ports``: the
control plane's ``Ports``, or a narrower view of it that the agent's ``AgentPorts`` also is
(``RunPorts``, ``QuotaPorts``). A function that takes exactly one port and no clock may take that
port alone only when it is named below, with the reason. The clock's type is declared once, in
``runplane.ports``."""

import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import runplane.ports
import runplane.services

PORT_NAMES = re.compile(
    r"\b(RunStore|SweepStore|RunQueue|WorkerRegistry|TokenStore|PoolStateStore|QuotaStore|ObjectStore"
    r"|ComputeBackend|Stack|StackSettings|PoolConfig|InputRules|InputPolicy|OwnerDirectory|Owners"
    r"|CachedTokens|CachedQuotas)\b"
)
CLOCK = re.compile(r"\bClock\b|Callable\[\[\], ?float\]")
BUNDLES = {"Ports", "RunPorts", "QuotaPorts"}

ONE_PORT = {
    "runplane.services.lifecycle.claim": "one conditional write to the runs store, at the time the worker read",
    "runplane.services.lifecycle.renew": "one conditional write to the runs store, at the time the worker read",
    "runplane.services.lifecycle.advance": "one conditional write to the runs store, at the time the worker read",
    "runplane.services.lifecycle.fail": "one conditional write to the runs store, at the time the worker read",
    "runplane.services.lifecycle.note": "one conditional write to the runs store, at the time the worker read",
    "runplane.services.lifecycle.ended": "one message to the dispatcher's queue",
    "runplane.services.admission.refuse_alone": "reads the quotas of an owner and a group",
    "runplane.services.admission.reserve": "a conditional write to usage records, from the agent's own quota store",
    "runplane.services.admission.release": "a conditional write to usage records, from the agent's own quota store",
    "runplane.services.admission._take": "one conditional write to a usage record",
    "runplane.services.admission._give_back": "one conditional write to a usage record",
    "runplane.services.admission._release_from": "one conditional write to a usage record",
    "runplane.services.admission._left_behind": "reads one run",
    "runplane.services.auth.register_token": "one write to the token store, made at the caller's time",
    "runplane.services.auth.authenticate": "one read of the token store, at the request's time",
    "runplane.services.authority.still_allowed": "checks a spec's inputs against the operator's rules",
    "runplane.services.authority.check_caller": "checks a spec's inputs against the operator's rules",
    "runplane.services.logs.read_logs": "reads one bucket: the run's logs",
    "runplane.services.logs.read_outputs": "reads one bucket: the run's outputs",
    "runplane.services.logs._chunk": "reads one bucket",
    "runplane.services.logs._probe": "reads one bucket",
    "runplane.services.logs._chunk_before": "reads one bucket",
    "runplane.services.logs._last_chunk": "reads one bucket",
    "runplane.services.fallback.next_configured": "reads the pools file alone (an agent, which has none, gives None)",
    "runplane.services.fallback.moves_on_preemption": "reads the pools file alone, through next_configured",
    "runplane.services.checkpoints.newest": "reads one bucket: a run's checkpoint series (the agent's too)",
    "runplane.services.checkpoints.numbered": "reads one bucket: a run's checkpoint series (the agent's too)",
    "runplane.services.checkpoints.manifests": "reads one bucket: a run's checkpoint series (the agent's too)",
    "runplane.services.checkpoints.blob_sizes": "reads one bucket: a run's checkpoint series (the agent's too)",
    "runplane.services.checkpoints.read_manifest": "reads one object: a checkpoint's manifest (the agent's too)",
    "runplane.services.checkpoints._shown": "reads one bucket: a run's checkpoint series",
    "runplane.services.checkpoints._at": "reads one object: a checkpoint's manifest",
    "runplane.services.skew.stack_record": "reads one object: the control plane's record for its agents",
    "runplane.services.skew.put_stack_record": "writes one object: the control plane's record for its agents",
}
"""Functions that take exactly one port (and no clock) by itself: module.function -> why."""

PORTS_THEMSELVES = {
    "runplane.services.auth.CachedTokens": ("TokenStore", "a token store in front of one; its clock ages its cache"),
    "runplane.services.admission.CachedQuotas": (
        "QuotaStore",
        "a quota store in front of one; its clock ages its cache",
    ),
    "runplane.services.authority.Owners": ("OwnerDirectory", "built into Ports from its token store and its clock"),
}
"""Classes that are a port (they have every method of it), built from another port and a clock
before any ``Ports`` exists: class -> (the port, why)."""


def _callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    for info in pkgutil.iter_modules(runplane.services.__path__):
        module = importlib.import_module(f"runplane.services.{info.name}")
        for name, member in vars(module).items():
            if getattr(member, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(member):
                yield f"{module.__name__}.{name}", member
            elif (
                inspect.isclass(member)
                and "__init__" in vars(member)
                and f"{module.__name__}.{name}" not in PORTS_THEMSELVES
            ):
                yield f"{module.__name__}.{name}.__init__", vars(member)["__init__"]


def _wrong(name: str, function: Callable[..., Any]) -> list[str]:
    params = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    annotations = [str(p.annotation) for p in params]
    wrong = []
    for place, (param, annotation) in enumerate(zip(params, annotations, strict=True)):
        if param.name == "ports" and (place != 0 or annotation not in BUNDLES):
            wrong.append(f"{name}: ports must come first, as one of {sorted(BUNDLES)}")
    loose = [f"{p.name}: {a}" for p, a in zip(params, annotations, strict=True) if PORT_NAMES.search(a)]
    clocks = [
        f"{p.name}: {a}" for p, a in zip(params, annotations, strict=True) if p.name == "clock" or CLOCK.search(a)
    ]
    bundled = bool(params) and params[0].name == "ports"
    if clocks:
        wrong.append(f"{name}({', '.join(clocks)}): read the time from the ports' clock, or take the time it is")
    if bundled and loose:
        wrong.append(f"{name}({', '.join(loose)}): take it from the ports")
    elif len(loose) > 1:
        wrong.append(f"{name}({', '.join(loose)}): more than one port: take a bundle of them")
    elif loose and name not in ONE_PORT:
        wrong.append(f"{name}({loose[0]}): one port alone: take the ports, or say why not in ONE_PORT")
    return wrong


def test_every_service_that_reaches_a_port_takes_the_ports_first() -> None:
    wrong = [line for name, function in _callables() for line in _wrong(name, function)]
    assert wrong == []


def test_only_functions_of_one_port_are_let_off() -> None:
    found = dict(_callables())
    assert sorted(set(ONE_PORT) - set(found)) == []
    for name in ONE_PORT:
        params = inspect.signature(found[name]).parameters.values()
        assert sum(1 for p in params if PORT_NAMES.search(str(p.annotation))) == 1, name


def test_what_is_let_off_as_a_port_is_one() -> None:
    for name, (port, _why) in PORTS_THEMSELVES.items():
        module, _, cls = name.rpartition(".")
        implementation = getattr(importlib.import_module(module), cls)
        protocol = getattr(runplane.ports, port)
        wanted = {m for m in vars(protocol) if not m.startswith("_") and callable(vars(protocol)[m])}
        assert wanted and wanted <= set(dir(implementation)), name


def test_no_service_reads_the_time_of_day_itself() -> None:
    """The time a service writes comes from its caller's clock (``Ports.clock``, or the time the
    caller read), never from a default of its own: a test that moves the clock moves all of it."""
    folder = Path(runplane.services.__file__).parent
    reads = [
        f"{path.name}:{number}"
        for path in sorted(folder.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\btime\.time\b|\bdatetime\.(now|utcnow|today)\(|\bdate\.today\(", line)
    ]
    assert reads == []


def test_the_clock_type_is_declared_once() -> None:
    root = Path(runplane.services.__file__).parent.parent
    declared = [
        str(path.relative_to(root.parent))
        for path in sorted(root.rglob("*.py"))
        if re.search(r"^Clock\s*=", path.read_text(), re.MULTILINE)
    ]
    assert declared == ["runplane/ports.py"]
