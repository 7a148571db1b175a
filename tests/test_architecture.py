"""The house rules of the source tree, read with `ast` and as text (nothing is imported):

- the imports of `relif_ray/` and `analysis/` form no cycle, nor do the benchmark scripts'
  imports of each other;
- only the Ray layer (`relif_ray.tuning`) imports Ray, and outside it only the command line
  imports the Ray layer (so `relif_ray.sweep` and the rest never reach Ray);
- the audit, ReLiF and the squash (`relif_ray.audit*`, `relif_ray.relif`, `relif_ray.squash`)
  reach no storage: no experiment code, no pyarrow, not the reference's file I/O;
- only the front doors, the command-line package (`relif_ray.cli`) and the Python API of
  sweeps (`relif_ray.sweep_api`, which runs a sweep through the command line's path), import
  `relif_ray.analysis` (the repository's `analysis/` folder, installed under the project's
  name), and only the command line parses arguments (imports `argparse`);
- only `relif_ray.experiment.storage` decides whether a location is local (the `"://"` test);
- only `relif_ray.experiment.record` spells the keys of a trial's results and of its trial.json;
- one home each for the squash formula and the other audit interfaces (`relif_ray.squash`),
  whether lambda adapts (`ReLiFConfig.controller_adapts`, asked by `relif_ray.sweep.labels`
  and the controller) and the first / last line of an error (`relif_ray.errors`);
- the audit's sampling settings (N_eval, S, the seeds) travel as one
  `relif_ray.audit.AuditSettings`: no function takes them one by one or re-spells their defaults;
- `relif_ray/cli/` holds parsers, not measurements (no row, machine record or targets, no import
  of the benchmarks); in `benchmarks/` the harness alone defines the row and the machine and
  run records, and `targets.py` alone holds targets (the fidelity experiment's too);
- the analysis notebook uses only public names: each project name it imports or reads off a
  module is in that module's `__all__`;
- no module of `relif_ray/`, `analysis/` and `benchmarks/` has more than `MAX_MODULE_LINES`
  lines, and no function more than `MAX_FUNCTION_LINES` unless `LONG_FUNCTIONS` lists it with
  a reason; the modules split to stay under it keep each concern in one module
  (`CONCERN_HOMES`).

Every import counts, also one inside a function (deferred for start-up time: it still runs
when the function is called); only imports under `if TYPE_CHECKING:` never run and are not
edges of the library's graph.
"""

from __future__ import annotations

import ast
import graphlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("relif_ray", "analysis")
INSTALLED_AS = {"analysis": "relif_ray.analysis"}
"""Package folders installed under another dotted name (pyproject's package-dir)."""
ANALYSIS = "relif_ray.analysis"
LENGTH_RULED = (*PACKAGES, "benchmarks")
"""The folders whose modules and functions the length limits hold (the benchmark scripts too)."""
RAY_LAYER = "relif_ray.tuning"
CLI_PACKAGE = "relif_ray.cli"
SWEEP_API = "relif_ray.sweep_api"
STORAGE_MODULE = "relif_ray/experiment/storage.py"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS = {
    "relif_ray/tuning/launch.py:run_sweep": "the one place a Tune run is configured: the "
    "Tuner, TuneConfig and RunConfig of a new sweep and the restore of a resumed one, with the "
    "fail-fast checks before them and a docstring that documents all of it",
}
"""Functions longer than `MAX_FUNCTION_LINES` (file:name -> why); a new one fails the test."""


def find_modules(
    root: Path, packages: tuple[str, ...], installed_as: dict[str, str] | None = None
) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file of the package folders
    `packages` under `root` (a folder installed under another name: `installed_as`)."""
    modules = {}
    for package in packages:
        prefix = (installed_as or {}).get(package, package).split(".")
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root / package).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([*prefix, *parts])] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of every node inside an `if TYPE_CHECKING:` body (its `else` runs)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            inside |= {id(child) for statement in node.body for child in ast.walk(statement)}
    return inside


def imports_of(name: str, path: Path, known: set[str], type_checking: bool = False) -> set[str]:
    """Dotted names `name` imports anywhere (module level and inside functions; under
    `if TYPE_CHECKING:` only with `type_checking`): `from p import m` names the submodule
    `p.m` where `m` is one of `known`, else `p`; relative imports are resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = set() if type_checking else _type_checking_only(tree)
    imported = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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


