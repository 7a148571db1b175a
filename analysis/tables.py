"""The paper's tables from `Results` (mean +- sample std over seeds per method variant).

Each builder returns a `Table`, or a `Skipped` note when the experiment has no data for it
(e.g. no ReLiF variants): tables are skipped with a note, never an error.

- main: Worst, Macro, native metrics, Bias at every delta_ref (paper Table 1 / Table 4)
- violation: VR at every delta_ref (Table 10)
- drift: mean validation-induced threshold per method, difference and ratio to a chosen
  method (Table 3) - a diagnostic only
- shift: raw (own induced thresholds) versus fixed-delta Bias and the ranks (Table 4, Shift;
  `rank_shift`, also drawn by `relif_ray.analysis.figures.rank_shift_figure`)
- certificate: Theorem B.2 for every pair of methods
- ablation: ReLiF component variants (Table 5); a static-lambda label is one row over its
  lambda0 grid, as in the paper
- sensitivity: Bias over a list of deltas (Table 9)
- utility: every utility metric of the report split
- controller: per variant with a controller setting (r*, eta; or a static lambda0): Worst,
  Macro, Bias, share of steps at a lambda bound (B.3)
Bias columns carry bootstrap intervals (`Results.bias_ci`) where `n_boot` > 0.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.mtl_metrics import delta_m_note
from relif_ray.analysis.paired import add_verdict_columns
from relif_ray.analysis.render import (
    Column,
    Table,
    display_text,
    latex_escape,
    metric_digits,
    metric_header,
    summarize,
)
from relif_ray.analysis.results import SATURATION_FLAG, Results, direction, sensitivity_key
from relif_ray.audit_thresholds import ranking_is_robust
from relif_ray.problems import benchmark
from relif_ray.sweep.labels import SETTING_FIELDS


@dataclass(frozen=True)
class Skipped:
    """A table that does not apply to this experiment, and why."""

    name: str
    title: str
    reason: str


@dataclass(frozen=True)
class CISettings:
    """Bootstrap intervals for Bias columns: n_boot replicates (0 = none) at `level`."""

    n_boot: int = 1000
    level: float = 0.95


def bias_column(key: str, symbol: str, latex: str) -> Column:
    return Column(key, f"Bias@{symbol}", f"Bias@${latex}$", "lower")


def main_table(results: Results, ci: CISettings, paired: pd.DataFrame | None = None) -> Table:
    """Utility, native metrics and Bias at every delta_ref per method; with `paired`
    (`relif_ray.analysis.paired.paired_summary`), each method's verdicts over seeds against
    same-seed ERM: Bias at the primary delta_ref and Worst."""
    columns = [
        Column("worst", "Worst", "Worst", "higher"),
        Column("macro", "Macro", "Macro", "higher"),
        *(
            Column(metric, header, latex, better, digits=metric_digits(metric))
            for metric, header, latex, better in results.native
        ),
        *(bias_column(f"bias_{d.key}", d.symbol, d.latex) for d in results.deltas),
    ]
    rows = _stats(results, [c.key for c in columns])
    for delta in results.deltas:
        _add_ci(rows, results, f"bias_{delta.key}", delta.value, ci)
    deltas = "; ".join(f"{d.symbol} = {d.value:.4f}" for d in results.deltas)
    title = (
        f"Utility and fixed-delta Bias ({results.split} split), mean ± sample std over seeds; "
        f"Bias under thresholds chosen once and held fixed for all methods ({deltas}), "
        f"pair_seed={results.audit.settings.pair_seed}."
    )
    if paired is not None:
        add_verdict_columns(rows, columns, results, paired)
        title += (
            " Verdicts: against the same-seed ERM trial over seeds (paired.csv: the "
            "Student-t interval of the mean log Bias ratio, and the equivalence test of Worst)."
        )
    if "saturation_excess" in results.per_trial:
        columns.append(Column("saturated", "Saturated", "Saturated", kind="text"))
        rows["saturated"] = [_saturation_flag(results, variant) for variant in rows["row"]]
        title += (
            f" Saturated: on a squashed task, the method's share of audit scores clipped at 0 "
            f"or 1 exceeds its same-seed ERM trial's by more than {SATURATION_FLAG:g} (mean "
            "over seeds), so its gaps may shrink because the audit clips its scores; whether "
            "its cut survives wider audit interfaces: the Audit-interface sensitivity table."
        )
    return Table("main", title, "Method", columns, rows)


def _saturation_flag(results: Results, variant: str) -> str:
    per_trial = results.per_trial
    excess = per_trial.loc[per_trial["variant"] == variant, "saturation_excess"].mean()
    return f"yes (+{excess:.2f})" if excess > SATURATION_FLAG else ""


def saturation_table(results: Results) -> Table | Skipped:
    """Per method and squashed task, the share of audit scores the squash clipped at 0 and at
    1 on the report split (mean ± std over seeds); same-seed ERM's is the yardstick."""
    keys = [c for c in results.per_trial.columns if c.startswith(("clip0_", "clip1_"))]
    if not keys:
        return Skipped("saturation", "Audit-score saturation", "no task's scores are squashed")
    keys.sort(key=lambda key: (key.split("_", 1)[1], key))
    columns = [
        Column(key, _clip_header(key), latex_escape(_clip_header(key)), digits=3) for key in keys
    ]
    title = (
        f"Share of audit scores clipped by the squash ({results.split} split): at 0 (below "
        "the same-seed ERM validation q10) and at 1 (above its q90), mean ± sample std over "
        "seeds. ERM's is about 0.1 each side by construction on its validation split."
    )
    return Table("saturation", title, "Method", columns, _stats(results, keys))


