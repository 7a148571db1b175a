"""Every method against the ERM trial of the same seed: paired comparisons over seeds.

A method's claim is a claim over training seeds, and seeds vary far more than the audit's
sampled pairs. So each trial is compared with its same-seed ERM trial (the same data set,
architecture and seed: `relif_ray.analysis.audit_scores.erm_partner`, the rule the squash and
Delta-M% use), and the comparison is summarised over the seeds (`relif_ray.analysis.verdicts`):

- Bias and VR at every delta_ref: the ratio to the same-seed ERM trial's, on the log scale;
- Worst and Macro: the difference, with an equivalence test at `VerdictSettings.margin`;
- each native task metric of the main table and Delta-M% (`per_trial`'s `delta_m`): the
  difference (Delta-M% minus ERM's, which is 0 against an ERM base).

`paired_per_seed` gives the per-seed values, `paired_summary` one row per label, metric and
delta (the report's `tables/paired.csv`), `front_shares` how often each method's mean is on the
utility-fairness front when the seeds are resampled. "label" is the report's row name (the
variant: a label, plus its setting or architecture where one label ran at several).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from relif_ray.analysis.audit_scores import erm_partner
from relif_ray.analysis.render import Column, Table, latex_escape
from relif_ray.analysis.results import Results
from relif_ray.analysis.verdicts import (
    Comparison,
    VerdictSettings,
    compare_differences,
    compare_ratios,
)
from relif_ray.sweep.selection import non_dominated

RATIO_METRICS = ("bias", "vr")
"""Compared as ratios to the same-seed ERM trial (log scale)."""
EQUIVALENCE_METRICS = ("worst", "macro")
"""Compared as differences with an equivalence margin ("equal utility")."""
PAIRED_COLUMNS = [
    "label",
    "metric",
    "delta",
    "n_seeds",
    "estimate",
    "ci_low",
    "ci_high",
    "verdict",
    "seeds_needed",
    "scale",
    "std",
    "boot_low",
    "boot_high",
    "per_seed",
]
"""paired.csv's columns: the comparison, then the spread on the analysis scale, the
hierarchical bootstrap interval and the per-seed values ("seed: value; ...")."""
PER_SEED_COLUMNS = [
    "label", "seed", "trial", "erm_trial", "metric", "delta", "value", "erm_value", "paired"
]  # fmt: skip
"""`paired_per_seed`'s columns."""
BOOTSTRAP_SEED = 0
"""Seed of every resampling here (the hierarchical bootstrap, the front shares): the same
report gives the same numbers."""


def compared_metrics(results: Results) -> list[tuple[str, str, str]]:
    """(metric, delta key, `per_trial` column) of every paired comparison, in table order."""
    metrics = []
    for delta in results.deltas:
        metrics += [(name, delta.key, f"{name}_{delta.key}") for name in RATIO_METRICS]
    differences = [*EQUIVALENCE_METRICS, *(native[0] for native in results.native), "delta_m"]
    metrics += [(name, "", name) for name in dict.fromkeys(differences)]
    return [entry for entry in metrics if entry[2] in results.per_trial]


