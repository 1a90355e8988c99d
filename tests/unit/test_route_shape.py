"""A route parses (the routing layer does), calls one service, and returns: no route reaches a
port itself (a store, the clock, the settings) or asks two services, directly or through a helper
of its module; the services answer with what the route shapes into its answer."""

import ast
from collections.abc import Iterator
from pathlib import Path

import runplane.api.routes

ROUTES = Path(runplane.api.routes.__file__).parent
NO_SERVICE = {"tenancy.me"}
"""Routes that answer from the caller's principal alone, which the routing layer has read."""


def _is_operation(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "operation"
        for d in function.decorator_list
    )


def _services(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names a routes module binds to service modules, and to service functions."""
    modules, functions = set(), set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runplane.services"):
            names = {a.asname or a.name for a in node.names}
            (modules if node.module == "runplane.services" else functions).update(names)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name.startswith("runplane.services"))
    return modules, functions


def _port_aliases(function: ast.FunctionDef) -> set[str]:
    """Names the function binds to the ports (``ports = call.ports``), and ``ports`` itself."""
    aliases = {"ports"}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "ports":
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return aliases


def _findings(
    function: ast.FunctionDef, helpers: dict[str, ast.FunctionDef], modules: set[str], functions: set[str]
) -> tuple[int, list[str]]:
    """The calls into the services that ``function`` makes, following the helpers of its module,
    and each reach into a port it makes."""
    calls, reaches, aliases = 0, [], _port_aliases(function)
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            target = node.func
            of_module = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            if (of_module and target.value.id in modules) or (isinstance(target, ast.Name) and target.id in functions):
                calls += 1
            elif isinstance(target, ast.Name) and target.id in helpers and helpers[target.id] is not function:
                more, seen = _findings(helpers[target.id], helpers, modules, functions)
                calls, reaches = calls + more, reaches + seen
        elif isinstance(node, ast.Attribute):
            owner = node.value
            through = (isinstance(owner, ast.Name) and owner.id in aliases) or (
                isinstance(owner, ast.Attribute) and owner.attr == "ports"
            )
            if through:
                reaches.append(f"{function.name}: ports.{node.attr}")
    return calls, reaches


def _routes() -> Iterator[tuple[str, int, list[str]]]:
    for path in sorted(ROUTES.glob("*.py")):
        tree = ast.parse(path.read_text())
        modules, functions = _services(tree)
        helpers = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef) and not _is_operation(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _is_operation(node):
                calls, reaches = _findings(node, helpers, modules, functions)
                yield f"{path.stem}.{node.name}", calls, reaches


def test_every_route_calls_one_service_and_no_port() -> None:
    found = list(_routes())
    assert len(found) > 20, "the routes were not found"
    wrong = [f"{name}: {calls} service calls" for name, calls, _ in found if calls != (name not in NO_SERVICE)]
    reached = [reach for _, _, reaches in found for reach in reaches]
    assert wrong == []
    assert reached == []


def test_the_shape_check_sees_a_second_call_and_a_port() -> None:
    source = (
        "from runplane.services import runs\n"
        "from runplane.services.overview import shown_run\n"
        "def _helper(call): return runs.get_run(call.ports, call.principal, 'r')\n"
        "@operation('GET', '/x')\n"
        "def route(call):\n"
        "    ports = call.ports\n"
        "    shown_run(ports, call.principal, 'r')\n"
        "    return _helper(call), ports.clock(), call.ports.store\n"
    )
    tree = ast.parse(source)
    modules, functions = _services(tree)
    helpers = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef) and not _is_operation(f)}
    route = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and _is_operation(f))
    calls, reaches = _findings(route, helpers, modules, functions)
    assert calls == 2
    assert sorted(reaches) == ["route: ports.clock", "route: ports.store"]
