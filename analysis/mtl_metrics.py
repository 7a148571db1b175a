"""Summary metrics of the multi-task and multi-objective literature, as small functions over
pandas/numpy: Delta-M% against same-seed ERM (LibMTL's `count_improvement`) or a fixed metric
vector, under the literature's conventions (`DeltaMOptions`), that of every trial of an
experiment (the report's utility table and paired comparisons), and the hypervolume of each method's
(Bias, Worst) points (the area of the fixed-delta Pareto front; the function itself,
`hypervolume`, lives next to the dominance rule in `relif_ray.sweep.selection`, which the
Optuna sweep's `pareto.csv` uses too).

Neither is in the paper; both are what MTL papers (Delta-M%, e.g. LibMTL's NYUv2 tables) and
multi-objective papers (hypervolume) report, so a reader can place our numbers among theirs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from relif_ray.analysis.audit_scores import erm_partner
from relif_ray.errors import UserError, last_line
from relif_ray.experiment.record import VAL_MACRO, split_metric
from relif_ray.problems import benchmark
from relif_ray.sweep.selection import hypervolume

DeltaMAverage = Literal["task", "metric"]


def task_metrics(
    directions: Mapping[str, bool], tasks: Sequence[str]
) -> dict[str, dict[str, bool]]:
    """The native metrics `<task>_<metric>` of each task with their direction (higher is
    better), from a flat `<task>_<metric>` -> higher-is-better map such as
    `Benchmark.metric_directions`; the normalized scores (`<task>_score`, worst, macro) are
    left out: they are transforms of the native metrics, not reported metrics of their own.
    A metric belongs to the longest task name it starts with."""
    grouped: dict[str, dict[str, bool]] = {task: {} for task in tasks}
    by_length = sorted(tasks, key=len, reverse=True)
    for column, higher in directions.items():
        task = next((t for t in by_length if column.startswith(f"{t}_")), None)
        if task is not None and column != f"{task}_score":
            grouped[task][column] = higher
    return {task: metrics for task, metrics in grouped.items() if metrics}


def delta_m(
    trials: pd.DataFrame,
    metrics: Mapping[str, Mapping[str, bool]],
    reference: str = "erm",
    by: str = "variant",
    average: DeltaMAverage = "task",
) -> pd.DataFrame:
    """Delta-M% of every trial against the same-seed trial of `reference`.

    For each metric m, the signed relative change s_m (N_m - B_m) / B_m of the trial's value
    N_m against the reference's B_m, with s_m = +1 where higher is better and -1 where lower
    is better (positive = better than the reference), times 100. `average="task"` (default) is
    LibMTL's `count_improvement` (`LibMTL/utils.py`, its Delta_p): the mean over tasks of the
    mean over each task's metrics, so a task with more metrics does not weigh more;
    `average="metric"`: the plain mean over all metrics (the Delta_m of Maninis et al. 2019).
    Both agree when every task has the same number of metrics.

    trials: one row per trial, columns `by`, `seed` and every metric column of `metrics`
        (task -> {column: higher is better}, e.g. from `task_metrics`).
    Returns columns `by`, seed, delta_m in the row order of `trials`. delta_m is NaN where the
    trial has no same-seed reference or a reference value is 0 (the relative change is
    undefined). As in LibMTL the change is divided by B_m itself, so a negative reference
    value (a kappa below 0) flips that metric's sign. A seed with two reference trials is a
    ValueError (the pairing would be ambiguous).
    """
    columns = [column for task in metrics.values() for column in task]
    if not columns:
        raise ValueError("delta_m: no metrics to average")
    base = trials.loc[trials[by] == reference, ["seed", *columns]]
    repeated = base["seed"][base["seed"].duplicated()]
    if not repeated.empty:
        raise ValueError(f"delta_m: seed {repeated.iloc[0]} has several '{reference}' trials")
    base_values = base.set_index("seed").reindex(trials["seed"]).to_numpy(dtype=np.float64)
    values = trials[columns].to_numpy(dtype=np.float64)
    score = _improvement(values, base_values, metrics, average)
    return pd.DataFrame(
        {by: trials[by].to_numpy(), "seed": trials["seed"].to_numpy(), "delta_m": score}
    )


def _improvement(
    values: np.ndarray,
    base_values: np.ndarray,
    metrics: Mapping[str, Mapping[str, bool]],
    average: DeltaMAverage,
) -> np.ndarray:
    """Delta-M% of each row of `values` against the same row of `base_values` (columns: the
    metrics of `metrics` in order), averaged as `delta_m` says; NaN where undefined."""
    signs = np.array([1.0 if task[c] else -1.0 for task in metrics.values() for c in task])
    with np.errstate(divide="ignore", invalid="ignore"):
        change = signs * (values - base_values) / base_values
    change[~np.isfinite(change)] = np.nan
    if average == "metric":
        return 100 * change.mean(axis=1)
    bounds = np.cumsum([0, *(len(task) for task in metrics.values())])
    per_task = [change[:, a:b].mean(axis=1) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return 100 * np.mean(per_task, axis=0)


@dataclass(frozen=True)
class DeltaMOptions:
    """How the report's Delta-M% is computed: the conventions of the MTL literature
    (docs/mtl_metrics.md). The defaults are LibMTL's `count_improvement` against the same-seed
    ERM trial at its final checkpoint; Nash-MTL's and FAMO's NYUv2 tables are
    `DeltaMOptions(base=<single-task numbers>, sign="lower", average="metric",
    epochs="last", last_k=10)`.

    base: "erm", the same-seed ERM trial (`relif_ray.analysis.audit_scores.erm_partner`), or
        the path of a JSON file of fixed metric values {"<task>_<metric>": value, ...} in this
        project's units (`read_metric_vector`), e.g. single-task numbers.
    sign: "higher": positive is better (LibMTL); "lower": lower is better, the negation
        (Nash-MTL's and FAMO's `delta_fn`).
    average: "task": per task, then over tasks (LibMTL); "metric": the plain mean over every
        metric (Maninis et al. 2019; Nash-MTL, FAMO).
    epochs: which values of each trial (and of an ERM base): "final", its final checkpoint's;
        "best", those of the epoch with the highest validation Macro (the first such epoch);
        "last", the mean over its last `last_k` epochs (all of them where it ran fewer).
        "best" and "last" read the per-epoch values Tune recorded (`Experiment.epochs`): the
        validation metrics always, the test metrics where the trials ran with
        `train.epoch_test_metrics: true`.
    """

    base: str = "erm"
    sign: Literal["higher", "lower"] = "higher"
    average: DeltaMAverage = "task"
    epochs: Literal["final", "best", "last"] = "final"
    last_k: int = 10

    def __post_init__(self) -> None:
        if self.sign not in ("higher", "lower"):
            raise UserError(f"Delta-M% sign: 'higher' or 'lower', got {self.sign!r}")
        if self.average not in ("task", "metric"):
            raise UserError(f"Delta-M% average: 'task' or 'metric', got {self.average!r}")
        if self.epochs not in ("final", "best", "last"):
            raise UserError(f"Delta-M% epochs: 'final', 'best' or 'last', got {self.epochs!r}")
        if self.last_k < 1:
            raise UserError(f"Delta-M% last epochs: must be >= 1, got {self.last_k}")

    def describe(self) -> str:
        """One sentence for the report: base, sign, averaging and epochs."""
        base = (
            "the same-seed ERM trial (of the same architecture)"
            if self.base == "erm"
            else f"the fixed metric values of {Path(self.base).name}"
        )
        sign = (
            "signed so that positive is better (LibMTL)"
            if self.sign == "higher"
            else "signed so that lower is better (Nash-MTL, FAMO)"
        )
        average = (
            "the mean over tasks of the mean over each task's metrics (LibMTL)"
            if self.average == "task"
            else "the plain mean over all metrics (Nash-MTL, FAMO)"
        )
        epochs = {
            "final": "each trial's final checkpoint",
            "best": "each trial's epoch with the best validation Macro",
            "last": f"the mean over each trial's last {self.last_k} epochs",
        }[self.epochs]
        return (
            f"Δm%: 100 x {average} of the relative change against {base}, {sign}, "
            f"values of {epochs}"
        )


def delta_m_note(options: DeltaMOptions) -> str:
    """What the report says about its Delta-M% column."""
    erm_row = "ERM's own row is 0 by definition; " if options.base == "erm" else ""
    return (
        f"{options.describe()} (NYUv2: the nine metrics of the literature's tables, without "
        f"depth RMSE; docs/mtl_metrics.md names the metrics); {erm_row}mean ± sample std over "
        "the seeds where it is defined ('–': none)."
    )


def read_metric_vector(path: str | Path) -> dict[str, float]:
    """A fixed metric vector for `DeltaMOptions.base`: a JSON object of finite numbers keyed
    by metric name (`<task>_<metric>`, e.g. "seg_miou"). A missing or malformed file is a
    one-line UserError naming it."""
    try:
        loaded = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"--delta-m-base: no such file: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(
            f"--delta-m-base {path}: not a JSON file ({last_line(str(error))})"
        ) from None
    if not isinstance(loaded, dict) or not loaded:
        raise UserError(f"--delta-m-base {path}: must be a JSON object of metric: value")
    values = {}
    for metric, value in loaded.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"--delta-m-base {path}: {metric}: must be a number, got {value!r}")
        if not math.isfinite(value) or value == 0:
            raise UserError(f"--delta-m-base {path}: {metric}: must be finite and non-zero")
        values[str(metric)] = float(value)
    return values


def delta_m_per_trial(
    trials: pd.DataFrame,
    split: str,
    options: DeltaMOptions | None = None,
    epochs: pd.DataFrame | None = None,
) -> pd.Series:
    """Delta-M% on `split` of every trial of an `Experiment.trials` frame under `options`
    (default: LibMTL's, against the same-seed ERM trial at the final checkpoint), as the
    report shows it (index: that of `trials`).

    The ERM base is the trial the audit squashes with
    (`relif_ray.analysis.audit_scores.erm_partner`: the plain ERM trial of the same data set,
    architecture and seed, from the trial's own experiment directory where it has one). The metrics
    are the data set's Delta-M% metrics (`Benchmark.delta_m_metrics`: NYUv2's nine of LibMTL's
    tables; elsewhere every native metric, `task_metrics`) that the trials report on `split`
    (`<split>_<task>_<metric>` columns), each signed by its task's direction (`delta_m`). A plain
    ERM trial gets 0 against the ERM base. NaN where a seed has no ERM trial or several (several
    directories loaded), where a metric is missing or its base value is 0, or where the data set
    reports no native metric. `epochs` (`Experiment.epochs`) is needed for the "best" and "last"
    epoch rules; a trial without the per-epoch values a rule needs is a one-line UserError.
    """
    options = options or DeltaMOptions()
    base = None if options.base == "erm" else read_metric_vector(options.base)
    partner = erm_partner(trials)
    result = np.full(len(trials), np.nan)
    for dataset, positions in trials.groupby("dataset", sort=False).indices.items():
        group = trials.iloc[positions]
        metrics = _reported_metrics(group, dataset, split)
        if not metrics:
            continue
        names = [name for task in metrics.values() for name in task]
        values = _epoch_values(group, split, names, options, epochs)
        if base is None:
            partners = [partner[trial] for trial in group["trial"]]
            references = trials[trials["trial"].isin(set(partners))]
            of = dict(
                zip(
                    references["trial"],
                    _epoch_values(references, split, names, options, epochs),
                    strict=True,
                )
            )
            undefined = np.full(len(names), np.nan)
            base_values = np.array([of.get(p, undefined) for p in partners]).reshape(values.shape)
        else:
            missing = [name for name in names if name not in base]
            if missing:
                raise UserError(
                    f"--delta-m-base {options.base}: no value for {missing[0]} (the trials "
                    f"report {', '.join(names)})"
                )
            base_values = np.tile([base[name] for name in names], (len(group), 1))
        score = _improvement(values, base_values, metrics, options.average)
        result[positions] = score if options.sign == "higher" else -score
    return pd.Series(result, index=trials.index, name="delta_m")


def _reported_metrics(group: pd.DataFrame, dataset: str, split: str) -> dict[str, dict[str, bool]]:
    """Task -> {metric: higher is better} of the data set's Delta-M% metrics that the trials
    of `group` report on `split` (names without the split prefix)."""
    problem = benchmark(dataset, "data set of the trials")
    averaged = set(problem.delta_m_metrics or problem.metric_directions)
    reported = {
        metric: higher
        for metric, higher in problem.metric_directions.items()
        if metric in averaged
        and group.get(split_metric(split, metric), pd.Series(dtype=float)).notna().any()
    }
    return task_metrics(reported, [task.name for task in problem.tasks()])


def _epoch_values(
    trials: pd.DataFrame,
    split: str,
    metrics: list[str],
    options: DeltaMOptions,
    epochs: pd.DataFrame | None,
) -> np.ndarray:
    """(len(trials), len(metrics)) values of `<split>_<metric>` under the epoch rule."""
    columns = [split_metric(split, metric) for metric in metrics]
    if options.epochs == "final":
        return trials.reindex(columns=columns).to_numpy(dtype=np.float64)
    flag = f"--delta-m-epochs {options.epochs}"
    if epochs is None or epochs.empty:
        raise UserError(f"{flag}: the trials have no per-epoch results (Tune's result.json)")
    by_trial = dict(tuple(epochs.groupby("trial", sort=False)))
    values = []
    for trial in trials["trial"]:
        records = by_trial.get(trial)
        if records is None:
            raise UserError(f"{flag}: trial {trial} has no per-epoch results")
        absent = [c for c in columns if c not in records or records[c].isna().all()]
        if absent:
            keep = " (run it with train.epoch_test_metrics: true)" if split == "test" else ""
            raise UserError(f"{flag}: trial {trial} kept no per-epoch {absent[0]}{keep}")
        records = records.dropna(subset=columns).sort_values("epoch")  # the validated epochs
        if options.epochs == "best":
            chosen = records.loc[[records[VAL_MACRO].idxmax()]]
        else:
            chosen = records.tail(options.last_k)
        values.append(chosen[columns].to_numpy(dtype=np.float64).mean(axis=0))
    return np.array(values).reshape(len(trials), len(columns))


def hypervolumes(points: pd.DataFrame, by: str = "variant") -> pd.DataFrame:
    """The hypervolume of each `by` group's (bias, worst) points (e.g. a method's per-seed
    points), in first-appearance order: columns `by`, n_points, hypervolume."""
    rows = [
        (key, len(group), hypervolume(group["bias"], group["worst"]))
        for key, group in points.groupby(by, sort=False)
    ]
    return pd.DataFrame(rows, columns=[by, "n_points", "hypervolume"])