def paired_per_seed(results: Results) -> pd.DataFrame:
    """One row per compared trial (every trial with a same-seed ERM partner other than
    itself), metric and delta: label, seed, trial, erm_trial, metric, delta, value,
    erm_value, paired (value / erm_value for Bias and VR, value - erm_value otherwise)."""
    per_trial = results.per_trial
    partner = erm_partner(results.audit.experiment.trials)
    erm_of = per_trial["trial"].map(partner)
    compared = per_trial[erm_of.notna() & (erm_of != per_trial["trial"])]
    erm_trials = erm_of[compared.index]
    by_trial = per_trial.set_index("trial")
    frames = []
    for metric, delta, column in compared_metrics(results):
        value = compared[column].to_numpy(dtype=np.float64)
        erm_value = by_trial[column].reindex(erm_trials).to_numpy(dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            paired = value / erm_value if metric in RATIO_METRICS else value - erm_value
        frames.append(
            pd.DataFrame(
                {
                    "label": compared["variant"].to_numpy(),
                    "seed": compared["seed"].to_numpy(),
                    "trial": compared["trial"].to_numpy(),
                    "erm_trial": erm_trials.to_numpy(),
                    "metric": metric,
                    "delta": delta,
                    "value": value,
                    "erm_value": erm_value,
                    "paired": paired,
                }
            )
        )
    if not frames:
        return pd.DataFrame(columns=PER_SEED_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def paired_summary(results: Results, settings: VerdictSettings | None = None) -> pd.DataFrame:
    """One row per label, metric and delta (`PAIRED_COLUMNS`): n_seeds, the estimate (the
    geometric mean ratio for Bias and VR, else the mean difference), the Student-t interval
    over seeds, the verdict in words and, where it is "not shown", the seeds needed
    (`relif_ray.analysis.verdicts`); boot_low/boot_high: the hierarchical bootstrap interval of Bias
    and VR ratios (`hierarchical_intervals`)."""
    settings = settings or VerdictSettings()
    per_seed = paired_per_seed(results)
    rows = []
    for label in dict.fromkeys(per_seed["label"]):
        of_label = per_seed[per_seed["label"] == label]
        boot = hierarchical_intervals(results, of_label, settings)
        for metric, delta, _ in compared_metrics(results):
            chosen = of_label[(of_label["metric"] == metric) & (of_label["delta"] == delta)]
            chosen = chosen.sort_values("seed")
            comparison = _compare(metric, chosen["paired"].to_numpy(), settings)
            interval = boot.get((metric, delta), (math.nan, math.nan))
            rows.append(_row(label, metric, delta, comparison, interval, chosen))
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)


def _compare(metric: str, paired: np.ndarray, settings: VerdictSettings) -> Comparison:
    if metric in RATIO_METRICS:
        return compare_ratios(paired, settings)
    margin = settings.margin if metric in EQUIVALENCE_METRICS else None
    return compare_differences(paired, settings, margin)


def _row(
    label: str,
    metric: str,
    delta: str,
    comparison: Comparison,
    boot: tuple[float, float],
    chosen: pd.DataFrame,
) -> dict:
    pairs = zip(chosen["seed"], chosen["paired"], strict=True)
    return {
        "label": label,
        "metric": metric,
        "delta": delta,
        "n_seeds": comparison.n,
        "estimate": comparison.estimate,
        "ci_low": comparison.ci_low,
        "ci_high": comparison.ci_high,
        "verdict": comparison.verdict,
        "seeds_needed": comparison.seeds_needed,
        "scale": "log ratio" if metric in RATIO_METRICS else "difference",
        "std": comparison.std,
        "boot_low": boot[0],
        "boot_high": boot[1],
        "per_seed": "; ".join(f"{seed}: {value:.4g}" for seed, value in pairs),
    }


def hierarchical_intervals(
    results: Results, of_label: pd.DataFrame, settings: VerdictSettings
) -> dict[tuple[str, str], tuple[float, float]]:
    """(metric, delta key) -> percentile interval of the geometric mean Bias (or VR) ratio of
    one label under a two-stage bootstrap: resample the seeds with replacement, then, within
    each drawn seed, the audit's S sampled pairs of every task pair (the same draws for the
    method's and the ERM trial's gaps: pools and pairs depend only on the data, so pair k is
    the same example pair in both). Each draw of a seed takes an independent within-seed
    replicate; replicates that are not finite (an ERM Bias of 0) are left out. Empty below
    `settings.min_boot_seeds` seeds or with `n_boot` 0: with few seeds the seed stage takes
    only a handful of distinct values, and the verdict uses the t interval
    (`relif_ray.analysis.verdicts`)."""
    pairs = of_label[["trial", "erm_trial"]].drop_duplicates()
    n = len(pairs)
    if settings.n_boot == 0 or n < max(settings.min_boot_seeds, 2):
        return {}
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    gaps = results.audit.gaps(results.split)
    thresholds = {delta.key: delta.value for delta in results.deltas}
    within = [
        _pair_bootstrap(gaps[trial].gaps, gaps[erm].gaps, thresholds, settings.n_boot, rng)
        for trial, erm in pairs.itertuples(index=False)
    ]
    seeds = rng.integers(0, n, size=(settings.n_boot, n))
    replicate = rng.integers(0, settings.n_boot, size=(settings.n_boot, n))
    tail = (1 - settings.level) / 2
    intervals = {}
    for key in within[0]:
        logs = np.column_stack([seed[key] for seed in within])[replicate, seeds].mean(axis=1)
        low, high = np.quantile(logs[np.isfinite(logs)], [tail, 1 - tail])
        intervals[key] = (math.exp(low), math.exp(high))
    return intervals


def _pair_bootstrap(
    method: dict[str, np.ndarray],
    erm: dict[str, np.ndarray],
    thresholds: dict[str, float],
    n_boot: int,
    rng: np.random.Generator,
) -> dict[tuple[str, str], np.ndarray]:
    """(metric, delta key) -> n_boot replicates of log(method's / ERM's) Bias or VR (the mean
    over task pairs) with the audit's pairs of every task pair resampled."""
    sums: dict[tuple[str, str], list[np.ndarray]] = {
        (metric, key): [np.zeros(n_boot), np.zeros(n_boot)]
        for metric in RATIO_METRICS
        for key in thresholds
    }
    for pair, values in method.items():
        reference = erm[pair]
        draws = rng.integers(0, values.size, size=(n_boot, values.size))
        if reference.size != values.size:
            other = rng.integers(0, reference.size, size=(n_boot, reference.size))
        else:
            other = draws
        for side, resampled in enumerate((values[draws], reference[other])):
            for key, delta in thresholds.items():
                sums["bias", key][side] += np.maximum(resampled - delta, 0.0).mean(axis=1)
                sums["vr", key][side] += (resampled > delta).mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {key: np.log(ours / theirs) for key, (ours, theirs) in sums.items()}


def front_shares(results: Results, settings: VerdictSettings | None = None) -> pd.Series:
    """Per variant, the share of seed-bootstrap resamples in which its mean (Bias at the
    primary delta_ref, Worst) is on the front of the method means (`non_dominated`). The
    seeds are resampled together for every method (paired by seed: one draw of n seeds from
    the experiment's seeds, each method's mean over the drawn seeds it has, with their
    multiplicity); a method without any drawn seed is off the front in that resample. NaN
    for every method with `n_boot` 0."""
    settings = settings or VerdictSettings()
    key = f"bias_{results.primary.key}"
    per_trial = results.per_trial
    bias = per_trial.pivot_table(index="seed", columns="variant", values=key, aggfunc="mean")
    worst = per_trial.pivot_table(index="seed", columns="variant", values="worst", aggfunc="mean")
    bias, worst = bias.reindex(columns=results.variants), worst.reindex(columns=results.variants)
    if settings.n_boot == 0:
        return pd.Series(math.nan, index=results.variants, name="front_share")
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    n = len(bias)
    weights = np.stack(
        [np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(settings.n_boot)]
    ).astype(np.float64)
    on_front = np.zeros(len(results.variants))
    for replicate in weights:
        on_front += non_dominated(
            _weighted_means(bias, replicate), _weighted_means(worst, replicate)
        )
    return pd.Series(on_front / settings.n_boot, index=results.variants, name="front_share")


def _weighted_means(values: pd.DataFrame, weights: np.ndarray) -> np.ndarray:
    """Each column's mean over its finite rows, weighted by `weights` (NaN where no weight)."""
    finite = np.isfinite(values.to_numpy())
    filled = np.where(finite, values.to_numpy(), 0.0)
    total = weights @ finite
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, (weights @ filled) / total, np.nan)


