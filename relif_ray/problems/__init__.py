"""Benchmarks: the problem interface, and the registry that finds one module per benchmark.

A benchmark is one module of this package that defines a module-level `BENCHMARK`
(a `Benchmark`): how to load its `Problem` (reader + tasks + model), its sweep defaults
(budget, controller setting, live delta, delta_ref), the metrics its report shows and its
synthetic writer for `relif make-data`. Nothing else registers it: sweeps, trials, `relif
make-data` and `relif report` all look benchmarks up in `benchmarks()`, which imports every
module `pkgutil.iter_modules` finds on this package's `__path__`.

Plug-ins: the directories in the environment variable `RELIF_PROBLEMS_PATH`
(`os.pathsep`-separated) are appended to that `__path__`, so a file `toy.py` with a `BENCHMARK`
in one of them is found exactly like the built-in `nyuv2.py`. The sweep passes the variable on
to its Ray workers (`relif_ray.plugins.worker_env`), so trial processes find the same plug-ins.

Loaded problems are cached per process (keyed by data set and root), so a Ray worker that runs
many trials reads its data once, not once per trial.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relif_ray.config import HARD_SHARING, DataConfig, ModelConfig
from relif_ray.data.splits import Batch, Split, TensorSplit
from relif_ray.directions import higher_is_better
from relif_ray.errors import UserError
from relif_ray.models.base import MultiTaskModel
from relif_ray.plugins import PROBLEMS_PATH, import_plugins, plugin_name
from relif_ray.tasks.base import Task

if TYPE_CHECKING:
    import pandas as pd

PATH_VARIABLE = PROBLEMS_PATH
"""Environment variable: extra directories searched for benchmark modules."""

BUILT_IN_DIRECTORY = str(Path(__file__).resolve().parent)
"""The directory of the built-in benchmark modules (this package)."""

BENCHMARK_ATTRIBUTE = "BENCHMARK"
"""The module-level name a benchmark module defines."""


@dataclass
class Problem:
    """Tasks + splits + a model factory for one data set."""

    name: str
    tasks: list[Task]
    splits: dict[str, Split]
    model_factory: Callable[[ModelConfig], MultiTaskModel]

    @property
    def task_names(self) -> list[str]:
        return [task.name for task in self.tasks]

    def build_model(self, config: ModelConfig) -> MultiTaskModel:
        return checked_model(self.model_factory, config)


def checked_model(
    factory: Callable[[ModelConfig], MultiTaskModel], config: ModelConfig
) -> MultiTaskModel:
    """The model `factory` builds for `config`; a one-line error where it is not of the
    architecture `config` asks for (a plug-in benchmark's model knows only its own)."""
    model = factory(config)
    built = getattr(model, "architecture", HARD_SHARING)
    if built != config.architecture:
        raise UserError(
            f"config field model.architecture: this benchmark's model ({type(model).__name__}) "
            f"is {built}, not {config.architecture}"
        )
    return model


@dataclass(frozen=True)
class DatasetDefaults:
    """What a sweep on this data set starts from.

    seeds, backbone, batch_size, lr, epochs: the budget (flags override them).
    r_star, eta: the paper's ReLiF controller setting for this data set (--r-star/--eta).
    paper_eta: whether the paper fixes eta for this data set at its default budget (`epochs`
        at `batch_size`; NYUv2, eICU): there eta and the paper's warmup stay; elsewhere, and at
        any other budget, the sweep scales them to the trials' step budget
        (`relif_ray.sweep.compose.controller_budget`).
    delta: threshold of the live validation Bias shown while training and optimised by Optuna
        (the official fixed-delta audit is computed at analysis time).
    delta_ref: the paper's held-fixed audit threshold where it is one number (MIMIC-III 0.275,
        eICU 0.06); None: `relif report` calibrates it on ERM's reference run (NYUv2).
    demo_data: keyword arguments of the data set's synthetic writer (`Benchmark.synthetic`).
    demo_train: the `--demo` budget (steps or epochs, batch_size, lr, backbone, seeds,
        methods); the controller's eta and warmup follow it as every sweep's budget
        (`relif_ray.sweep.compose.controller_budget`).
    config: dotted ExperimentConfig fields set for every trial before the flags apply (the
        paper's settings, e.g. {"train.optimizer": "adamw"}); demo_config: the same in --demo.
    gpu_config: the fields set for trials that get a GPU, after `config` and before --demo
        and the user's layers (so any of them wins): the data set's GPU fast path, measured
        in docs/benchmarks.md; `--no-gpu-fast-path` leaves them out.
    """

    dataset: str
    seeds: int
    backbone: str
    batch_size: int
    lr: float
    epochs: int
    r_star: float
    eta: float
    delta: float
    demo_data: dict[str, int]
    demo_train: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    demo_config: dict[str, Any] = field(default_factory=dict)
    gpu_config: dict[str, Any] = field(default_factory=dict)
    delta_ref: float | None = None
    paper_eta: bool = False


@dataclass(frozen=True)
class WriterOption:
    """One `--name VALUE` option of `relif make-data`, passed to the writer as keyword `name`."""

    name: str
    type: Callable[[str], object]
    default: object
    help: str


SEED_OPTION = WriterOption("seed", int, 0, "random seed; same seed, same bytes (default 0)")
"""`relif make-data`'s `--seed` of every synthetic writer: each writes the same bytes for the
same seed."""


@dataclass(frozen=True)
class DataWriter:
    """A synthetic data set in the real on-disk layout: `write(out, *, overwrite, **options)`
    and the options it takes."""

    write: Callable[..., Path]
    help: str
    options: tuple[WriterOption, ...]


@dataclass(frozen=True)
class AttributeSource:
    """Where the sensitive attributes of a benchmark's stays are, for the group audit
    (`relif_ray.analysis.groups`).

    read: (folder, the stays' names) -> one row per stay found
        (`relif_ray.data.attributes.ATTRIBUTE_COLUMNS`); a malformed file is a `UserError`.
    in_data_root: True where the data folder the trials read holds them (eICU's
        all_data.csv): the audit reads them there unless given another folder; False where a
        folder must be given (MIMIC-III's root/, beside the multitask folder the trials read).
    folder: what that folder is, in words, for the line that says why a report has no group
        audit.
    """

    read: Callable[[str, Sequence[str]], pd.DataFrame]
    in_data_root: bool
    folder: str


@dataclass(frozen=True)
class ReportMetric:
    """A native metric column of the report's main table: `<task>_<metric>` and its headers
    (Markdown, LaTeX). Its direction is the one the task's metric declares."""

    column: str
    header: str
    latex: str = ""


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: everything the library, the sweeps and the analysis know about it.

    load: root -> Problem (reader + tasks + model), read once per process.
    tasks: the tasks, without data (the analysis reads their score and metric declarations).
    defaults: the sweep defaults, `defaults.dataset` being the benchmark's name.
    synthetic: the writer of `relif make-data <name>` and of `--demo` sweeps.
    report_metrics: the native metrics of the main table; empty: each task's normalized score.
    check: root -> None, the sweep driver's check of the data set before any trial starts:
        every file present and readable, shapes and dtypes from file headers, small files
        parsed whole; a one-line `UserError` naming the file otherwise. It uses the reader's
        own rules, so it never accepts what `load` rejects for a reason it could see. None: the
        trials find data problems when they load.
    model: the model factory of `load`'s problems, for the driver to build each trial's model
        on PyTorch's meta device (no memory) and so check its config before any trial starts;
        None: the trials find model config problems.
    delta_m_metrics: the native metrics (`<task>_<metric>`) Delta-M% averages, where the
        literature's tables average a set of their own (NYUv2: LibMTL's nine, without our depth
        RMSE); empty: every native metric (`relif_ray.analysis.mtl_metrics`).
    attributes: where the stays' sensitive attributes are (`AttributeSource`); None: the
        benchmark has no patient groups to audit.
    train_examples: root -> the number of training examples there (None: no data there
        yet), for the controller's step budget (`relif_ray.sweep.compose.controller_budget`)
        without loading the data; None: the driver loads the problem once to count them.
    specified: for a benchmark that a data spec defines (`data.spec`: the tabular benchmark,
        whose tasks are a table's columns), the Benchmark of one spec; `benchmark(name)` gives
        it for the spec in effect in this process (`use_spec`). None: the files define it.
    """

    load: Callable[[str], Problem]
    tasks: Callable[[], list[Task]]
    defaults: DatasetDefaults
    synthetic: DataWriter
    report_metrics: tuple[ReportMetric, ...] = ()
    check: Callable[[str], None] | None = None
    model: Callable[[ModelConfig], MultiTaskModel] | None = None
    delta_m_metrics: tuple[str, ...] = ()
    attributes: AttributeSource | None = None
    specified: Callable[[dict[str, Any]], Benchmark] | None = None
    train_examples: Callable[[str], int | None] | None = None

    @property
    def name(self) -> str:
        return self.defaults.dataset

    @property
    def delta_ref(self) -> float | None:
        return self.defaults.delta_ref

    @cached_property
    def squashed_tasks(self) -> frozenset[str]:
        """Tasks whose stored audit score is not a probability (squashed by the audit)."""
        return frozenset(task.name for task in self.tasks() if not task.score_is_probability)

    @cached_property
    def metric_directions(self) -> dict[str, bool]:
        """`<task>_<metric>` -> higher is better, as each task's metrics declare it; the
        normalized scores (`<task>_score`), worst and macro as `relif_ray.directions` says."""
        directions = {name: higher_is_better(name) for name in ("worst", "macro")}
        for task in self.tasks():
            directions[f"{task.name}_score"] = higher_is_better("score")
            for metric, higher in task.new_metrics().higher_is_better.items():
                directions[f"{task.name}_{metric}"] = higher
        return directions


def benchmarks() -> dict[str, Benchmark]:
    """Every benchmark module on this package's path and `RELIF_PROBLEMS_PATH`, by name."""
    return _discover(os.environ.get(PATH_VARIABLE, ""))


def benchmark(name: str, where: str = "data.dataset") -> Benchmark:
    """The benchmark called `name`; a one-line error naming `where` and the known names. For
    a benchmark that a data spec defines (`Benchmark.specified`), the one of the spec in
    effect (`use_spec`), or without one the benchmark itself."""
    found = benchmarks()
    if name not in found:
        raise UserError(
            f"{where}: must be one of {', '.join(found)}, got '{name}' "
            f"(benchmark modules are found in relif_ray/problems/ and on ${PATH_VARIABLE})"
        )
    described = found[name]
    spec = _SPECS.get(name)
    if described.specified is None or spec is None:
        return described
    return _specified(name, spec)


_SPECS: dict[str, str] = {}
"""Benchmark name -> the data spec in effect in this process (JSON text)."""


def use_spec(config: DataConfig | dict[str, Any]) -> None:
    """Put the data spec of `config` (a `DataConfig`, or its dict as a trial records it) in
    effect for its benchmark in this process: what `benchmark(name)` then describes (tasks,
    data check, group attributes). Every process that loads, checks or analyses trials of a
    benchmark that a spec defines calls it with their config; other benchmarks ignore it."""
    values = config if isinstance(config, dict) else dataclasses.asdict(config)
    if values.get("spec"):
        _SPECS[str(values["dataset"])] = json.dumps(values["spec"], sort_keys=True)
    else:  # none: the benchmark's own description
        _SPECS.pop(str(values.get("dataset")), None)


@functools.lru_cache(maxsize=8)
def _specified(name: str, spec: str) -> Benchmark:
    specified = benchmarks()[name].specified
    assert specified is not None
    return specified(json.loads(spec))


@functools.cache
def _discover(path_value: str) -> dict[str, Benchmark]:
    """The built-in benchmark modules, then the plug-ins of `path_value` (the variable's
    value: a changed value imports again; `relif_ray.plugins.import_plugins`)."""
    package = sys.modules[__name__]
    built_in = [
        importlib.import_module(f"{__name__}.{module_info.name}")
        for module_info in pkgutil.iter_modules([BUILT_IN_DIRECTORY])
    ]
    found: dict[str, Benchmark] = {}
    for module in [*built_in, *import_plugins(package, PATH_VARIABLE)]:
        described = getattr(module, BENCHMARK_ATTRIBUTE, None)
        if described is None:
            continue
        if not isinstance(described, Benchmark):
            raise UserError(f"{module.__file__}: {BENCHMARK_ATTRIBUTE} must be a Benchmark")
        plugin_name(described.name, "benchmark", str(module.__file__))
        if described.name in found:
            raise UserError(f"{module.__file__}: a benchmark '{described.name}' already exists")
        found[described.name] = described
    return dict(sorted(found.items()))


def load_problem(config: DataConfig) -> Problem:
    """Load (once per process) the problem named by `config.dataset` from `config.root`."""
    benchmark(config.dataset, "config field data.dataset")
    if not config.root:
        raise UserError("config field data.root: no data directory given")
    use_spec(config)
    return _cached_problem(config.dataset, config.root, json.dumps(config.spec, sort_keys=True))


def train_examples(config: DataConfig) -> int | None:
    """The number of training examples of `config`'s data (`Benchmark.train_examples`, else
    the problem loaded once in this process); None where the data does not exist yet (the
    demo's, written once the sweep's checks pass) or cannot be read: the sweep's data check
    then says what is wrong with it, in its own words and order."""
    use_spec(config)
    counted = benchmark(config.dataset, "config field data.dataset").train_examples
    if counted is not None:
        return counted(config.root)
    if not config.root or not Path(config.root).exists():
        return None
    try:
        return len(load_problem(config).splits["train"])
    except UserError:
        return None


@functools.lru_cache(maxsize=4)
def _cached_problem(dataset: str, root: str, spec: str) -> Problem:
    """The problem of (data set, root, spec): a worker that runs many trials reads it once."""
    return benchmark(dataset).load(root)


__all__ = [
    "SEED_OPTION",
    "AttributeSource",
    "Batch",
    "Benchmark",
    "DataWriter",
    "DatasetDefaults",
    "Problem",
    "ReportMetric",
    "Split",
    "TensorSplit",
    "WriterOption",
    "benchmark",
    "benchmarks",
    "load_problem",
    "use_spec",
]