def import_graph(
    root: Path,
    packages: tuple[str, ...],
    installed_as: dict[str, str] | None = None,
    type_checking: bool = False,
) -> dict[str, set[str]]:
    """Module -> every name it imports (inside and outside `packages`; those imported for the
    type checker only with `type_checking`)."""
    modules = find_modules(root, packages, installed_as)
    return {
        name: imports_of(name, path, set(modules), type_checking) for name, path in modules.items()
    }


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
    return import_graph(REPO, PACKAGES, INSTALLED_AS)


def test_the_import_graph_is_acyclic(graph):
    assert len(graph) > 40 and "relif_ray.engine" in graph["relif_ray.tuning.trainable"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_import_graph_is_acyclic_with_the_type_checkers_imports():
    """The library and analysis (as `relif_ray.analysis`) form no cycle either when the imports
    made for the type checker only count: each concept's owner is imported by its users, never
    the other way round (the outputs' schema is its own module, which the evaluation imports)."""
    typed = import_graph(REPO, PACKAGES, INSTALLED_AS, type_checking=True)
    assert "relif_ray.evaluation" in typed["relif_ray.experiment.outputs"]  # a TYPE_CHECKING one
    assert "relif_ray.analysis.experiment" in typed
    assert find_cycle(typed) is None, f"import cycle: {' -> '.join(find_cycle(typed))}"


def test_the_graphed_step_knows_nothing_of_the_engine():
    """The engine asks `relif_ray.cuda_graph.eager_reason` whether a step is graphed and gives
    `GraphedStep` the step to replay: relif_ray/cuda_graph.py names the engine in no import,
    not even one for type checking only, and the engine keeps no CUDA-graph rule of its own."""
    tree = ast.parse((REPO / "relif_ray" / "cuda_graph.py").read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "relif_ray.engine" not in imported and "TrainingRun" not in ast.unparse(tree)
    engine = (REPO / "relif_ray" / "engine.py").read_text()
    assert "def eager_reason" not in engine and '"capturable"' not in engine


def test_the_library_logs_and_only_the_command_line_prints():
    """`print` is called only by the command-line package and by `relif_ray.messages`, whose
    handler shows the library's log records on the terminal; the rest logs."""
    printing = []
    for path in [*(REPO / "relif_ray").rglob("*.py"), *(REPO / "analysis").rglob("*.py")]:
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith("relif_ray/cli/") or relative == "relif_ray/messages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                printing.append(f"{relative}:{node.lineno}")
    assert printing == []


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every name `start` imports, directly or through the library's own modules."""
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_only_the_ray_layer_imports_ray(graph):
    importers = {name for name, targets in graph.items() if any(_top(t) == "ray" for t in targets)}
    assert importers, "the Ray layer must import Ray (else this test checks nothing)"
    assert {name for name in importers if name.startswith("relif_ray")} <= {
        name for name in graph if _in_ray_layer(name)
    }, f"Ray imported outside {RAY_LAYER}: {sorted(n for n in importers if not _in_ray_layer(n))}"
    entering = {
        name
        for name, targets in graph.items()
        if not (_in_ray_layer(name) or _in_cli(name)) and any(map(_in_ray_layer, targets))
    }
    assert entering == set(), f"only the command line may import the Ray layer: {entering}"
    assert "relif_ray.tuning" in graph["relif_ray.cli.sweep"]


STORAGE_FREE = ("relif_ray.audit", "relif_ray.relif", "relif_ray.squash")
"""The math that own training loops use: plain torch/numpy, no storage (as prefixes: the audit's
modules `relif_ray.audit`, `relif_ray.audit_thresholds` and `relif_ray.audit_bootstrap`)."""


def _is_storage(name: str) -> bool:
    return _top(name) == "pyarrow" or name.startswith(
        ("relif_ray.experiment", "relif_ray.reference", RAY_LAYER)
    )


def test_the_audit_relif_and_the_squash_reach_no_storage(graph):
    starts = [name for name in graph if name.startswith(STORAGE_FREE)]
    assert len(starts) >= 6, starts  # audit, squash and the relif package's modules
    assert "relif_ray.audit_thresholds" in starts
    reached = {name: sorted(filter(_is_storage, reachable(graph, name))) for name in starts}
    assert {name: found for name, found in reached.items() if found} == {}
    assert any(map(_is_storage, reachable(graph, "relif_ray.reference")))  # the check sees


def _in_cli(name: str) -> bool:
    return name == CLI_PACKAGE or name.startswith(f"{CLI_PACKAGE}.")


def _in_analysis(name: str) -> bool:
    return name == ANALYSIS or name.startswith(f"{ANALYSIS}.")


def test_only_the_front_doors_import_analysis(graph):
    importers = {
        name
        for name, targets in graph.items()
        if not _in_analysis(name) and any(map(_in_analysis, targets))
    }
    assert importers, "the command line must import analysis (else this test checks nothing)"
    assert all(_in_cli(name) or name == SWEEP_API for name in importers), sorted(importers)
    assert not any(map(_in_ray_layer, graph[SWEEP_API]))  # it enters Ray through the command


def test_the_import_reader_sees_cycles_and_deferred_imports_but_not_type_checking_ones(tmp_path):
    """The reader itself: a cycle through a relative import is found, an import inside a
    function is an edge (it runs when the function does), one under TYPE_CHECKING is not."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from toy.c import C\n"
        "def later():\n    import toy.d\n"
        "try:\n    import toy.a\nexcept ImportError:\n    pass\n"
    )
    (package / "c.py").write_text("import toy.b\nimport ray.tune\n")
    (package / "d.py").write_text("def later():\n    from toy import c\n")
    graph = import_graph(tmp_path, ("toy",))
    assert internal_graph(graph) == {
        "toy": set(),
        "toy.a": {"toy.b"},
        "toy.b": {"toy.a", "toy.d"},
        "toy.c": {"toy.b"},
        "toy.d": {"toy.c"},
    }
    assert find_cycle(graph)
    assert reachable(graph, "toy.d") >= {"toy.a", "toy.b", "toy.c", "ray.tune"}
    typed = import_graph(tmp_path, ("toy",), type_checking=True)
    assert internal_graph(typed)["toy.b"] == {"toy.a", "toy.c", "toy.d"}
    del graph["toy.a"]
    assert set(find_cycle(graph)) == {"toy.b", "toy.c", "toy.d"}


def test_the_installed_packages_are_every_package_folder():
    """pyproject's explicit package list names every folder with an `__init__.py` (the
    analysis folder as relif_ray.analysis), and no top-level `analysis` is installed."""
    listed = re.search(r"^packages = \[(.*?)\]", (REPO / "pyproject.toml").read_text(), re.M | re.S)
    names = set(re.findall(r'"([\w.]+)"', listed.group(1)))
    folders = {
        name
        for name, path in find_modules(REPO, PACKAGES, INSTALLED_AS).items()
        if path.name == "__init__.py"
    }
    assert names == folders and "analysis" not in names and ANALYSIS in names
    assert '"relif_ray.analysis" = "analysis"' in (REPO / "pyproject.toml").read_text()


def source_files(folders: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Path relative to the repository -> source, for every .py file of `folders`."""
    return {
        str(path.relative_to(REPO)): path.read_text()
        for folder in folders
        for path in sorted((REPO / folder).rglob("*.py"))
    }


def files_matching(pattern: str) -> set[str]:
    return {name for name, text in source_files().items() if re.search(pattern, text)}


def test_no_module_is_longer_than_the_limit():
    lengths = {name: len(text.splitlines()) for name, text in source_files(LENGTH_RULED).items()}
    assert max(lengths.values()) > MAX_MODULE_LINES / 2  # the check sees real modules
    assert "benchmarks/gpu_check.py" in lengths and "benchmarks/run.py" in lengths
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}