def paired_table(summary: pd.DataFrame, results: Results, settings: VerdictSettings) -> Table:
    """`paired_summary` as the report's `paired` table (CSV columns `PAIRED_COLUMNS`)."""
    columns = [
        Column("metric", "Metric", "Metric", kind="text"),
        Column("delta", "δ_ref", r"$\delta_{\mathrm{ref}}$", kind="text"),
        Column("n_seeds", "Seeds", "Seeds", kind="number", digits=0),
        Column("estimate", "Estimate", "Estimate", kind="number"),
        Column("ci_low", "CI low", "CI low", kind="number"),
        Column("ci_high", "CI high", "CI high", kind="number"),
        Column("verdict", "Verdict", "Verdict", kind="text"),
        Column("seeds_needed", "Seeds needed", "Seeds needed", kind="number", digits=0),
    ]
    deltas = "; ".join(f"{d.key}: {d.symbol} = {d.value:.4f}" for d in results.deltas)
    title = (
        f"Every label against the ERM trial of the same seed ({results.split} split), over "
        f"seeds. bias and vr at each δ_ref ({deltas}): the ratio to ERM's, estimate = the "
        f"geometric mean ratio, {settings.level:.0%} Student-t interval of the mean log ratio "
        "over seeds; worst, macro, task metrics and delta_m (Δm%): the difference from ERM's, "
        f"{settings.level:.0%} t interval of the mean difference, and for worst and macro two "
        f"one-sided tests of equivalence within ±{settings.margin:g}. Seeds needed: where not "
        f"shown, the seeds at which the observed paired effect would be shown with "
        f"{settings.power:.0%} power at the same level. The CSV adds the spread (std, on the "
        "log scale for ratios), a hierarchical bootstrap interval (seeds, then the audit's "
        f"pairs; with at least {settings.min_boot_seeds} seeds) and the per-seed values."
    )
    rows = summary.rename(columns={"label": "row"})
    return Table("paired", title, "label", columns, rows)


