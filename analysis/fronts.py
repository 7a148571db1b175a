"""Utility-fairness Pareto fronts: fixed-delta Bias (lower is better) against Worst (higher is
better), as in the paper's Figure 2 (upper-left is preferred), and their hypervolumes against
the fixed reference point (Bias 1, Worst 0) (`relif_ray.sweep.selection.hypervolume`)."""

from __future__ import annotations

import pandas as pd

from relif_ray.analysis.mtl_metrics import hypervolumes
from relif_ray.analysis.paired import erm_verdicts, front_shares, paired_summary
from relif_ray.analysis.render import Column, Table
from relif_ray.analysis.results import Results
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.sweep.selection import HYPERVOLUME_REFERENCE, hypervolume, non_dominated

ALL_TRIALS = "all trials"
"""The hypervolume table's row of every per-seed point together: the experiment's front."""


def pareto_points(results: Results) -> pd.DataFrame:
    """Per-seed points: trial, variant, seed, bias (at the primary delta_ref), worst, and
    on_front (non-dominated among all trials)."""
    key = f"bias_{results.primary.key}"
    points = results.per_trial[["trial", "variant", "seed", key, "worst"]].rename(
        columns={key: "bias"}
    )
    points["on_front"] = non_dominated(points["bias"], points["worst"])
    return points.reset_index(drop=True)


def pareto_means(results: Results, settings: VerdictSettings | None = None) -> pd.DataFrame:
    """Per-method means: variant, bias / worst mean and sample std over seeds, n_seeds,
    on_front (non-dominated among the method means), hypervolume (of the method's per-seed
    points, `hypervolume_table`) and front_share: the share of seed-bootstrap resamples in
    which the method's mean is on the front (`relif_ray.analysis.paired.front_shares`,
    `settings.n_boot` resamples): how much of "on the front" the seeds can show."""
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
    means["hypervolume"] = hypervolumes(points).set_index("variant")["hypervolume"]
    means["front_share"] = front_shares(results, settings)
    return means.reset_index()


def hypervolume_table(results: Results) -> Table:
    """The hypervolume of each method's per-seed (Bias, Worst) points and, last, of every
    trial's (the experiment's front, row `ALL_TRIALS`), at the primary delta_ref. A method's
    value grows with its number of seeds (more points can only add area), so methods compare
    at equal seed counts; no cell is marked best."""
    points = pareto_points(results)
    rows = hypervolumes(points).rename(columns={"variant": "row"})
    front = hypervolume(points["bias"], points["worst"])
    rows.loc[len(rows)] = [ALL_TRIALS, len(points), front]
    columns = [
        Column("n_points", "Points", "Points", kind="number", digits=0),
        Column("hypervolume", "Hypervolume", "Hypervolume", kind="number"),
    ]
    bias, worst = HYPERVOLUME_REFERENCE
    title = (
        f"Hypervolume of the (Bias@{results.primary.symbol}, Worst) points ({results.split} "
        f"split): the area of the region they dominate up to the reference point (Bias "
        f"{bias:g}, Worst {worst:g}), 0 to 1. Per method over its per-seed points; "
        f"'{ALL_TRIALS}': every trial's point, the experiment's front. A method's value grows "
        "with its number of seeds: compare methods at equal seed counts."
    )
    return Table("hypervolume", title, "Method", columns, rows)


def front_with_verdicts(results: Results, settings: VerdictSettings | None = None) -> pd.DataFrame:
    """The utility-fairness front beside the verdicts over seeds, one row per variant: the
    means (`relif_ray.analysis.fronts.pareto_means`: bias_mean, worst_mean, on_front, front_share)
    and the verdicts against same-seed ERM of Bias at the primary delta_ref and of Worst
    ("reference" for plain ERM)."""
    settings = settings or VerdictSettings()
    means = pareto_means(results, settings)
    frame = means[["variant", "n_seeds", "bias_mean", "worst_mean", "on_front", "front_share"]]
    verdicts = erm_verdicts(results, paired_summary(results, settings), list(frame["variant"]))
    return frame.assign(bias_vs_erm=verdicts["bias"], worst_vs_erm=verdicts["worst"])
