"""The report's threshold-drift tables: how far each method's own thresholds move from delta_ref.

Diagnostics only, never the comparison metric (that is the fixed-delta audit of
`relif_ray.analysis.tables`); each builder returns a `Table`, or a `Skipped` note:

- drift: mean validation-induced threshold per method, difference and ratio to a chosen
  method (Table 3)
- shift: raw (own induced thresholds) versus fixed-delta Bias and the ranks (Table 4, Shift;
  `rank_shift`, also drawn by `relif_ray.analysis.figures.rank_shift_figure`)
- certificate: Theorem B.2 for every pair of methods
  (`relif_ray.audit_thresholds.ranking_is_robust`)
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from relif_ray.analysis.render import Column, Table, display_text, latex_escape
from relif_ray.analysis.results import Results
from relif_ray.analysis.tables import CISettings, Skipped, add_bias_ci, bias_column, variant_stats
from relif_ray.audit_thresholds import ranking_is_robust


def drift_table(results: Results, baseline: str) -> Table:
    """Mean validation-induced threshold per method; difference and ratio of the means to
    the `baseline` method's mean (Table 3 layout)."""
    rows = variant_stats(results, ["induced_mean"])
    reference = float(rows.loc[rows["row"] == baseline, "induced_mean_mean"].iloc[0])
    rows["difference"] = rows["induced_mean_mean"] - reference
    rows["ratio"] = rows["induced_mean_mean"] / reference
    columns = [
        Column("induced_mean", "Mean induced δ (val)", r"$\bar{\delta}_{\mathrm{val}}$", "lower"),
        Column(
            "difference",
            f"Δ vs {display_text(baseline)}",
            f"$\\Delta$ vs {latex_escape(display_text(baseline))}",
            None,
            "number",
        ),
        Column("ratio", "Ratio", "Ratio", None, "number", digits=2),
    ]
    title = (
        "Method-induced thresholds on the validation split (mean over task pairs of the mean "
        "cosine-induced distance (1-cos)/2 of each method's own shared representations over "
        "the audit's sampled pairs), mean ± std over seeds. A threshold-drift diagnostic "
        "only: Bias is compared under the held-fixed delta_ref."
    )
    return Table("drift", title, "Method", columns, rows)


def rank_shift(results: Results) -> pd.DataFrame:
    """Per method (`row`): mean Bias at its own induced thresholds ("raw") and at the primary
    delta_ref, and the two rankings (1 = lowest mean Bias, ties share the lower rank): the
    ranking that method-induced thresholds give against the held-fixed one (paper section 3.2;
    `shift_table`, `relif_ray.analysis.figures.rank_shift_figure`)."""
    fixed_key = f"bias_{results.primary.key}"
    rows = variant_stats(results, ["raw_bias", fixed_key])
    rows["raw_rank"] = rows["raw_bias_mean"].rank(method="min").astype(int)
    rows["fixed_rank"] = rows[f"{fixed_key}_mean"].rank(method="min").astype(int)
    return rows


def shift_table(results: Results, ci: CISettings) -> Table:
    """Bias at each method's own induced thresholds ("raw") versus at delta_ref, with the
    method ranks of `rank_shift`."""
    delta = results.primary
    fixed_key = f"bias_{delta.key}"
    rows = rank_shift(results)
    add_bias_ci(rows, results, "raw_bias", None, ci)
    add_bias_ci(rows, results, fixed_key, delta.value, ci)
    rows["shift"] = [f"{a}→{b}" for a, b in zip(rows["raw_rank"], rows["fixed_rank"], strict=True)]
    columns = [
        Column("raw_bias", "Raw Bias (own induced δ)", r"Bias@$\delta_m$", "lower"),
        bias_column(fixed_key, delta.symbol, delta.latex),
        Column("shift", "Shift (raw→fixed rank)", "Shift", None, "text"),
    ]
    title = (
        f"Raw versus fixed-delta Bias ({results.split} split): raw audits each method at its "
        f"own validation-induced thresholds, fixed at {delta.symbol} = {delta.value:.4f}; "
        "rank 1 = lowest mean Bias."
    )
    return Table("shift", title, "Method", columns, rows)


def certificate_table(results: Results) -> Table | Skipped:
    """Theorem B.2 for every pair of methods, on seed means: with B the mean fixed-delta Bias
    and eps the mean over seeds of each trial's drift budget, |B_A - B_B| > eps_A + eps_B
    certifies that the methods' own induced thresholds cannot reverse their order (the
    seed-mean raw Bias moves by at most the mean budget, by the triangle inequality)."""
    if len(results.variants) < 2:
        return Skipped("certificate", "Theorem B.2 ranking certificate", "needs two methods")
    key = f"bias_{results.primary.key}"
    means = results.per_trial.groupby("variant", sort=False)[[key, "drift", "raw_bias"]].mean()
    rows = []
    for a, b in itertools.combinations(results.variants, 2):
        bias_a, bias_b = means.loc[a, key], means.loc[b, key]
        eps_a, eps_b = means.loc[a, "drift"], means.loc[b, "drift"]
        raw_a, raw_b = means.loc[a, "raw_bias"], means.loc[b, "raw_bias"]
        rows.append(
            {
                "row": f"{a} vs {b}",
                "bias_a": bias_a,
                "bias_b": bias_b,
                "gap": abs(bias_a - bias_b),
                "eps_a": eps_a,
                "eps_b": eps_b,
                "margin": abs(bias_a - bias_b) - (eps_a + eps_b),
                "robust": "yes" if ranking_is_robust(bias_a, bias_b, eps_a, eps_b) else "no",
                "flipped": "yes" if np.sign(bias_a - bias_b) * np.sign(raw_a - raw_b) < 0 else "no",
            }
        )
    columns = [
        Column("bias_a", "Bias A", "$B_A$", None, "number"),
        Column("bias_b", "Bias B", "$B_B$", None, "number"),
        Column("gap", "|B_A − B_B|", r"$|B_A-B_B|$", None, "number"),
        Column("eps_a", "ε_A", r"$\varepsilon_A$", None, "number"),
        Column("eps_b", "ε_B", r"$\varepsilon_B$", None, "number"),
        Column("margin", "Margin", "Margin", None, "number"),
        Column("robust", "Certified robust", "Certified", None, "text"),
        Column("flipped", "Raw order flipped", "Flipped (raw)", None, "text"),
    ]
    title = (
        f"Theorem B.2 ranking certificate at {results.primary.symbol} = "
        f"{results.primary.value:.4f}: B = mean fixed-delta Bias, eps = mean drift budget "
        "sum_ab w_ab |delta_m,ab - delta_ref| (w_ab = 1/#task pairs); certified when the "
        "margin |B_A - B_B| - (eps_A + eps_B) > 0. A flipped raw order is only possible "
        "without the certificate."
    )
    return Table("certificate", title, "Pair (A vs B)", columns, pd.DataFrame(rows))
