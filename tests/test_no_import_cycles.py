"""No import cycle between the project's modules, function-level imports included.

`lint-imports` checks that the layers point one way (pyproject.toml's contracts); this checks the finer rule of the
developers' guide, "no import cycles", inside every package too. The graph is grimp's (the library import-linter
is built on): every `import` statement in every module of the project's packages, at module level or inside a
function, `if TYPE_CHECKING` included. A cycle hidden behind a lazy import or a module `__getattr__` is still a
cycle: each module of it can only be understood with the others. Building the graph takes well under a second.
"""

from __future__ import annotations

import sys
import textwrap
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def project_packages() -> list[str]:
    """The top-level packages the distribution ships (pyproject.toml's `packages.find.include`)."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = spec["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({name.rstrip("*").rstrip(".") for name in include})


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
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


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """Each import inside one cycle, with its line: where to cut it."""
    lines = []
    for importer in component:
        for imported in component:
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']} {detail['line_contents'].strip()}")
    return "\n".join([" <-> ".join(component), *lines])


def test_no_import_cycle_between_project_modules():
    packages = project_packages()
    assert {"eval", "infra", "training", "scheduling", "rlhfops"} <= set(packages)
    graph = grimp.build_graph(*packages, cache_dir=None)
    assert len(graph.modules) > 50  # the whole project was read, not an empty graph
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n\n".join(describe(graph, c) for c in found)


def test_the_check_sees_a_cycle_made_of_function_level_imports(tmp_path, monkeypatch):
    """The oracle for the check above: a package written here with one cycle through an import inside a function
    (the shape a compatibility shim takes) and one module-level chain without a cycle."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text(textwrap.dedent("""
        def late():
            from cyclepkg import c
            return c
    """))
    (pkg / "c.py").write_text("import cyclepkg.a\n")
    (pkg / "d.py").write_text("from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclepkg", cache_dir=None)
    assert cycles(graph) == [["cyclepkg.a", "cyclepkg.b", "cyclepkg.c"]]
    assert "cyclepkg.b:3 from cyclepkg import c" in describe(graph, cycles(graph)[0])
    sys.modules.pop("cyclepkg", None)