CONCERN_HOMES = {
    r"def (pair_distances|conformal_delta|drift_budget)\(": "relif_ray/audit_thresholds.py",
    r"def (eager_reason|eval_graphs_hold|make_capturable)\(": "relif_ray/cuda_graph.py",
    r"def (drift|shift|certificate)_table\(": "analysis/drift_tables.py",
    r"def (ablation|controller)_table\(": "analysis/relif_tables.py",
    r"def (main|violation|utility)_table\(": "analysis/tables.py",
    r"def (sources|training_settings|controller_settings)\(": "analysis/provenance.py",
}
"""Where the modules split by concern (to stay under `MAX_MODULE_LINES`) keep each concern: the
audit's calibration and drift diagnostics beside Algorithm 1, the CUDA-graph rules beside the
engine, the report's tables and sections by what they render."""


def test_the_split_modules_keep_their_concerns():
    for pattern, home in CONCERN_HOMES.items():
        assert files_matching(pattern) == {home}, pattern


def long_functions(files: dict[str, str]) -> dict[str, int]:
    """file:function -> its length in lines, for functions longer than MAX_FUNCTION_LINES."""
    found = {}
    for name, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found[f"{name}:{node.name}"] = length
    return found


def test_long_functions_are_listed_with_a_reason():
    found = long_functions(source_files(LENGTH_RULED))
    assert set(found) == set(LONG_FUNCTIONS), (
        f"functions over {MAX_FUNCTION_LINES} lines: {found}; split them or list them (with a "
        "reason) in LONG_FUNCTIONS, and drop entries that are short again"
    )
    assert all(len(reason) > 40 for reason in LONG_FUNCTIONS.values())


