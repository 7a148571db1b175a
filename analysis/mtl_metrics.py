"""Summary metrics of the multi-task and multi-objective literature, as small functions over
pandas/numpy: Delta-M% against same-seed ERM (LibMTL's `count_improvement`), that of every
trial of an experiment (the report's utility table), and the hypervolume of each method's
(Bias, Worst) points (the area of the fixed-delta Pareto front; the function itself,
`hypervolume`, lives next to the dominance rule in `relif_ray.sweep.selection`, which the
Optuna sweep's `pareto.csv` uses too).

Neither is in the paper; both are what MTL papers (Delta-M%, e.g. LibMTL's NYUv2 tables) and
multi-objective papers (hypervolume) report, so a reader can place our numbers among theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd

from analysis.audit_scores import same_seed_erm
from analysis.render import summarize
from relif_ray.problems import benchmark
from relif_ray.sweep.selection import hypervolume

DeltaMAverage = Literal["task", "metric"]
DELTA_M_NOTE = (
    "Δm% vs ERM: LibMTL's count_improvement against the same-seed ERM trial (of the same "
    "architecture), 100 x the mean over tasks of the mean over each task's metrics of the "
    "relative change, signed so that positive is better (NYUv2: the nine metrics of LibMTL's "
    "tables, without depth RMSE; docs/mtl_metrics.md names the metrics); ERM's own row is 0 "
    "by definition; mean ± sample std over the seeds with one same-seed ERM trial ('–': none)."
)
"""What the report says about its Delta-M% column."""


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


def delta_m_against_erm(trials: pd.DataFrame, split: str) -> pd.Series:
    """Delta-M% on `split` of every trial of an `Experiment.trials` frame against its same-seed
    ERM trial, as the report's utility table shows it (index: that of `trials`).

    The baseline is the trial the audit squashes with (`analysis.audit_scores.same_seed_erm`:
    the plain ERM trial of the same data set and seed, from the trial's own experiment
    directory where it has one). The metrics are the data set's Delta-M% metrics
    (`Benchmark.delta_m_metrics`: NYUv2's nine of LibMTL's tables; elsewhere every native
    metric, `task_metrics`) that the trials report on `split` (`<split>_<task>_<metric>`
    columns), each signed by its task's direction and averaged per task, then over tasks, as
    LibMTL's `count_improvement` (`delta_m`). A plain ERM trial gets 0, its change against itself.
    NaN where a seed has no ERM trial or several (several directories loaded), where a
    metric is missing or its ERM value is 0, or where the data set reports no native metric.
    """
    candidates = same_seed_erm(trials)
    result = np.full(len(trials), np.nan)
    by_trial = trials.set_index("trial")
    for dataset, positions in trials.groupby("dataset", sort=False).indices.items():
        group = trials.iloc[positions]
        problem = benchmark(dataset, "data set of the trials")
        averaged = set(problem.delta_m_metrics or problem.metric_directions)
        reported = {
            f"{split}_{metric}": higher
            for metric, higher in problem.metric_directions.items()
            if metric in averaged
            and group.get(f"{split}_{metric}", pd.Series(dtype=float)).notna().any()
        }
        tasks = [f"{split}_{task.name}" for task in problem.tasks()]
        metrics = task_metrics(reported, tasks)
        if not metrics:
            continue
        columns = [column for task in metrics.values() for column in task]
        references = [
            same[0] if len(same) == 1 else None
            for same, _ in (candidates[trial] for trial in group["trial"])
        ]
        base_values = by_trial.reindex(references)[columns].to_numpy(dtype=np.float64)
        values = group[columns].to_numpy(dtype=np.float64)
        result[positions] = _improvement(values, base_values, metrics, "task")
    return pd.Series(result, index=trials.index, name="delta_m")


def delta_m_summary(per_trial: pd.DataFrame, by: str = "variant") -> pd.DataFrame:
    """Mean and sample std of `delta_m` over the seeds where it is defined, per `by` group in
    first-appearance order: columns `by`, n_seeds, delta_m_mean, delta_m_std."""
    order = list(dict.fromkeys(per_trial[by]))
    defined = per_trial.dropna(subset=["delta_m"])
    table = summarize(defined, by, ["delta_m"])
    table = table.set_index(by).reindex(order).fillna({"n_seeds": 0})
    return table.astype({"n_seeds": int}).reset_index()


def hypervolumes(points: pd.DataFrame, by: str = "variant") -> pd.DataFrame:
    """The hypervolume of each `by` group's (bias, worst) points (e.g. a method's per-seed
    points), in first-appearance order: columns `by`, n_points, hypervolume."""
    rows = [
        (key, len(group), hypervolume(group["bias"], group["worst"]))
        for key, group in points.groupby(by, sort=False)
    ]
    return pd.DataFrame(rows, columns=[by, "n_points", "hypervolume"])