def _clip_header(key: str) -> str:
    bound, task = key.split("_", 1)
    return f"{task} at {'0' if bound == 'clip0' else '1'}"


def violation_table(results: Results) -> Table:
    columns = [
        Column(f"vr_{d.key}", f"VR@{d.symbol}", f"VR@${d.latex}$", "lower", digits=3)
        for d in results.deltas
    ]
    title = (
        f"Fixed-threshold violation rates ({results.split} split) under the same audit as the "
        "main table, mean ± sample std over seeds."
    )
    return Table("violation", title, "Method", columns, _stats(results, [c.key for c in columns]))


def drift_table(results: Results, baseline: str) -> Table:
    """Mean validation-induced threshold per method; difference and ratio of the means to
    the `baseline` method's mean (Table 3 layout)."""
    rows = _stats(results, ["induced_mean"])
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
    rows = _stats(results, ["raw_bias", fixed_key])
    rows["raw_rank"] = rows["raw_bias_mean"].rank(method="min").astype(int)
    rows["fixed_rank"] = rows[f"{fixed_key}_mean"].rank(method="min").astype(int)
    return rows


def shift_table(results: Results, ci: CISettings) -> Table:
    """Bias at each method's own induced thresholds ("raw") versus at delta_ref, with the
    method ranks of `rank_shift`."""
    delta = results.primary
    fixed_key = f"bias_{delta.key}"
    rows = rank_shift(results)
    _add_ci(rows, results, "raw_bias", None, ci)
    _add_ci(rows, results, fixed_key, delta.value, ci)
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


ABLATION_FIELDS = (
    ("quantile_alignment", "Alignment", {True: "on", False: "off"}),
    ("controller", "Controller", {"adaptive": "adaptive", "static": "static"}),
    ("lipschitz_branch", "Lip branch", {True: "on", False: "off"}),
)
"""ReLiF component switches of the ablation table (docs/relif.md, Ablations)."""
FULL_RELIF = {"quantile_alignment": True, "controller": "adaptive", "lipschitz_branch": True}


def ablation_table(results: Results, experiment: Experiment, ci: CISettings) -> Table | Skipped:
    """ERM + ReLiF variants: the full configuration and every ablated one, one row per variant,
    except that a static-lambda label is ONE row over every lambda0 it ran at: the paper's
    ablation row "aggregated over 5 penalty values and 7 runs" (section 5, Table 4). The
    controller table keeps each lambda0 apart."""
    trials = experiment.trials
    relif = trials[trials["relif"].astype(bool) & (trials["method"] == "erm")]
    rows_of = _ablation_rows(relif)
    per_trial = results.per_trial[results.per_trial["trial"].isin(rows_of)]
    per_trial = per_trial.assign(ablation_row=per_trial["trial"].map(rows_of))
    groups = {row: group for row, group in relif.groupby(relif["trial"].map(rows_of), sort=False)}
    components = {
        row: {name: _setting(group, name) for name, _, _ in ABLATION_FIELDS}
        for row, group in groups.items()
    }
    if not any(c != FULL_RELIF for c in components.values()):
        return Skipped(
            "ablation",
            "ReLiF component ablation",
            "no ReLiF variant with a component switched off "
            "(relif.quantile_alignment / controller / lipschitz_branch)",
        )
    key = f"bias_{results.primary.key}"
    rows = summarize(per_trial, "ablation_row", ["worst", "macro", key], list(components))
    rows = rows.rename(columns={"ablation_row": "row"})
    for name, _, words in ABLATION_FIELDS:
        rows[name] = [words.get(components[v][name], "mixed") for v in rows["row"]]
    trials_of = {row: list(group["trial"]) for row, group in groups.items()}
    _add_ci(rows, results, key, results.primary.value, ci, trials_of)
    columns = [
        *(Column(name, header, header, None, "text") for name, header, _ in ABLATION_FIELDS),
        Column("worst", "Worst", "Worst", "higher"),
        Column("macro", "Macro", "Macro", "higher"),
        bias_column(key, results.primary.symbol, results.primary.latex),
    ]
    title = (
        f"ReLiF component ablation under the same fixed-delta audit ({results.split} split), "
        "mean ± std over seeds."
    )
    for row, group in groups.items():
        lambdas = sorted(set(group["lambda0"].dropna()))
        if len(lambdas) > 1:
            title += (
                f" {display_text(row)}: mean ± std over all {len(group)} trials of its "
                f"λ0 grid ({', '.join(f'{value:g}' for value in lambdas)}) and seeds, as the "
                "paper's static-λ row aggregates over its penalty values and runs (each λ0 "
                "alone: controller table)."
            )
    return Table("ablation", title, "Variant", columns, rows)