def test_the_function_length_reader_counts_lines():
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    text = f"def long():\n{body}\n\n\ndef short():\n    return 1\n"
    assert long_functions({"toy.py": text}) == {"toy.py:long": MAX_FUNCTION_LINES + 1}


def test_only_the_command_line_package_parses_arguments():
    parsers = set()
    for name, text in source_files().items():
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if "argparse" in names:
                parsers.add(name)
    assert parsers and all(name.startswith("relif_ray/cli/") for name in parsers), parsers


def test_only_the_storage_module_tells_local_from_object_storage():
    assert files_matching(r"[\"']://[\"']") == {STORAGE_MODULE}


def test_the_squash_formula_is_written_once():
    assert files_matching(r"q90 - q10") == {"relif_ray/squash.py"}


def test_the_audit_interfaces_have_one_home():
    """The squash family and the rank map (`relif_ray.squash.AUDIT_INTERFACES`) are
    defined in one module; the analysis applies them, the report names them from there."""
    home = {"relif_ray/squash.py"}
    assert files_matching(r"def (squash|empirical_cdf)\(") == home
    assert files_matching(r"side=\"right\"\) / ") == home
    assert files_matching(r"\(0\.01, 0\.99\)|\(0\.1, 0\.9\)") == home


def test_one_rule_says_whether_lambda_adapts():
    assert files_matching(r"\.controller_adapts\(\)") == {
        "relif_ray/sweep/labels.py",
        "relif_ray/relif/controller.py",
    }
    assert files_matching(r'\["controller"\] == "adaptive"') == set()


def test_the_experiment_files_are_named_in_the_layout_module():
    """`pareto.csv`, `selection.csv`, `squash_constants.json` and the lock file are named once,
    in `relif_ray.experiment.layout`, where `relif export` takes its list from."""
    for name in ("pareto.csv", "selection.csv", "squash_constants.json", ".relif-sweep.lock"):
        literal = re.escape(f'"{name}"')
        assert files_matching(literal) == {"relif_ray/experiment/layout.py"}, name


def test_the_controller_statistics_are_named_by_relif():
    """The trace's and the results' ReLiF statistics (`relif_ray.relif.STAT_KEYS`) are spelled
    out only in the ReLiF package (the controller's buffers have the same names)."""
    for key in ("r_ema", "loss_lip", "clipped"):
        found = {name for name in files_matching(f'"{key}"') if name.startswith("relif_ray/")}
        assert found and all(name.startswith("relif_ray/relif/") for name in found), (key, found)


def test_directions_and_the_delta_range_have_one_home():
    """Which way a summary number is better (`relif_ray.directions`) and the delta range check
    (`relif_ray.audit.check_delta`; the other range in [0, 1] is the quantile level of
    `relif_ray.audit_thresholds.delta_from_quantile`, not a delta)."""
    modes = {name for name in files_matching(r"\"(max|min)\"") if name.startswith("relif_ray/")}
    torchjd_option = "relif_ray/methods/torchjd_weightings.py"  # AlignedMTL's scale_mode "min"
    assert modes == {"relif_ray/directions.py", torchjd_option}
    in_unit_range = {"relif_ray/audit.py", "relif_ray/audit_thresholds.py"}
    assert files_matching(r"must be in \[0, 1\]") == in_unit_range
    assert files_matching(r"def check_delta\(") == {"relif_ray/audit.py"}


