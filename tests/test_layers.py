"""The modules of ``service`` stand in layers: no import cycle, deferred imports included.

An import inside a function or under ``TYPE_CHECKING`` still makes each module depend on the
other, so every ``import`` statement counts. A module imported through its package counts as the
package's ``__init__`` too (importing ``service.mechanisms.auto`` runs
``service/mechanisms/__init__.py`` first).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "service"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of the package that the module ``name`` imports anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            if target in known:
                found.add(target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports."""
    names = {module_name(path): path for path in sorted((ROOT / PACKAGE).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name] = imported(tree, name, path.name == "__init__.py", set(names))
    return graph


def test_the_service_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package
    try:
        order = list(graph_order(graph))
    except graphlib.CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None
    assert order.index("service.jobs") < order.index("service.continual")
    assert order.index("service.mechanisms.components") < order.index("service.mechanisms.auto")


def graph_order(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """The modules, each after every module it imports (``CycleError`` names a cycle)."""
    return tuple(graphlib.TopologicalSorter(graph).static_order())


def test_a_cycle_is_found() -> None:
    try:
        graph_order({"a": {"b"}, "b": {"a"}})
    except graphlib.CycleError:
        return
    raise AssertionError("the cycle a -> b -> a was not found")


def test_the_check_sees_deferred_imports() -> None:
    """A cycle closed by an import inside a function (as worker <-> continual was) is found."""
    tree = ast.parse("def f():\n    from service.worker import Worker\n")
    assert imported(tree, "service.continual", False, {"service.worker"}) == {"service.worker"}


#: The job kinds under the worker (issue 33, item 4) and the layer they share with it.
JOB_KINDS = ("service.oneshot", "service.continual")
JOB_LAYER = ("service.jobs", "service.isolation", "service.registration")


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in graph[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def test_a_job_kind_never_calls_back_into_the_worker() -> None:
    """The worker calls a job kind (claim, lease, heartbeat, isolated run, store, outcome are
    its own); a job kind never imports the worker, not even through another module."""
    graph = import_graph()
    for name in (*JOB_KINDS, *JOB_LAYER):
        assert "service.worker" not in reachable(graph, name), name
    assert set(JOB_KINDS) <= graph["service.worker"]


def test_the_reachability_check_sees_an_indirect_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert reachable(graph, "a") == {"b", "c"} and reachable(graph, "c") == set()