def _ablation_rows(relif: pd.DataFrame) -> dict[str, str]:
    """Trial -> its row of the ablation table: its variant, or for static lambda (a lambda0
    identifies its setting) its label, so that the lambda0 grid is one row."""
    static = relif["lambda0"].notna()
    return dict(zip(relif["trial"], relif["label"].where(static, relif["variant"]), strict=True))


def sensitivity_table(results: Results, ci: CISettings) -> Table:
    keys = [sensitivity_key(delta) for delta in results.sensitivity]
    rows = _stats(results, keys)
    for delta, key in zip(results.sensitivity, keys, strict=True):
        _add_ci(rows, results, key, delta, ci)
    columns = [
        Column(key, f"{delta:g}", f"${delta:g}$", "lower", digits=3)
        for delta, key in zip(results.sensitivity, keys, strict=True)
    ]
    title = (
        f"Fixed-delta sensitivity: Bias at each delta (columns), {results.split} split, "
        "mean ± std over seeds."
    )
    return Table("delta_sensitivity", title, "Method", columns, rows)


def controller_table(results: Results, experiment: Experiment, ci: CISettings) -> Table | Skipped:
    """ReLiF variants whose lambda a controller setting decides (`relif_ray.sweep.labels.
    identifying_settings`): the adaptive controller's (r*, eta) and the static controller's
    lambda0. One row per variant (a label at one setting), so each static lambda0 of a
    controller-sensitivity sweep is its own row."""
    trials = experiment.trials
    controlled = trials[trials[list(SETTING_FIELDS)].notna().any(axis=1)]
    if controlled.empty:
        return Skipped(
            "controller",
            "Controller sensitivity",
            "no ReLiF trials with a controller setting (adaptive r* and eta, or a static λ0)",
        )
    key = f"bias_{results.primary.key}"
    per_trial = results.per_trial.merge(
        lambda_bound_shares(experiment, list(controlled["trial"])), on="trial"
    )
    order = list(dict.fromkeys(controlled["variant"]))
    rows = summarize(per_trial, "variant", ["worst", "macro", key, "at_lower", "at_upper"], order)
    rows = rows.rename(columns={"variant": "row"})
    by_variant = controlled.sort_values("seed").groupby("variant", sort=False)
    shown = [field for field in SETTING_FIELDS if controlled[field].notna().any()]
    for column in shown:
        values = by_variant[column].agg(setting_text)
        rows[column] = [values[v] for v in rows["row"]]
    _add_ci(rows, results, key, results.primary.value, ci)
    headers = {
        "r_star": ("r*", r"$r^\star$"),
        "eta": ("η", r"$\eta$"),
        "lambda0": ("λ0", r"$\lambda_0$"),
    }
    columns = [
        *(Column(field, *headers[field], None, "text") for field in shown),
        Column("worst", "Worst", "Worst", "higher"),
        Column("macro", "Macro", "Macro", "higher"),
        bias_column(key, results.primary.symbol, results.primary.latex),
        Column("at_lower", "Steps at λ_min", r"$\lambda_{\min}$ share", digits=2),
        Column("at_upper", "Steps at λ_max", r"$\lambda_{\max}$ share", digits=2),
    ]
    adaptive = "per target r* and step size eta" + (" (adaptive λ)" if "lambda0" in shown else "")
    settings = [adaptive] if "r_star" in shown else []
    settings += ["per fixed λ0 (static λ, each λ0 its own row)"] if "lambda0" in shown else []
    title = (
        f"Controller sensitivity: {' and '.join(settings)}, utility and fixed-delta Bias "
        f"({results.split} split) and the share of training steps with lambda at its lower / "
        "upper bound (from the traces), mean ± std over seeds."
    )
    return Table("controller", title, "Variant", columns, rows)