def test_the_seed_option_controller_checks_and_option_ranges_have_one_home():
    """The synthetic writers' `--seed` (`relif_ray.problems.SEED_OPTION`), `--controller-checks`
    (`relif_ray.cli.sweep_flags.add_controller_checks_flag`) and the range checks of the
    methods' number options (`relif_ray.methods.registry.option_in_range`)."""
    assert files_matching(r"WriterOption\(\"seed\"") == {"relif_ray/problems/__init__.py"}
    assert files_matching(r"\"--controller-checks\"") == {"relif_ray/cli/sweep_flags.py"}
    finite = files_matching(r"isfinite\(")
    ranges = {name for name in finite if name.startswith("relif_ray/methods/")}
    torchjd_vector = "relif_ray/methods/torchjd_weightings.py"  # a list option, pref_vector
    assert ranges == {"relif_ray/methods/registry.py", torchjd_vector}


def test_the_first_and_last_line_of_an_error_have_one_home():
    assert files_matching(r"\)\.strip\(\)\.splitlines\(\)") == {"relif_ray/errors.py"}
    assert files_matching(r"\blines\[-1\]") == {"relif_ray/errors.py"}


AUDIT_SETTINGS_FIELDS = ("pool_size", "pair_seed", "eval_seed")
"""`relif_ray.audit.AuditSettings`' fields whose names mean nothing else (`pairs` also names
ReLiF's pairs of examples)."""


def respelled_audit_settings(files: dict[str, str]) -> list[str]:
    """file:function:parameter for every parameter that re-spells the audit settings instead of
    taking an `AuditSettings`: one defaulting to an `AuditSettings.<field>` attribute, or one
    named after a field (`AUDIT_SETTINGS_FIELDS`)."""
    found = []
    for name, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            defaults = dict(zip(positional[::-1], args.defaults[::-1], strict=False))
            defaults.update(zip(args.kwonlyargs, args.kw_defaults, strict=True))
            for param in [*positional, *args.kwonlyargs]:
                default = defaults.get(param)
                from_class = (
                    isinstance(default, ast.Attribute)
                    and isinstance(default.value, ast.Name)
                    and default.value.id == "AuditSettings"
                )
                if from_class or param.arg in AUDIT_SETTINGS_FIELDS:
                    found.append(f"{name}:{node.name}:{param.arg}")
    return found


def test_the_audit_settings_are_passed_whole():
    """N_eval, S and the seeds travel as one `AuditSettings` (the one home of their defaults):
    no function of the library, the analysis or the benchmarks takes them one by one, and the
    audit functions take `settings`."""
    assert respelled_audit_settings(source_files(LENGTH_RULED)) == []
    audit = {"evaluation_pools", "sample_pairs", "audit_gaps", "fixed_delta_audit"}
    thresholds = {"pair_distances", "induced_thresholds"}
    sampling = {"relif_ray/audit.py": audit, "relif_ray/audit_thresholds.py": thresholds}
    for path, names in sampling.items():
        module = ast.parse((REPO / path).read_text())
        functions = [node for node in module.body if isinstance(node, ast.FunctionDef)]
        assert names <= {node.name for node in functions}, path
        for node in functions:
            if node.name in names:
                keywords = {arg.arg: ast.unparse(arg.annotation) for arg in node.args.kwonlyargs}
                assert keywords == {"settings": "AuditSettings"}, node.name


def test_the_audit_settings_reader_sees_respelled_parameters():
    text = (
        "def by_default(scores, pairs: int = AuditSettings.pairs):\n    pass\n\n\n"
        "def by_name(scores, *, eval_seed=0):\n    pass\n\n\n"
        "def whole(scores, *, settings: AuditSettings = AuditSettings()):\n    pass\n"
    )
    assert respelled_audit_settings({"toy.py": text}) == [
        "toy.py:by_default:pairs",
        "toy.py:by_name:eval_seed",
    ]


