"""Utility-fairness Pareto fronts: fixed-delta Bias (lower is better) against Worst (higher is
better), as in the paper's Figure 2 (upper-left is preferred)."""

from __future__ import annotations

import pandas as pd

from analysis.results import Results
from relif_ray.sweep.selection import non_dominated


def pareto_points(results: Results) -> pd.DataFrame:
    """Per-seed points: trial, variant, seed, bias (at the primary delta_ref), worst, and
    on_front (non-dominated among all trials)."""
    key = f"bias_{results.primary.key}"
    points = results.per_trial[["trial", "variant", "seed", key, "worst"]].rename(
        columns={key: "bias"}
    )
    points["on_front"] = non_dominated(points["bias"], points["worst"])
    return points.reset_index(drop=True)


def pareto_means(results: Results) -> pd.DataFrame:
    """Per-method means: variant, bias / worst mean and sample std over seeds, n_seeds, and
    on_front (non-dominated among the method means)."""
    points = pareto_points(results)
    grouped = points.groupby("variant", sort=False)
    means = pd.DataFrame(
        {
            "n_seeds": grouped.size(),
            "bias_mean": grouped["bias"].mean(),
            "bias_std": grouped["bias"].std(ddof=1),
            "worst_mean": grouped["worst"].mean(),
            "worst_std": grouped["worst"].std(ddof=1),
        }
    ).loc[results.variants]
    means["on_front"] = non_dominated(means["bias_mean"], means["worst_mean"])
    return means.reset_index()
