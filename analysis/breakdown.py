"""Fixed-delta Bias and VR broken down by task pair, the way Fairlearn's
`MetricFrame.by_group` breaks a metric down by sensitive group: here the groups are the
unordered task pairs (a, b) whose cross-task gaps |p_a(x) - p_b(y)| the audit compares
(paper Algorithm 1), and the aggregate Bias is the mean over pairs (weights 1/#pairs).
"""

from __future__ import annotations

import pandas as pd

from relif_ray.analysis.results import Results

OVERALL = "overall"
"""Row of `by_pair` holding the aggregate over task pairs (MetricFrame's `overall`)."""


def pair_audits(results: Results, delta: float | None = None) -> pd.DataFrame:
    """One row per (trial, task pair) on the report split at `delta` (default: the primary
    delta_ref): trial, variant, seed, pair ("a|b"), bias, vr, n (sampled pairs)."""
    value = results.primary.value if delta is None else float(delta)
    trials = results.per_trial.set_index("trial")
    rows = [
        (trial, trials.loc[trial, "variant"], trials.loc[trial, "seed"], key, p.bias, p.vr, p.n)
        for trial, gaps in results.audit.gaps(results.split).items()
        for key, p in gaps.audit(value).pairs.items()
    ]
    return pd.DataFrame(rows, columns=["trial", "variant", "seed", "pair", "bias", "vr", "n"])


def by_pair(results: Results, metric: str = "bias", delta: float | None = None) -> pd.DataFrame:
    """`metric` ("bias" or "vr") per task pair (rows) and method variant (columns), the mean
    over seeds; the last row, `overall`, is the mean over task pairs, i.e. the aggregate the
    main table reports. As with `MetricFrame.by_group`, `.max() - .min()` over the pair rows
    is the largest between-group difference."""
    audits = pair_audits(results, delta)
    table = audits.pivot_table(index="pair", columns="variant", values=metric, aggfunc="mean")
    table = table[results.variants]
    per_trial = audits.groupby(["variant", "trial"], sort=False)[metric].mean()
    table.loc[OVERALL] = per_trial.groupby(level="variant").mean()[results.variants]
    table.columns.name, table.index.name = "variant", "task pair"
    return table
