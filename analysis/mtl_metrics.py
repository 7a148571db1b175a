"""Summary metrics of the multi-task and multi-objective literature, as small pure functions
over pandas/numpy: Delta-M% against same-seed ERM (LibMTL's `count_improvement`) and the
hypervolume of a (Bias, Worst) point set (the fixed-delta Pareto front's area).

Neither is in the paper; both are what MTL papers (Delta-M%, e.g. LibMTL's NYUv2 tables) and
multi-objective papers (hypervolume) report, so a reader can place our numbers among theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd

from analysis.render import summarize

DeltaMAverage = Literal["task", "metric"]

HYPERVOLUME_REFERENCE: tuple[float, float] = (1.0, 0.0)
"""(Bias, Worst) reference point of every hypervolume: the worst value each coordinate can
take. Audit scores lie in [0, 1], so a gap is at most 1 and Bias = mean (gap - delta)_+ <= 1;
normalized task scores lie in [0, 1], so Worst >= 0. The hypervolume is then the area of the
unit (Bias, Worst) box that the point set dominates: 0 for no useful point, 1 for the ideal
(Bias 0, Worst 1). Fixed, so hypervolumes compare across methods, seeds and experiments."""


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
    signs = np.array([1.0 if task[c] else -1.0 for task in metrics.values() for c in task])
    with np.errstate(divide="ignore", invalid="ignore"):
        change = signs * (values - base_values) / base_values
    change[~np.isfinite(change)] = np.nan
    if average == "metric":
        score = change.mean(axis=1)
    else:
        bounds = np.cumsum([0, *(len(task) for task in metrics.values())])
        per_task = [
            change[:, a:b].mean(axis=1) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        score = np.mean(per_task, axis=0)
    return pd.DataFrame(
        {by: trials[by].to_numpy(), "seed": trials["seed"].to_numpy(), "delta_m": 100 * score}
    )


def delta_m_summary(per_trial: pd.DataFrame, by: str = "variant") -> pd.DataFrame:
    """Mean and sample std of `delta_m` over the seeds where it is defined, per `by` group in
    first-appearance order: columns `by`, n_seeds, delta_m_mean, delta_m_std."""
    order = list(dict.fromkeys(per_trial[by]))
    defined = per_trial.dropna(subset=["delta_m"])
    table = summarize(defined, by, ["delta_m"])
    table = table.set_index(by).reindex(order).fillna({"n_seeds": 0})
    return table.astype({"n_seeds": int}).reset_index()


def hypervolume(
    bias: Sequence[float] | np.ndarray,
    worst: Sequence[float] | np.ndarray,
    reference: tuple[float, float] = HYPERVOLUME_REFERENCE,
) -> float:
    """Area of the (Bias, Worst) region the points dominate up to `reference` (Bias lower is
    better, Worst higher is better): the union of the boxes [bias_i, ref_bias] x [ref_worst,
    worst_i]. Points with a NaN coordinate, or not strictly better than the reference in both
    coordinates, add nothing; dominated points add nothing either, so the hypervolume of a
    point set is that of its Pareto front (`relif_ray.sweep.selection.non_dominated`)."""
    bias = np.asarray(bias, dtype=np.float64)
    worst = np.asarray(worst, dtype=np.float64)
    ref_bias, ref_worst = reference
    keep = np.isfinite(bias) & np.isfinite(worst) & (bias < ref_bias) & (worst > ref_worst)
    order = np.argsort(bias[keep], kind="stable")
    bias, worst = bias[keep][order], worst[keep][order]
    # Left to right in Bias, the region's height is the best Worst of the points seen so far.
    height = np.maximum.accumulate(worst) - ref_worst if worst.size else worst
    width = np.append(bias[1:], ref_bias) - bias
    return float(np.sum(width * height))


def hypervolumes(points: pd.DataFrame, by: str = "variant") -> pd.DataFrame:
    """The hypervolume of each `by` group's (bias, worst) points (e.g. a method's per-seed
    points), in first-appearance order: columns `by`, n_points, hypervolume."""
    rows = [
        (key, len(group), hypervolume(group["bias"], group["worst"]))
        for key, group in points.groupby(by, sort=False)
    ]
    return pd.DataFrame(rows, columns=[by, "n_points", "hypervolume"])
