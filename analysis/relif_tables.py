"""The report's ReLiF tables: its component ablation and its controller settings.

Each builder returns a `Table`, or a `Skipped` note when the experiment has no such ReLiF
variants:

- ablation: ReLiF component variants (Table 5); a static-lambda label is one row over its
  lambda0 grid, as in the paper
- controller: per variant with a controller setting (r*, eta; or a static lambda0): Worst,
  Macro, Bias, share of steps at a lambda bound (B.3)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.render import Column, Table, display_text, summarize
from relif_ray.analysis.results import Results
from relif_ray.analysis.tables import CISettings, Skipped, add_bias_ci, bias_column
from relif_ray.sweep.labels import SETTING_FIELDS

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
    add_bias_ci(rows, results, key, results.primary.value, ci, trials_of)
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
    add_bias_ci(rows, results, key, results.primary.value, ci)
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