def reference_variants(results: Results) -> set[str]:
    """The variants whose every trial is its own same-seed ERM reference (plain ERM)."""
    partner = erm_partner(results.audit.experiment.trials)
    per_trial = results.per_trial
    own = per_trial["trial"].map(partner) == per_trial["trial"]
    return set(per_trial["variant"]) - set(per_trial.loc[~own, "variant"])


def verdict_text(summary: pd.DataFrame, label: str, metric: str, delta: str = "") -> str:
    """The verdict of one comparison of `paired_summary`; "–" where the label has no
    same-seed ERM trial to be compared with."""
    chosen = summary[
        (summary["label"] == label) & (summary["metric"] == metric) & (summary["delta"] == delta)
    ]
    return str(chosen["verdict"].iloc[0]) if len(chosen) else "–"


def erm_verdicts(
    results: Results, paired: pd.DataFrame, variants: list[str]
) -> dict[str, list[str]]:
    """Per variant, its verdicts over seeds against the same-seed ERM trial (`paired`:
    `paired_summary`) of Bias at the primary delta_ref ("bias") and of Worst ("worst");
    "reference" for plain ERM."""
    references = reference_variants(results)
    return {
        metric: [
            "reference" if variant in references else verdict_text(paired, variant, metric, delta)
            for variant in variants
        ]
        for metric, delta in (("bias", results.primary.key), ("worst", ""))
    }


def add_verdict_columns(
    rows: pd.DataFrame, columns: list[Column], results: Results, paired: pd.DataFrame
) -> None:
    """The main table's verdict columns (`rows`: one row per variant in `row`): `erm_verdicts`
    of Bias at the primary delta_ref and of Worst."""
    verdicts = erm_verdicts(results, paired, list(rows["row"]))
    primary = results.primary
    for metric, header in (("bias", f"Bias@{primary.symbol} vs ERM"), ("worst", "Worst vs ERM")):
        rows[f"{metric}_verdict"] = verdicts[metric]
        latex = latex_escape(header).replace(latex_escape(primary.symbol), f"${primary.latex}$")
        columns.append(Column(f"{metric}_verdict", header, latex, kind="text"))
