"""Any table as a multi-task benchmark: `data.dataset = "tabular"`, `data.root` the table
(a .csv or .parquet file, or a folder with `table.csv`), `data.spec` what its columns mean.

The spec (`relif_ray.data.tabular.TableSpec`: tasks NAME=COLUMN:KIND, groups, features,
split fractions, data seed) defines the tasks, so this benchmark is `Benchmark.specified`:
every process that loads, checks or analyses its trials puts their spec in effect
(`relif_ray.problems.use_spec`), and `benchmark("tabular")` then describes that spec's tasks.
Reader: `relif_ray.data.tabular`; tasks: `relif_ray.tasks.tabular`; model: an MLP trunk with
one linear head per task (`relif_ray.models.tabular`). docs/tabular.md has the whole story.

delta_ref is None: as for NYUv2, `relif report` calibrates it on ERM's trials (the paper's
rule for a data set without a published threshold); a table has none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from relif_ray.data.synthetic_tabular import DEMO_SPEC, TABLE, write_synthetic_table
from relif_ray.data.table_spec import TableSpec
from relif_ray.data.tabular import TableData, load_table, read_groups
from relif_ray.models.tabular import build_tabular_model
from relif_ray.problems import (
    SEED_OPTION,
    AttributeSource,
    Benchmark,
    DatasetDefaults,
    DataWriter,
    Problem,
    ReportMetric,
    TensorSplit,
    WriterOption,
)
from relif_ray.tasks.base import Task
from relif_ray.tasks.tabular import BinaryTask, MulticlassTask, RegressionTask

NAME = "tabular"
METRIC_HEADERS = {
    "auroc": "AUROC",
    "auprc": "AUPRC",
    "auroc_macro": "macro AUROC",
    "accuracy": "accuracy",
    "mae": "MAE",
    "rmse": "RMSE",
}
"""The main table's header of each task metric (`relif_ray.tasks.tabular`): every task's
native metrics are the report's columns, `<task>_<metric>` in per_trial.csv."""


def table_path(root: str | Path) -> Path:
    """The table of `data.root`: the file itself, or a folder's `table.csv`."""
    root = Path(root)
    return root / TABLE if root.is_dir() else root


class TableSplit(TensorSplit):
    """A split of a table: its examples' names are their 0-based rows in the file."""

    def __init__(self, tensors: dict[str, torch.Tensor], names: list[str]) -> None:
        super().__init__(tensors)
        self.names = names

    def example_names(self) -> list[str]:
        return self.names


def spec_tasks(spec: TableSpec, data: TableData | None = None) -> list[Task]:
    """The tasks of `spec`; with `data`, a regression task's training mean and std and a
    multiclass task's number of classes (without: the declarations only)."""
    tasks: list[Task] = []
    for task in spec.tasks:
        if task.kind == "binary":
            tasks.append(BinaryTask(task.name))
        elif task.kind == "multiclass":
            classes = len(data.classes[task.name]) if data else 0
            tasks.append(MulticlassTask(task.name, classes))
        else:
            mean, std = data.scales[task.name] if data else (0.0, 1.0)
            tasks.append(RegressionTask(task.name, mean, std))
    return tasks


def load_tabular(root: str, spec: TableSpec) -> Problem:
    """The problem of the table at `root` as `spec` says: splits, tasks and the MLP."""
    data = load_table(table_path(root), spec)
    splits = {}
    for split, rows in data.rows.items():
        tensors = {"input": torch.from_numpy(data.features[split])}
        for name, target in data.targets[split].items():
            tensors[name] = torch.from_numpy(target)
        tensors["example_id"] = torch.arange(len(rows))
        splits[split] = TableSplit(tensors, [str(int(row)) for row in rows])
    tasks = spec_tasks(data.spec, data)
    heads = {task.name: getattr(task, "num_classes", 1) for task in tasks}
    width = data.features["train"].shape[1]
    model = functools.partial(build_tabular_model, input_size=width, heads=heads)
    return Problem(NAME, tasks, splits, model)


def check_tabular(root: str, spec: TableSpec) -> None:
    """The sweep driver's check: the table read, checked, split and encoded as a trial will."""
    load_table(table_path(root), spec)


DEFAULTS = DatasetDefaults(
    dataset=NAME,
    seeds=10,
    backbone="mlp",
    batch_size=128,
    lr=1e-3,
    epochs=100,
    r_star=0.16,
    eta=1e-3,
    delta=0.2,
    demo_data={"rows": 600},
    demo_train={"epochs": 5, "batch_size": 64, "lr": 3e-3, "seeds": 2, "methods": "erm,relif"},
    config={
        "train.optimizer": "adamw",
        "train.weight_decay": 1e-5,
        "train.eval_batch_size": 4096,
        "model.hidden_size": 64,
        "model.num_layers": 2,
        "model.dropout": 0.1,
    },
)
"""Our choices (the paper has no tabular data set): 10 seeds; an MLP of two 64-wide layers,
dropout 0.1; AdamW lr 1e-3, weight decay 1e-5, batch 128, 100 epochs; the ReLiF controller at
the clinical r* 0.16, its eta and warmup scaled to the trials' step budget from the paper's
eta 1e-3 (`relif_ray.sweep.compose.controller_budget`); live delta 0.2 (NYUv2's), delta_ref
calibrated on ERM by `relif report` (module docstring)."""

WRITER = DataWriter(
    write=write_synthetic_table,
    help="a synthetic table (binary, multiclass and regression outcomes, groups sex and age)",
    options=(
        WriterOption("rows", int, 1000, "number of rows (default 1000)"),
        SEED_OPTION,
    ),
)


def specified(values: dict[str, Any]) -> Benchmark:
    """The tabular benchmark of one spec (`data.spec`, checked: a one-line error naming it)."""
    spec = TableSpec.from_dict(values, "config field data.spec")
    attributes = None
    if spec.groups:
        attributes = AttributeSource(
            read=lambda root, stays: read_groups(table_path(root), spec),
            in_data_root=True,
            folder="the data table",
        )
    return Benchmark(
        report_metrics=tuple(
            ReportMetric(f"{task.name}_{metric}", f"{task.name} {METRIC_HEADERS[metric]}")
            for task in spec_tasks(spec)
            for metric in task.new_metrics().higher_is_better
        ),
        load=functools.partial(load_tabular, spec=spec),
        tasks=functools.partial(spec_tasks, spec),
        defaults=DEFAULTS,
        synthetic=WRITER,
        check=functools.partial(check_tabular, spec=spec),
        attributes=attributes,
        train_examples=_recorded_train_rows(values),
    )


def _recorded_train_rows(values: dict[str, Any]) -> Callable[[str], int | None] | None:
    """The train split's size that the spec's recorded summary holds (the sweep reads and
    splits the table before planning), as `Benchmark.train_examples`; None without one."""
    rows = values.get("summary", {}).get("split_sizes", {}).get("train")
    return None if rows is None else lambda root: int(rows)


BENCHMARK = replace(specified(DEMO_SPEC), specified=specified)
"""Without a spec in effect (`relif make-data tabular`, a sweep given none): the synthetic
table's (`relif_ray.data.synthetic_tabular.DEMO_SPEC`)."""
