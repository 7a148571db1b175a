"""Pareto dominance of (Bias, Worst) points: Bias lower is better, Worst higher is better (the
paper's utility-fairness trade-off, Figure 2). Used by the Optuna sweep's `pareto.csv` and by
the analysis fronts."""

from __future__ import annotations

import numpy as np
import pandas as pd


def non_dominated(bias: np.ndarray, worst: np.ndarray) -> np.ndarray:
    """Mask of the points no other point dominates. q dominates p when q.bias <= p.bias and
    q.worst >= p.worst with at least one strict; identical points do not dominate each other.
    Points with a NaN coordinate are never on the front."""
    bias = np.asarray(bias, dtype=np.float64)
    worst = np.asarray(worst, dtype=np.float64)
    finite = np.isfinite(bias) & np.isfinite(worst)
    no_worse = (bias[:, None] <= bias[None, :]) & (worst[:, None] >= worst[None, :])
    better = (bias[:, None] < bias[None, :]) | (worst[:, None] > worst[None, :])
    dominates = no_worse & better & finite[:, None]
    return finite & ~dominates.any(axis=0)


def pareto_front(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of each `study` that no other row of that study dominates in (val_bias,
    val_worst), sorted by study and val_bias."""
    keep = np.zeros(len(rows), dtype=bool)
    for positions in rows.groupby("study", sort=True).indices.values():
        group = rows.iloc[positions]
        keep[positions] = non_dominated(group["val_bias"], group["val_worst"])
    return rows[keep].sort_values(["study", "val_bias"]).reset_index(drop=True)