def test_the_benchmarks_package_imports_its_modules_by_package_without_a_cycle():
    """`benchmarks` is a package run from the repository root (`python -m benchmarks.run`): its
    modules import each other as `benchmarks.<module>`, never by a bare sibling name, and reach
    the library through public calls, never `relif_ray.cli`. Every import counts, also one
    inside a function: a deferred import cycle is still one."""
    modules = {path.stem: path for path in (REPO / "benchmarks").glob("*.py")}
    graph, bare, cli = {}, [], []
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for module in names:
                top, _, rest = module.partition(".")
                bare += [f"{name}: {module}"] if top in modules else []
                cli += [f"{name}: {module}"] if module.startswith("relif_ray.cli") else []
                imported |= {rest.partition(".")[0]} if top == "benchmarks" else set()
        graph[name] = imported & set(modules)
    assert bare == [] and cli == []
    assert graph["run"] == {"harness"} and {"harness", "workers"} <= graph["methods"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


MEASUREMENT_RECORD = ("Row", "machine", "Record")
"""The benchmarks' one record of a measurement (`benchmarks/harness.py`): the row, the machine
(with the checkout's commit) and the run's JSON record."""


def measurement_definitions(files: dict[str, str]) -> list[str]:
    """file:name of every class or function named in `MEASUREMENT_RECORD` and of every
    module-level assignment to a name ending in TARGETS."""
    found = []
    for name, text in files.items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            defined = isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            if defined and node.name in MEASUREMENT_RECORD:
                found.append(f"{name}:{node.name}")
        for node in tree.body:
            assigned = list(node.targets) if isinstance(node, ast.Assign) else []
            assigned += [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in assigned:
                if isinstance(target, ast.Name) and target.id.endswith("TARGETS"):
                    found.append(f"{name}:{target.id}")
    return sorted(found)


def test_the_command_line_holds_parsers_and_the_benchmarks_one_record(graph):
    """`relif_ray/cli/` holds parsers, not measurements: none of its modules defines a row, a
    machine record or targets, or imports the benchmarks. In `benchmarks/` only the harness
    defines the row, the machine record and the run's record, and only `targets.py` holds
    targets: the fidelity experiment uses them (no row, machine or targets of its own)."""
    cli = {name: text for name, text in source_files(("relif_ray",)).items()
           if name.startswith("relif_ray/cli/")}  # fmt: skip
    assert "relif_ray/cli/sweep.py" in cli and measurement_definitions(cli) == []
    cli_imports = {target for name, targets in graph.items() if _in_cli(name) for target in targets}
    assert "relif_ray.tuning" in cli_imports and "benchmarks" not in map(_top, cli_imports)
    assert measurement_definitions(source_files(("benchmarks",))) == [
        "benchmarks/harness.py:Record",
        "benchmarks/harness.py:Row",
        "benchmarks/harness.py:machine",
        "benchmarks/targets.py:FIDELITY_TARGETS",
        "benchmarks/targets.py:TARGETS",
    ]
    fidelity = ast.parse((REPO / "benchmarks" / "fidelity.py").read_text())
    imported = {(node.module, alias.name) for node in ast.walk(fidelity)
                if isinstance(node, ast.ImportFrom) for alias in node.names}  # fmt: skip
    assert {("benchmarks.harness", "Row"), ("benchmarks.harness", "Record")} <= imported
    assert ("benchmarks.targets", "FIDELITY_TARGETS") in imported
    toy = "class Row:\n    pass\ndef machine():\n    pass\nTARGETS: dict = {}\nOTHER = 1\n"
    assert measurement_definitions({"t.py": toy}) == ["t.py:Row", "t.py:TARGETS", "t.py:machine"]


NOTEBOOK = REPO / "analysis" / "notebooks" / "explore_experiment.ipynb"


def exported_names(path: Path) -> set[str] | None:
    """The names of the module's `__all__` (a literal list or tuple); None without one."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return None


def private_uses(source: str, modules: dict[str, Path]) -> list[str]:
    """Each use in `source` of a project name outside its module's `__all__`: a name imported
    `from` a project module, or an attribute of a project module imported as a whole (`from
    relif_ray import analysis; analysis.X`), whose module has no `__all__` or does not list it.
    A project module imported as a whole must have an `__all__` of its own."""
    tree = ast.parse(source)
    exported = {name: exported_names(path) for name, path in modules.items()}
    bound: dict[str, str] = {}  # local name -> the project module it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules and exported[submodule] is not None:
                    bound[alias.asname or alias.name] = submodule
                elif alias.name not in (exported[node.module] or set()):
                    found.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    if exported[alias.name] is None:
                        found.append(alias.name)
                    bound[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = bound.get(node.value.id)
            if module is not None and node.attr not in exported[module]:
                found.append(f"{module}.{node.attr}")
    return found


def notebook_code(path: Path) -> str:
    """The code cells of a notebook as one Python source, IPython's `%` magics left out."""
    cells = json.loads(path.read_text())["cells"]
    lines = [
        line
        for cell in cells
        if cell["cell_type"] == "code"
        for line in "".join(cell["source"]).splitlines()
        if not line.lstrip().startswith("%")
    ]
    return "\n".join(lines)


def test_the_notebook_uses_only_public_names():
    """Every project name the analysis notebook imports or reads off an imported module is in
    that module's `__all__`: the notebook shows users the public API, which the API reference
    (mkdocs.yml) documents."""
    modules = find_modules(REPO, PACKAGES, INSTALLED_AS)
    source = notebook_code(NOTEBOOK)
    assert "from relif_ray import analysis" in source and "analysis.audit(" in source
    assert private_uses(source, modules) == []


def test_the_public_name_check_sees_private_imports_and_attributes():
    modules = find_modules(REPO, PACKAGES, INSTALLED_AS)
    source = (
        "from relif_ray import analysis\n"
        "from relif_ray.analysis.breakdown import by_pair\n"  # breakdown has no __all__
        "from relif_ray.analysis.figures import slug, pareto_figure\n"
        "import relif_ray.audit\n"
        "analysis.load, analysis.Experiment, analysis.render\n"
    )
    assert private_uses(source, modules) == [
        "relif_ray.analysis.breakdown.by_pair",
        "relif_ray.analysis.figures.slug",
        "relif_ray.analysis.render",
    ]


TUNE_ONLY_NAMES = (
    "experiment_dir",
    "reference_error",
    "outputs_at_iterations",
    "fault_injection_step",
    "timing_dir",
)
"""The Tune-only keys of a trial's config (`relif_ray.sweep.trial_config.TuneKeys`) that name
nothing else in the library (label, seed, delta and study are also result keys and columns)."""
TUNE_CONFIG_LAYERS = ("relif_ray/sweep/", "relif_ray/tuning/")
"""Where Tune configs are held: the plan and the Ray layer."""


def keyed_strings(text: str) -> list[tuple[int, str, str]]:
    """(line, key, what it keys) of every string constant used to index or `.get` an
    expression, and (line, string, "") of every other string that is not a docstring."""
    tree = ast.parse(text)
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            found.append((node.lineno, node.slice.value, ast.unparse(node.value)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, node.args[0].value, ast.unparse(node.func.value)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [] if id(node) in docstrings else [(node.lineno, node.value, "")]
    return found


def test_only_the_trial_config_module_spells_the_tune_only_keys():
    """A trial's Tune-only keys are written and read through `TuneKeys` alone: no other module
    of the library or analysis spells one that names nothing else, and in the plan and the Ray
    layer no config is indexed by any of them (label, seed, delta, study included)."""
    from dataclasses import fields

    from relif_ray.sweep.trial_config import TuneKeys

    every = {field.name for field in fields(TuneKeys)}
    assert set(TUNE_ONLY_NAMES) < every
    owner = "relif_ray/sweep/trial_config.py"
    files = source_files()
    assert {key for _, key, _ in keyed_strings(files[owner])} >= {"label", "seed"}
    spelled, indexed = [], []
    for name, text in files.items():
        if name == owner:
            continue
        for line, key, of in keyed_strings(text):
            if key in TUNE_ONLY_NAMES:
                spelled.append(f"{name}:{line} {key}")
            in_layer = name.startswith(TUNE_CONFIG_LAYERS)
            if in_layer and key in every and of.endswith("config"):
                indexed.append(f"{name}:{line} {of}[{key!r}]")
    assert spelled == [] and indexed == []
    read = keyed_strings('"""doc"""\nconfig["seed"]\ntrial.config.get("delta")\n')
    assert {(line, key, of) for line, key, of in read if of} == {
        (2, "seed", "config"),
        (3, "delta", "trial.config"),
    }
    assert "doc" not in {key for _, key, _ in read}


def test_every_launch_is_checked_first_and_takes_the_request_whole():
    """`relif_ray.tuning.launch.run_sweep` takes the `SweepRequest` whole (no keyword per
    field), and its one caller in the library, the driver's `run`, runs `check(request)`
    before anything else."""
    launch = ast.parse((REPO / "relif_ray/tuning/launch.py").read_text())
    run_sweep = next(
        node
        for node in launch.body
        if isinstance(node, ast.FunctionDef) and node.name == "run_sweep"
    )
    first = run_sweep.args.args[0]
    assert (first.arg, ast.unparse(first.annotation)) == ("request", "SweepRequest")
    assert [arg.arg for arg in run_sweep.args.args] == ["request"]
    callers = {
        name
        for name, text in source_files().items()
        if re.search(r"\brun_sweep\(", text) and "def run_sweep(" not in text
    }
    assert callers == {"relif_ray/tuning/driver.py"}
    driver = ast.parse((REPO / "relif_ray/tuning/driver.py").read_text())
    run = next(
        node for node in driver.body if isinstance(node, ast.FunctionDef) and node.name == "run"
    )
    body = [node for node in run.body if not isinstance(node, ast.Expr) or node is not run.body[0]]
    assert ast.unparse(body[0]) == "check(request)"
    assert "launch.run_sweep(request)" in ast.unparse(run)


RESULT_RECORD_OWNER = "relif_ray/experiment/record.py"
GENERIC_RECORD_READERS = ("info", "result", "result.metrics", "last_result")
"""Names that hold a trial's record or a Tune result where the library reads one (the
benchmarks' worker processes report results of their own under such names)."""


def test_only_the_record_module_spells_the_result_and_trial_record_keys():
    """What a trial reports each epoch and its trial.json are keyed in
    `relif_ray.experiment.record` alone: no other module of the library, analysis or the
    benchmarks spells a key of its own (`val_bias`, `train_step`, `time_<part>_s`,
    `started_at`, ...: names that mean nothing else) or the f-string of a part's seconds, and
    no module of the library or analysis indexes a record or result by a key it shares with
    other dicts (`label`, `seed`, `steps`, `status`, ...)."""
    from relif_ray.experiment import record

    own = {
        record.EVALUATED,
        record.TRAIN_STEP,
        record.VAL_BIAS,
        record.VAL_VR,
        record.VAL_WORST,
        record.VAL_MACRO,
        record.CUDA_PEAK_MB,
        record.CHECKPOINT_SECONDS,
        record.SEED_FOLDERS_KEY,
        f"{record.SQUASH_CONSTANTS}/",
        "restored_from_checkpoint",
        "started_at",
        "finished_at",
        *(record.part_seconds(part) for part in record.TIMED_PARTS),
    }
    shared = {*record.TRIAL_KEYS, record.EPOCH, record.DONE, record.DEVICE, "status"}
    files = source_files((*PACKAGES, "benchmarks"))
    composed = {record.VAL_WORST, record.VAL_MACRO, f"{record.SQUASH_CONSTANTS}/"}  # f-strings
    parts = {record.part_seconds(part) for part in record.TIMED_PARTS}
    owned = {key for _, key, _ in keyed_strings(files[RESULT_RECORD_OWNER])}
    assert owned >= own - composed - parts
    assert "time_" in {key for _, key, _ in keyed_strings('f"time_{part}_s"\n')}
    spelled, indexed = [], []
    for name, text in files.items():
        if name == RESULT_RECORD_OWNER:
            continue
        for line, key, of in keyed_strings(text):
            if key in own or key == "time_":  # "time_" is f"time_{part}_s"
                spelled.append(f"{name}:{line} {key}")
            if key in shared and of in GENERIC_RECORD_READERS and name.startswith(PACKAGES):
                indexed.append(f"{name}:{line} {of}[{key!r}]")
    assert spelled == [] and indexed == []
