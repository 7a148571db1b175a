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
    NO_SPREAD,
    Comparison,
    VerdictSettings,
    compare_differences,
    compare_ratios,
    equivalence_level,
    zero_ratio,
)
from relif_ray.audit_bootstrap import resample_counts
from relif_ray.errors import UserError
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
    "tost_low",
    "tost_high",
    "note",
    "p",
]
"""`paired_summary`'s columns: the comparison, then the spread on the analysis scale, the
hierarchical bootstrap interval, the per-seed values ("seed: value; ..."), the (2 level - 1)
interval the equivalence test of Worst and Macro reads (90% at level 95%), a note naming the
seeds left out (an ERM value of 0 for a ratio) or the trials of values that did not vary, and
the p-value of the verdict's test (`Comparison.p`). paired.csv adds the family's
`relif_ray.analysis.family.FAMILY_COLUMNS`."""
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
    and VR ratios (`hierarchical_intervals`); tost_low/tost_high: the equivalence test's
    interval of Worst and Macro; note: the seeds a ratio leaves out because the ERM trial's
    value is 0, or the trials of paired values that did not vary; p: the p-value of the
    verdict's test (`relif_ray.analysis.family` adjusts it over a report's family)."""
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


def _note(metric: str, comparison: Comparison, chosen: pd.DataFrame) -> str:
    """Seeds a ratio leaves out (the ERM trial's value is 0: no ratio to take), by seed and
    trial, and the trials of paired values that did not vary; empty otherwise."""
    parts = []
    if metric in RATIO_METRICS:
        zero = chosen[chosen["erm_value"] == 0]
        parts += [
            f"seed {row.seed} left out: ERM's {metric} is 0 ({row.erm_trial})"
            for row in zero.itertuples()
        ]
    if comparison.verdict.startswith(NO_SPREAD):
        kept = chosen[chosen["erm_value"] != 0] if metric in RATIO_METRICS else chosen
        kept = kept[kept["paired"].notna()]
        parts.append(
            f"the seeds did not vary: trials {', '.join(map(str, kept['trial']))} against "
            f"ERM trials {', '.join(map(str, kept['erm_trial']))}"
        )
    return "; ".join(parts)


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
        "tost_low": comparison.tost_low,
        "tost_high": comparison.tost_high,
        "note": _note(metric, comparison, chosen),
        "p": comparison.p,
    }


def hierarchical_intervals(
    results: Results, of_label: pd.DataFrame, settings: VerdictSettings
) -> dict[tuple[str, str], tuple[float, float]]:
    """(metric, delta key) -> interval of the geometric mean Bias (or VR) ratio of one label
    from a two-stage bootstrap-t (`seed_bootstrap_t`): the seeds are resampled, and each drawn
    seed takes a replicate of its log ratio with the audit's S sampled pairs of every task
    pair resampled (the same draws for the method's and the ERM trial's gaps: pools and pairs
    depend only on the data, so pair k is the same example pair in both), on the log scale
    as the verdict takes the ratios (`log_scale`): seeds whose ERM value is 0 are left out.
    Empty below `settings.min_boot_seeds` seeds or with `n_boot` 0: with few seeds the seed
    stage takes only a handful of distinct values, and the verdict uses the t interval
    (`relif_ray.analysis.verdicts`)."""
    pairs = of_label[["trial", "erm_trial"]].drop_duplicates()
    n = len(pairs)
    if settings.n_boot == 0 or n < max(settings.min_boot_seeds, 2):
        return {}
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    gaps = results.audit.gaps(results.split)
    thresholds = {delta.key: delta.value for delta in results.deltas}
    within = [
        pair_bootstrap(gaps[trial].gaps, gaps[erm].gaps, thresholds, settings.n_boot, rng)
        for trial, erm in pairs.itertuples(index=False)
    ]
    intervals = {}
    for key in within[0]:
        observed = np.array([seed[key][0] for seed in within])
        replicates = np.stack([seed[key][1] for seed in within])
        logs, resampled = log_scale(observed, replicates, settings.ratio_floor)
        low, high = seed_bootstrap_t(logs, resampled, settings.level, rng)
        intervals[key] = (math.exp(low), math.exp(high))
    return intervals


def log_scale(
    observed: np.ndarray, replicates: np.ndarray, floor: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed ratios (n) and their replicates (n x B) on the log scale, as the verdict takes
    them: a ratio of 0 at `zero_ratio`, an observed ratio that is not finite (an ERM value of
    0) left not finite; a replicate's ratio held within [that value, its inverse], 0 / 0 (both
    resampled values 0) as 1."""
    zero = zero_ratio(observed, floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(np.where(observed == 0, zero, observed))
        resampled = np.nan_to_num(np.log(np.clip(replicates, zero, 1 / zero)), nan=0.0)
    return logs, resampled


def seed_bootstrap_t(
    observed: np.ndarray, replicates: np.ndarray, level: float, rng: np.random.Generator
) -> tuple[float, float]:
    """Bootstrap-t interval (Efron and Tibshirani 1993, ch. 12) of the mean over seeds of
    `observed` (one value per seed, on the log scale) at `level`. `replicates` (seeds x B):
    each seed's within-seed bootstrap replicates of its value, centred here on it (the
    resampling's own lean is not the seed's). B times: draw n seeds with replacement, take
    one replicate of each, and studentize the mean by that resample's own standard error,
    t* = (mean* - mean) / se*; the interval is mean - t*_{high} se, mean - t*_{low} se. The
    studentization makes the pair noise, counted once in each seed's value and once more by
    its replicate, cancel, and stretches the interval as the t interval does where the seeds
    are few, which a percentile interval does not. Seeds whose value is not finite are left
    out; NaN with fewer than two left."""
    finite = np.isfinite(observed)
    observed, replicates = observed[finite], replicates[finite]
    n, n_boot = replicates.shape
    if n < 2:
        return math.nan, math.nan
    centred = replicates - replicates.mean(axis=1, keepdims=True) + observed[:, None]
    seeds = rng.integers(0, n, size=(n_boot, n))
    drawn = centred[seeds, rng.integers(0, n_boot, size=(n_boot, n))]
    mean = float(observed.mean())
    error = float(observed.std(ddof=1)) / math.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        studentized = (drawn.mean(axis=1) - mean) / (drawn.std(axis=1, ddof=1) / math.sqrt(n))
    studentized = np.nan_to_num(studentized, nan=0.0)  # 0 / 0: a resample of one seed's value
    tail = (1 - level) / 2
    t_low, t_high = np.quantile(studentized, [tail, 1 - tail])
    return mean - t_high * error, mean - t_low * error


def pair_bootstrap(
    method: dict[str, np.ndarray],
    erm: dict[str, np.ndarray],
    thresholds: dict[str, float],
    n_boot: int,
    rng: np.random.Generator,
) -> dict[tuple[str, str], tuple[float, np.ndarray]]:
    """(metric, delta key) -> method's / ERM's Bias or VR (the mean over task pairs) with the
    audit's pairs, and its `n_boot` replicates with the pairs of every task pair resampled
    (not finite where the ERM value is 0)."""
    sums: dict[tuple[str, str], list[np.ndarray]] = {
        (metric, key): [np.zeros(n_boot + 1), np.zeros(n_boot + 1)]
        for metric in RATIO_METRICS
        for key in thresholds
    }
    order = [(metric, key) for metric in RATIO_METRICS for key in thresholds]
    for pair, values in method.items():
        reference = erm[pair]
        counts = resample_counts(rng, values.size, n_boot)
        other = counts if reference.size == values.size else None
        if other is None:
            other = resample_counts(rng, reference.size, n_boot)
        for side, (data, weights) in enumerate(((values, counts), (reference, other))):
            columns = np.stack(
                [_statistic(data, metric, thresholds[key]) for metric, key in order], 1
            )
            resampled = weights @ columns / data.size  # each resample's mean, per column
            for j, item in enumerate(order):
                sums[item][side] += np.concatenate([[columns[:, j].mean()], resampled[:, j]])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = {key: ours / theirs for key, (ours, theirs) in sums.items()}
    return {key: (float(ratio[0]), ratio[1:]) for key, ratio in ratios.items()}


def _statistic(gaps: np.ndarray, metric: str, delta: float) -> np.ndarray:
    """Per pair: the hinge (gap - delta)+ of Bias, or the violation 1[gap > delta] of VR."""
    return np.maximum(gaps - delta, 0.0) if metric == "bias" else (gaps > delta).astype(float)


def front_shares(results: Results, settings: VerdictSettings | None = None) -> pd.Series:
    """Per variant, the share of seed-bootstrap resamples in which its mean (Bias at the
    primary delta_ref, Worst) is on the front of the method means (`non_dominated`). The
    seeds are resampled together for every method (paired by seed: one draw of n seeds from
    the experiment's seeds, each method's mean over the drawn seeds it has, with their
    multiplicity); both of a method's means are over the same seeds, those where it has both
    a Bias and a Worst; a method without any such drawn seed is off the front in that
    resample. NaN for every method with `n_boot` 0. Two trials of one method at one seed are
    an error (UserError): their seed would count twice."""
    settings = settings or VerdictSettings()
    key = f"bias_{results.primary.key}"
    per_trial = results.per_trial
    _refuse_duplicate_seeds(per_trial)
    wide = per_trial.pivot(index="seed", columns="variant", values=[key, "worst"])
    bias = wide[key].reindex(columns=results.variants).to_numpy(dtype=np.float64)
    worst = wide["worst"].reindex(columns=results.variants).to_numpy(dtype=np.float64)
    if settings.n_boot == 0:
        return pd.Series(math.nan, index=results.variants, name="front_share")
    both = np.isfinite(bias) & np.isfinite(worst)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    n = len(wide)
    weights = np.stack(
        [np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(settings.n_boot)]
    ).astype(np.float64)
    on_front = np.zeros(len(results.variants))
    for replicate in weights:
        on_front += non_dominated(
            _weighted_means(bias, both, replicate), _weighted_means(worst, both, replicate)
        )
    return pd.Series(on_front / settings.n_boot, index=results.variants, name="front_share")


def _refuse_duplicate_seeds(per_trial: pd.DataFrame) -> None:
    """One line naming the first method with two trials of one seed."""
    duplicated = per_trial[per_trial.duplicated(["variant", "seed"], keep=False)]
    if duplicated.empty:
        return
    variant, seed = duplicated.iloc[0][["variant", "seed"]]
    chosen = duplicated[(duplicated["variant"] == variant) & (duplicated["seed"] == seed)]
    raise UserError(
        f"front shares: {variant} has {len(chosen)} trials of seed {seed} "
        f"({', '.join(map(str, chosen['trial']))}); a method needs one trial per seed"
    )


def _weighted_means(values: np.ndarray, kept: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Each column's mean over its `kept` rows, weighted by `weights` (NaN where no weight)."""
    filled = np.where(kept, values, 0.0)
    total = weights @ kept
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, (weights @ filled) / total, np.nan)


def paired_table(summary: pd.DataFrame, results: Results, settings: VerdictSettings) -> Table:
    """`paired_summary` as the report's `paired` table (CSV columns: `PAIRED_COLUMNS`, then
    the family's p_adjusted and family_size where `summary` has them)."""
    inner = equivalence_level(settings.level)
    columns = [
        Column("metric", "Metric", "Metric", kind="text"),
        Column("delta", "δ_ref", r"$\delta_{\mathrm{ref}}$", kind="text"),
        Column("n_seeds", "Seeds", "Seeds", kind="number", digits=0),
        Column("estimate", "Estimate", "Estimate", kind="number"),
        Column("ci_low", "CI low", "CI low", kind="number", null=null_value),
        Column("ci_high", "CI high", "CI high", kind="number", null=null_value),
        Column(
            "tost_low",
            f"{inner:.0%} low",
            latex_escape(f"{inner:.0%} low"),
            kind="number",
            null=null_value,
        ),
        Column(
            "tost_high",
            f"{inner:.0%} high",
            latex_escape(f"{inner:.0%} high"),
            kind="number",
            null=null_value,
        ),
        Column("verdict", "Verdict", "Verdict", kind="text"),
        Column("seeds_needed", "Seeds needed", "Seeds needed", kind="number", digits=0),
    ]
    deltas = "; ".join(f"{d.key}: {d.symbol} = {d.value:.4f}" for d in results.deltas)
    title = (
        f"Every label against the ERM trial of the same seed ({results.split} split), over "
        f"seeds. bias and vr at each δ_ref ({deltas}): the ratio to ERM's, estimate = the "
        f"geometric mean ratio, {settings.level:.0%} Student-t interval of the mean log ratio "
        "over seeds; worst, macro, task metrics and delta_m (Δm%): the difference from ERM's, "
        f"{settings.level:.0%} t interval of the mean difference (CI), and for worst and macro "
        f"two one-sided tests of equivalence within ±{settings.margin:g} at "
        f"{1 - settings.level:.0%} each, which read the narrower {inner:.0%} t interval "
        f'({inner:.0%} low/high): "within" where it lies inside ±{settings.margin:g}. '
        f"A per-seed ratio of 0 (the method's Bias is 0) counts as {settings.ratio_floor:g}, "
        "or as the smallest positive ratio where lower; values that do not vary at all give "
        "no verdict. Seeds needed, a planning estimate at the observed effect (post hoc, not "
        "evidence): where not shown, the seeds, more than those used, at which a test at the "
        f"same level would have {settings.power:.0%} power against an effect of the observed "
        "size. The CSV adds the spread "
        "(std, on the log scale for ratios), a hierarchical bootstrap-t interval (seeds, then "
        f"the audit's pairs; with at least {settings.min_boot_seeds} seeds), the per-seed "
        "values, a note naming seeds left out (an ERM value of 0) or trials that did not vary, "
        "the p-value of each verdict's test (p) and, for the Summary's comparisons, its "
        "adjusted p-value over the report's family (p_adjusted, family_size)."
    )
    rows = summary.rename(columns={"label": "row"})
    return Table("paired", title, "label", columns, rows)


def null_value(row: pd.Series) -> float:
    """The value a paired row's interval is read against: 1 for a ratio, 0 for a difference."""
    return 1.0 if row["scale"] == "log ratio" else 0.0


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