def setting_text(values: pd.Series) -> str:
    """A variant's r*, eta or lambda0: one value ("-" where it does not identify the setting),
    or each seed's in seed order, '/'-separated, when the setting was selected per seed
    (`--select-from`)."""
    texts = ["-" if pd.isna(value) else f"{value:g}" for value in values]
    return texts[0] if len(set(texts)) == 1 else " / ".join(texts)


def lambda_bound_shares(experiment: Experiment, trials: list[str]) -> pd.DataFrame:
    """Per trial, the share of trace steps with lambda equal to lambda_min / lambda_max of its
    config (the controller clips to the bounds exactly; traces store float32 values, hence a
    1e-6 relative tolerance)."""
    configs = experiment.trials.set_index("trial")["config"]
    rows = []
    for trial in trials:
        trace = experiment.trace(trial)
        relif = configs[trial]["relif"]
        if "lambda" not in trace.columns or trace.empty:
            rows.append((trial, np.nan, np.nan))
            continue
        lam = trace["lambda"].to_numpy(dtype=np.float64)
        rows.append(
            (
                trial,
                float(np.isclose(lam, relif["lambda_min"], rtol=1e-6, atol=0).mean()),
                float(np.isclose(lam, relif["lambda_max"], rtol=1e-6, atol=0).mean()),
            )
        )
    return pd.DataFrame(rows, columns=["trial", "at_lower", "at_upper"])


def _setting(group: pd.DataFrame, name: str) -> object:
    values = {config["relif"][name] for config in group["config"]}
    return values.pop() if len(values) == 1 else "mixed"


def _stats(results: Results, keys: list[str], order: list[str] | None = None) -> pd.DataFrame:
    rows = summarize(results.per_trial, "variant", keys, order or results.variants)
    return rows.rename(columns={"variant": "row"})


def _add_ci(
    rows: pd.DataFrame,
    results: Results,
    key: str,
    delta: float | None,
    ci: CISettings,
    trials_of: dict[str, list[str]] | None = None,
) -> None:
    """`<key>_ci_low/high` per row (a variant, or the trials `trials_of` lists for it): the
    bootstrap interval of its mean Bias."""
    if ci.n_boot <= 0:
        return
    per_trial = results.per_trial
    if trials_of is None:
        trials_of = {
            row: list(per_trial.loc[per_trial["variant"] == row, "trial"]) for row in rows["row"]
        }
    bounds = [results.bias_ci(trials_of[row], delta, ci.n_boot, ci.level) for row in rows["row"]]
    rows[f"{key}_ci_low"] = [low for low, _ in bounds]
    rows[f"{key}_ci_high"] = [high for _, high in bounds]


def utility_table(results: Results) -> Table:
    """Every metric of the report split (normalized `<task>_score` columns left out) per
    method, and Delta-M% as `results.delta_m` says (`per_trial`'s `delta_m`)."""
    trials, split = results.audit.experiment.trials, results.split
    prefix = f"{split}_"
    metrics = [c[len(prefix) :] for c in trials.columns if c.startswith(prefix)]
    leading = [m for m in ("worst", "macro") if m in metrics]
    metrics = leading + [m for m in metrics if m not in leading and not m.endswith("_score")]
    per_trial = trials[["variant", "seed"]].copy()
    for metric in metrics:
        per_trial[metric] = trials[prefix + metric].to_numpy(dtype=float)
    per_trial["delta_m"] = results.per_trial["delta_m"].to_numpy()
    order = list(dict.fromkeys(trials["variant"]))
    keys = [*metrics, "delta_m"]
    rows = summarize(per_trial, "variant", keys, order).rename(columns={"variant": "row"})
    directions = metric_directions(set(trials["dataset"]))
    columns = [
        Column(
            m,
            metric_header(m),
            latex_escape(metric_header(m)),
            direction(directions.get(m)),
            digits=metric_digits(m),
        )
        for m in metrics
    ]
    options = results.delta_m
    against = " vs ERM" if options.base == "erm" else ""
    better = "higher" if options.sign == "higher" else "lower"
    latex = r"$\Delta_m\%$" + against
    columns.append(Column("delta_m", f"Δm%{against}", latex, better, digits=2))
    title = (
        f"All utility metrics ({split} split), mean ± sample std over seeds. "
        f"{delta_m_note(options)}"
    )
    return Table("utility", title, "label", columns, rows)


def metric_directions(datasets: set[str]) -> dict[str, bool]:
    """`<task>_<metric>` -> higher is better, as the tasks of the trials' benchmarks declare."""
    directions: dict[str, bool] = {}
    for dataset in sorted(datasets):
        directions.update(benchmark(dataset, "data set of the trials").metric_directions)
    return directions
