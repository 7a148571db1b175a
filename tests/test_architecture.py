"""The house rules of the import graph, read from the source with `ast` (nothing is imported):

- the module-level imports of `relif_ray/` and `analysis/` form no cycle;
- only the Ray layer (`relif_ray.tuning`) imports Ray at module level;
- only the command-line package (`relif_ray.cli`) imports `analysis`.

Imports inside functions (deferred for start-up time) and under `if TYPE_CHECKING:` do not
run when a module is imported, so they are not edges.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("relif_ray", "analysis")
RAY_LAYER = "relif_ray.tuning"
CLI_PACKAGE = "relif_ray.cli"


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file of `packages` under `root`."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _executed_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run on import: module and class bodies, both branches of `if`
    (except an `if TYPE_CHECKING:` body), `try` and `with` blocks; not function bodies."""
    result = []
    for node in body:
        result.append(node)
        if isinstance(node, ast.If):
            inner = node.orelse if _is_type_checking(node.test) else node.body + node.orelse
            result += _executed_statements(inner)
        elif isinstance(node, ast.Try):
            blocks = node.body + node.orelse + node.finalbody
            blocks += [stmt for handler in node.handlers for stmt in handler.body]
            result += _executed_statements(blocks)
        elif isinstance(node, ast.With | ast.ClassDef):
            result += _executed_statements(node.body)
    return result


def module_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Dotted names `name` imports at module level: `from p import m` names the submodule
    `p.m` where `m` is one of `known`, else `p`; relative imports are resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported = set()
    for node in _executed_statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                imported.add(submodule if submodule in known else base)
    return imported


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> every name it imports at module level (inside and outside `packages`)."""
    modules = find_modules(root, packages)
    return {name: module_level_imports(name, path, set(modules)) for name, path in modules.items()}


def internal_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {
        name: {target for target in targets if target in graph} for name, targets in graph.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(internal_graph(graph)).static_order())
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


def _top(name: str) -> str:
    return name.partition(".")[0]


def _in_ray_layer(name: str) -> bool:
    return name == RAY_LAYER or name.startswith(f"{RAY_LAYER}.")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(REPO, PACKAGES)


def test_the_module_level_import_graph_is_acyclic(graph):
    assert len(graph) > 40 and "relif_ray.engine" in graph["relif_ray.tuning.trainable"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_only_the_ray_layer_imports_ray(graph):
    importers = {name for name, targets in graph.items() if any(_top(t) == "ray" for t in targets)}
    assert importers, "the Ray layer must import Ray (else this test checks nothing)"
    assert {name for name in importers if name.startswith("relif_ray")} <= {
        name for name in graph if _in_ray_layer(name)
    }, f"Ray imported outside {RAY_LAYER}: {sorted(n for n in importers if not _in_ray_layer(n))}"


def _in_cli(name: str) -> bool:
    return name == CLI_PACKAGE or name.startswith(f"{CLI_PACKAGE}.")


def test_only_the_command_line_package_imports_analysis(graph):
    importers = {
        name
        for name, targets in graph.items()
        if _top(name) != "analysis" and any(_top(t) == "analysis" for t in targets)
    }
    assert importers, "the command line must import analysis (else this test checks nothing)"
    assert all(_in_cli(name) for name in importers), sorted(importers)


def test_the_import_reader_sees_cycles_and_skips_deferred_imports(tmp_path):
    """The reader itself: a cycle through a relative import is found, while an import inside a
    function or under TYPE_CHECKING is not an edge."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from toy.c import C\n"
        "def later():\n    import toy.c\n"
        "try:\n    import toy.a\nexcept ImportError:\n    pass\n"
    )
    (package / "c.py").write_text("import toy.b\nimport ray.tune\n")
    graph = import_graph(tmp_path, ("toy",))
    assert internal_graph(graph) == {
        "toy": set(),
        "toy.a": {"toy.b"},
        "toy.b": {"toy.a"},
        "toy.c": {"toy.b"},
    }
    assert set(find_cycle(graph)) == {"toy.a", "toy.b"}
    assert "ray.tune" in graph["toy.c"]
