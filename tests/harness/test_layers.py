"""The packages stand in layers, and no module imports its way round in a circle.

kvcore (the allocator) and kvmodel (the reference model and its vocabulary) at the bottom, independent
of each other and of everything else; kvcheck above them; the suite that runs the machines
(``kvcheck.stateful_tests``, ``kvcheck.regressions``) on top.  ``lint-imports`` checks the contracts of
``pyproject.toml`` over the installed packages; this test reads the checkout's source itself, so it also
covers the suite's folders (installed inside kvcheck, kept at the top of the checkout) and cycles
between a package and its own modules.  Every import counts, at any depth in a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FOLDERS = {
    "kvcore": "kvcore",
    "kvmodel": "kvmodel",
    "kvcheck": "kvcheck",
    "kvcheck.stateful_tests": "stateful_tests",
    "kvcheck.regressions": "regressions",
}
"""Each package, by the folder of the checkout that holds it."""

LAYERS = {"kvcore": 0, "kvmodel": 0, "kvcheck": 1, "kvcheck.stateful_tests": 2, "kvcheck.regressions": 2}

UPWARD_IMPORTS = {("kvcheck.campaign.shards", "kvcheck.stateful_tests.manager_machine")}
"""Imports that reach a layer up, each a known exception: the campaign runs the manager machine in its
shards (it belongs with what runs the machines, above them)."""


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
            found[name] = path
    return found


def package_of(module: str) -> str:
    return max((p for p in FOLDERS if module == p or module.startswith(p + ".")), key=len)


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """Per module of ours, the modules of ours it imports (``from package import name`` names the
    module ``package.name`` when there is one, else the package)."""
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
                )
        graph[module] = {target for target in targets if target in known and target != module}
    return graph


def test_no_module_imports_a_layer_above_its_own() -> None:
    known = modules()
    upward = sorted(
        (importer, imported)
        for importer, targets in imports(known).items()
        for imported in targets
        if LAYERS[package_of(imported)] > LAYERS[package_of(importer)] and (importer, imported) not in UPWARD_IMPORTS
    )
    assert not upward, f"imports from a higher layer: {upward}"


def test_kvcore_and_kvmodel_import_nothing_of_each_other() -> None:
    known = modules()
    across = sorted(
        (importer, imported)
        for importer, targets in imports(known).items()
        for imported in targets
        if {package_of(importer), package_of(imported)} == {"kvcore", "kvmodel"}
    )
    assert not across, f"kvcore and kvmodel import each other: {across}"


def test_the_known_upward_imports_are_still_there() -> None:
    """An exception that no longer happens is dropped from :data:`UPWARD_IMPORTS`, not kept."""
    graph = imports(modules())
    assert all(imported in graph[importer] for importer, imported in UPWARD_IMPORTS)


def test_no_import_cycle_between_modules() -> None:
    """No strongly connected set of two modules or more in the import graph (Tarjan's algorithm)."""
    graph = imports(modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_is_read() -> None:
    """The reader finds imports where they are known to be, so that the tests above cannot pass on an
    empty graph."""
    graph = imports(modules())
    assert "kvmodel.config" in graph["kvmodel.manager.state"]
    assert "kvcheck.targets.interface" in graph["kvcheck.targets.differential"]
    assert "kvcheck.lockstep" in graph["kvcheck.stateful_tests.manager_machine"]
