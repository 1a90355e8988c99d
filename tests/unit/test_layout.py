"""The shape of the code: no module of the deployables is over 500 lines, and their import graph
has no circles. Imports inside functions count: one placed there to dodge a circle is still one."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runplane", "worker_agent", "functions")
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` tests ``TYPE_CHECKING`` itself (``typing.TYPE_CHECKING`` too): its body
    never runs. ``if not TYPE_CHECKING:`` and the like run, so they count."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, modules: Collection[str]) -> set[str]:
    """The project modules ``name`` (at ``path``) imports."""
    return _imports_in(name, path.read_text(), path.name == "__init__.py", modules)


def _imports_in(name: str, source: str, is_package: bool, modules: Collection[str]) -> set[str]:
    """The project modules (of ``modules``) that module ``name`` of ``source`` imports, anywhere in
    its body (the body of ``if TYPE_CHECKING:`` aside: it is never executed)."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else base)
    resolved: set[str] = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            if children:
                child = children.pop()
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _without_package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` less the edges of a package's ``__init__`` to its own modules that do not import
    the package back: importing its modules is how a package is built, not a circle. A module that
    imports its package back while the package imports it is one (the two half-built at import)."""
    return {
        name: {t for t in targets if not (t.startswith(name + ".") and name not in graph.get(t, set()))}
        for name, targets in graph.items()
    }


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return _without_package_edges({name: _imports(name, path, modules) for name, path in modules.items()})


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_the_import_graph_has_no_circles() -> None:
    assert _cycles(_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_a_package_and_a_module_of_its_own_that_import_each_other_are_a_circle() -> None:
    graph = {"p": {"p.a", "p.b"}, "p.a": {"p"}, "p.b": {"q"}, "q": set()}
    assert _cycles(_without_package_edges(graph)) == [["p", "p.a"]]
    assert _without_package_edges(graph)["p"] == {"p.a"}  # p.b, which never imports p, is no edge


def test_only_the_body_of_if_type_checking_is_left_out() -> None:
    source = """
import typing
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import p.hinted
if typing.TYPE_CHECKING:
    import p.hinted_too
else:
    import p.otherwise
if not TYPE_CHECKING:
    import p.run
def f():
    import p.late
"""
    modules = {"p", "p.hinted", "p.hinted_too", "p.otherwise", "p.run", "p.late", "p.m"}
    assert _imports_in("p.m", source, False, modules) == {"p.otherwise", "p.run", "p.late"}
