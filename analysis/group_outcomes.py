"""The group audit of a table's multiclass and regression tasks (`relif_ray.analysis.groups`):
per group, the task's error and what it predicts, and the gaps between groups.

A table's binary task is audited as a clinical one (its decision at a probability threshold,
Fairlearn's demographic-parity and equalized-odds differences). A multiclass or regression
task has no positive class to rate, so per group (Fairlearn's `MetricFrame` over the stored
outcomes, `relif_ray.tasks.base.OUTCOME_KINDS`):

- multiclass: `value`, the error rate of the arg-max class (1 - accuracy), and `share_<k>`,
  the share of the group's rows predicted as class k (the multiclass selection rate);
- regression: `value`, the mean absolute error in the column's units, and
  `mean_prediction`, the mean prediction.

The metric functions are numpy's (the tests hold them to scikit-learn's `accuracy_score` and
`mean_absolute_error`): scikit-learn's input validation would cost more than the arithmetic,
once per trial, task, attribute and group.

Over the compared groups (at least `min_group_size` rows), the disparities
(`OUTCOME_DISPARITIES`) are `error_gap`, the largest minus the smallest group's error, and
`prediction_gap`, the largest minus the smallest group's mean prediction (multiclass: the
largest such gap in the share predicted as any one class); NaN with fewer than two compared
groups. Each is paired with the same-seed ERM trial's and summed up over seeds as the binary
tasks' disparities are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from fairlearn.metrics import MetricFrame

OUTCOME_DISPARITIES = ("error_gap", "prediction_gap")
"""The disparities of a multiclass or regression task."""
OUTCOME_METRICS = {"multiclass": "error", "regression": "mae"}
"""The per-group `value` of each kind: its name in the group tables."""


def error_rate(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """1 - accuracy of the predicted classes."""
    return float(np.mean(y_true != y_pred))


def mean_absolute_error(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """The mean absolute error."""
    return float(np.mean(np.abs(y_true - y_pred)))


def mean_prediction(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """The mean prediction (the label is not used)."""
    return float(np.mean(y_pred))


def class_share(k: int) -> Any:
    """The share of rows predicted as class k (a `MetricFrame` metric)."""

    def share(y_true: np.ndarray, y_pred: np.ndarray) -> float:
        return float(np.mean(y_pred == k))

    return share


def metric_frames(
    metrics: dict[str, Any],
    y_true: np.ndarray,
    y_pred: np.ndarray,
    sensitive: np.ndarray,
    trials: np.ndarray,
    sample_params: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[Any, tuple[pd.DataFrame, pd.Series]]:
    """Per trial, Fairlearn's per-group and overall values of `metrics` on its rows: one
    `MetricFrame` over the rows of every trial, the trial as its control feature (each
    trial's groups and overall value are those of a frame of its rows alone; one frame for
    all saves Fairlearn's set-up per trial)."""
    frame = MetricFrame(
        metrics=metrics,
        y_true=y_true,
        y_pred=y_pred,
        sensitive_features=pd.Series(sensitive, name="group"),
        control_features=pd.Series(trials, name="trial"),
        sample_params=sample_params,
    )
    by_group, overall = frame.by_group, frame.overall
    return {
        trial: (by_group.xs(trial, level="trial"), overall.loc[trial])
        for trial in dict.fromkeys(trials)
    }


def group_tables(
    frames: dict[Any, tuple[pd.DataFrame, pd.Series]],
    example_ids: np.ndarray,
    sensitive: np.ndarray,
    trials: np.ndarray,
    metric: str,
    min_group_size: int,
    positives: np.ndarray | None = None,
) -> dict[Any, pd.DataFrame]:
    """Per trial of `frames` (`metric_frames`), its per-group frame of a task: per group its
    stays (distinct examples), samples (rows) and, where given, positives (one count over
    every trial's rows, `trials` naming each row's), then the `MetricFrame`'s values, the
    task's metric name and `small` (fewer than `min_group_size` stays: left out of the
    gaps)."""
    columns = {"trial": trials, "group": sensitive, "stay": example_ids}
    counts = {"stays": ("stay", "nunique"), "samples": ("stay", "size")}
    if positives is not None:
        columns["positive"] = positives
        counts["positives"] = ("positive", "sum")
    sizes = pd.DataFrame(columns).groupby(["trial", "group"]).agg(**counts)
    tables = {}
    for trial, (by_group, _) in frames.items():
        per_group = sizes.xs(trial, level="trial").join(by_group).reset_index()
        per_group["small"] = per_group["stays"] < min_group_size
        per_group.insert(1, "metric", metric)
        tables[trial] = per_group
    return tables


def outcome_groups_by_trial(
    rows: pd.DataFrame,
    kind: str,
    sensitive: np.ndarray,
    trials: np.ndarray,
    min_group_size: int,
) -> dict[Any, tuple[pd.DataFrame, dict[str, Any]]]:
    """Per trial (`trials`: each row's trial), a multiclass or regression task's per-group
    frame and disparities for one attribute (`sensitive`: each row's group; module
    docstring)."""
    y_true = rows["label"].to_numpy(dtype=np.float64)
    y_pred = rows["prediction"].to_numpy(dtype=np.float64)
    if kind == "multiclass":
        y_true, y_pred = y_true.astype(np.int64), y_pred.astype(np.int64)
        classes = np.unique(np.concatenate([y_true, y_pred]))
        shares = {f"share_{k}": class_share(int(k)) for k in classes}
        metrics = {"value": error_rate, **shares}
    else:
        metrics = {"value": mean_absolute_error, "mean_prediction": mean_prediction}
    frames = metric_frames(metrics, y_true, y_pred, sensitive, trials)
    ids = rows["example_id"].to_numpy()
    tables = group_tables(frames, ids, sensitive, trials, OUTCOME_METRICS[kind], min_group_size)
    predicted = [column for column in metrics if column != "value"]
    found = {}
    for trial, (_, overall) in frames.items():
        per_group = tables[trial]
        compared = per_group[~per_group["small"]].set_index("group")
        two = len(compared) > 1
        found[trial] = (
            per_group,
            {
                "metric": OUTCOME_METRICS[kind],
                "overall": float(overall["value"]),
                "groups": len(per_group),
                "compared": len(compared),
                "error_gap": _range(compared["value"]) if two else np.nan,
                "prediction_gap": max(_range(compared[c]) for c in predicted) if two else np.nan,
            },
        )
    return found


def _range(values: pd.Series) -> float:
    return float(values.max() - values.min())
