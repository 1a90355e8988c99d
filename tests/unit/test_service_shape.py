"""One shape for a use case: a service function that reaches a store, a queue, a backend or the
time takes the one ``Ports`` bundle first, and nothing else of the kind; the clock's type is
declared once, in ``runplane.ports``."""

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import runplane.services

PORT_NAMES = re.compile(
    r"\b(RunStore|SweepStore|RunQueue|WorkerRegistry|TokenStore|PoolStateStore|QuotaStore|ObjectStore"
    r"|ComputeBackend|Clock|Stack|Callable\[\[\], ?float\])\b"
)
PRIMITIVES = {
    "runplane.services.lifecycle": "a run's state changes, written by the agent and the reaper with the time they read",
    "runplane.services.admission": "quota holds taken and given back beside those state changes",
    "runplane.services.logs": "readers of one object store (a run's logs and outputs)",
    "runplane.services.auth": "the token cache and the token check over one token store",
}
"""Modules of primitives over the one port each function touches, at a time its caller passes."""


def _functions() -> Iterator[tuple[str, str, Any]]:
    for info in pkgutil.iter_modules(runplane.services.__path__):
        module = importlib.import_module(f"runplane.services.{info.name}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == module.__name__ and not name.startswith("_"):
                yield module.__name__, name, function


def test_every_service_that_reaches_a_port_takes_the_ports_first() -> None:
    wrong = []
    for module, name, function in _functions():
        if module in PRIMITIVES:
            continue
        params = list(inspect.signature(function).parameters.values())
        for place, param in enumerate(params):
            annotation = str(param.annotation)
            if param.name == "ports" and (place != 0 or annotation != "Ports"):
                wrong.append(f"{module}.{name}: ports must come first, as Ports")
            elif param.name == "clock" or PORT_NAMES.search(annotation):
                wrong.append(f"{module}.{name}({param.name}: {annotation}): take it from Ports")
    assert wrong == []


def test_the_clock_type_is_declared_once() -> None:
    root = Path(runplane.services.__file__).parent.parent
    declared = [
        str(path.relative_to(root.parent))
        for path in sorted(root.rglob("*.py"))
        if re.search(r"^Clock\s*=", path.read_text(), re.MULTILINE)
    ]
    assert declared == ["runplane/ports.py"]
