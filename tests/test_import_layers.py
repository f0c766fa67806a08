"""The import rule, checked on the real import graph (every `import` in every module, `ast`).

Floors, lowest first: `configkit` and `protos` import none of the others; `detection` imports
neither side, nor `fleet` (model updates; beside it, importing neither side either); `edge_agent`
and `cloud_service` never import each other; none of these imports `testbed` or `bench`, and
`testbed` imports no bench. And no import circle between modules of any package here: lazy
imports inside functions and `TYPE_CHECKING` blocks count, since a circle there is still two
modules that cannot be understood apart.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "configkit",
    "protos",
    "detection",
    "fleet",
    "edge_agent",
    "cloud_service",
    "testbed",
    "bench",
)
Graph = dict[str, dict[str, int]]  # module -> {imported module: line of the first import}

# package -> packages of this repo it must never import
FORBIDDEN = {
    "configkit": {
        "protos",
        "detection",
        "fleet",
        "edge_agent",
        "cloud_service",
        "testbed",
        "bench",
    },
    "protos": {
        "configkit",
        "detection",
        "fleet",
        "edge_agent",
        "cloud_service",
        "testbed",
        "bench",
    },
    "detection": {"fleet", "edge_agent", "cloud_service", "testbed", "bench"},
    "fleet": {"edge_agent", "cloud_service", "testbed", "bench"},
    "edge_agent": {"cloud_service", "testbed", "bench"},
    "cloud_service": {"edge_agent", "testbed", "bench"},
    "testbed": {"bench"},
}


def _module_files() -> Iterator[tuple[str, Path, bool]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            yield ".".join(parts[:-1] if is_package else parts), path, is_package


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Dotted names each import statement may load (`from a import b`: `a.b`, then `a`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: None if is_package else -1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def import_graph() -> Graph:
    """Each module of `PACKAGES` and the modules of `PACKAGES` it imports."""
    files = list(_module_files())
    modules = {name for name, _, _ in files}
    graph: Graph = {}
    for name, path, is_package in files:
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        for imported, line in _imported_names(tree, name, is_package):
            while imported and imported not in modules:  # `from a import b` where b is a name
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.setdefault(imported, line)
        graph[name] = edges
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
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


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph()


def test_the_graph_sees_the_imports_it_should(graph: Graph) -> None:
    assert len(graph) > 200, "too few modules found: is ROOT right?"
    assert "detection.detections" in graph["cloud_service.processor"]  # `from a.b import name`
    assert "cloud_service.decoders.nvimgcodec" in graph["cloud_service.decoders.factory"]  # lazy
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_runs_against_the_floors(graph: Graph, package: str) -> None:
    wrong = [
        f"{module} imports {imported} (line {line})"
        for module, edges in graph.items()
        if module.split(".")[0] == package
        for imported, line in edges.items()
        if imported.split(".")[0] in FORBIDDEN[package]
    ]
    assert wrong == [], f"{package} must not import {sorted(FORBIDDEN[package])}:\n" + "\n".join(
        wrong
    )


def test_no_import_circles(graph: Graph) -> None:
    found = [
        " -> ".join(component)
        + ": "
        + "; ".join(
            f"{a} imports {b} (line {graph[a][b]})"
            for a in component
            for b in component
            if b in graph[a]
        )
        for component in circles(graph)
    ]
    assert found == [], "import circles (move the shared piece where both can import it):\n" + (
        "\n".join(found)
    )
