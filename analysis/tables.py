"""The paper's utility and fixed-delta tables from `Results` (mean +- sample std over seeds per
method variant), and what every table builder of the report shares.

Each builder returns a `Table`, or a `Skipped` note when the experiment has no data for it
(e.g. no ReLiF variants): tables are skipped with a note, never an error.

- main: Worst, Macro, native metrics, Bias at every delta_ref (paper Table 1 / Table 4)
- violation: VR at every delta_ref (Table 10)
- saturation: the share of audit scores the squash clipped at 0 and at 1
- sensitivity: Bias over a list of deltas (Table 9)
- utility: every utility metric of the report split

The threshold-drift tables (drift, shift, certificate) are `relif_ray.analysis.drift_tables`'s,
ReLiF's own (ablation, controller) `relif_ray.analysis.relif_tables`'s, the audit-interface
table `relif_ray.analysis.interfaces`' and the group-fairness ones
`relif_ray.analysis.group_tables`'. They share `Skipped`, `CISettings`, `bias_column`,
`variant_stats` and `add_bias_ci` from here. Bias columns carry bootstrap intervals
(`Results.bias_ci`) where `n_boot` > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relif_ray.analysis.mtl_metrics import delta_m_note
from relif_ray.analysis.paired import add_verdict_columns
from relif_ray.analysis.render import (
    Column,
    Table,
    latex_escape,
    metric_digits,
    metric_header,
    summarize,
)
from relif_ray.analysis.results import SATURATION_FLAG, Results, direction, sensitivity_key
from relif_ray.problems import benchmark


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
    """The column of a Bias at one delta (`symbol` in Markdown, `latex` in LaTeX), lower better."""
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
    rows = variant_stats(results, [c.key for c in columns])
    for delta in results.deltas:
        add_bias_ci(rows, results, f"bias_{delta.key}", delta.value, ci)
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
    return Table("saturation", title, "Method", columns, variant_stats(results, keys))


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
    rows = variant_stats(results, [c.key for c in columns])
    return Table("violation", title, "Method", columns, rows)


def sensitivity_table(results: Results, ci: CISettings) -> Table:
    keys = [sensitivity_key(delta) for delta in results.sensitivity]
    rows = variant_stats(results, keys)
    for delta, key in zip(results.sensitivity, keys, strict=True):
        add_bias_ci(rows, results, key, delta, ci)
    columns = [
        Column(key, f"{delta:g}", f"${delta:g}$", "lower", digits=3)
        for delta, key in zip(results.sensitivity, keys, strict=True)
    ]
    title = (
        f"Fixed-delta sensitivity: Bias at each delta (columns), {results.split} split, "
        "mean ± std over seeds."
    )
    return Table("delta_sensitivity", title, "Method", columns, rows)


def variant_stats(
    results: Results, keys: list[str], order: list[str] | None = None
) -> pd.DataFrame:
    """Mean and sample std over seeds of each per-trial column in `keys`, one row per method
    variant (named `row`, in `order`, default the results' order of variants)."""
    rows = summarize(results.per_trial, "variant", keys, order or results.variants)
    return rows.rename(columns={"variant": "row"})


def add_bias_ci(
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
