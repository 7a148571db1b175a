"""The report's "Audit-interface sensitivity" table: is a method's cut in Bias an artefact of
the clip?

The paper asks "is fairness truly fair?". Its squash (appendix A; `relif_ray.squash`) clips
a depth/normal score above the same-seed ERM trial's validation q90 to 1, so a method that
pushes those scores past q90 (the main table's Saturated flag) has smaller audit gaps partly
because the clip flattens them. This table re-audits the SAME saved raw scores under each
interface of `relif_ray.squash.AUDIT_INTERFACES`, all built from the same-seed ERM trial's
validation scores: (a) the paper's squash (q10/q90), (b) the wider band q1/q99, (c) the ERM
empirical CDF (a rank map, no clip inside ERM's range). Same delta VALUE (the primary
delta_ref of the main table), same split, pools and pairs; nothing is retrained
(`analysis.results.Results.under`).

Per method and interface:
- Bias: mean ± sample std over seeds [the main table's bootstrap interval of the seed mean];
- ratio: Bias / the same-seed ERM trial's Bias, mean ± std over seeds (ERM: 1);
- change: the mean ratio minus the mean ratio under (a);
- cut holds: the mean ratio is below 1 AND the method's interval lies below its same-seed ERM
  trials' interval (upper end < their lower end), on this interface.
A data set whose audit scores are all probabilities (MIMIC-III, eICU) has nothing to vary:
the table is skipped with one line, as it is when a sweep's ERM reference was lent by
`--reference` (only its q10/q90 travel, not the validation scores (b) and (c) need).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.audit_scores import squash_quantiles, squashed_tasks
from analysis.render import Column, Table, display_text, summarize
from analysis.results import Results
from analysis.tables import CISettings, Skipped
from relif_ray.experiment.layout import SQUASH_CONSTANTS_FILE
from relif_ray.squash import AUDIT_INTERFACES, PAPER_INTERFACE

TITLE = "Audit-interface sensitivity"
LETTERS = dict(zip(AUDIT_INTERFACES, "abcdefgh", strict=False))
"""How the report names each interface: (a) the paper's, (b), (c)."""


def interface_name(interface: str) -> str:
    """How reports name an interface: (a) q10-q90, (b) q1-q99, (c) ecdf."""
    return f"({LETTERS[interface]}) {interface}"


def skip_reason(results: Results) -> str | None:
    """Why the table does not apply to these trials, or None."""
    datasets = sorted(set(results.audit.experiment.trials["dataset"]))
    if not any(squashed_tasks(dataset) for dataset in datasets):
        return (
            f"every audit score of {', '.join(datasets)} is a probability, used as it is: "
            "no squashed task, so every audit interface gives the same scores"
        )
    lent = squash_quantiles(results.audit.experiment)
    lent = lent[lent["reference"] == SQUASH_CONSTANTS_FILE]
    if not lent.empty:
        return (
            f"trial {lent['trial'].iloc[0]} has no same-seed ERM trial in the experiment, only "
            f"the q10/q90 of {SQUASH_CONSTANTS_FILE} (--reference); the other interfaces need "
            "the ERM trial's validation scores"
        )
    return None


def interface_per_trial(results: Results) -> pd.DataFrame:
    """One row per trial and interface: trial, variant, label, seed, interface, bias (at the
    primary delta value), erm_trial (its same-seed ERM reference), erm_bias, ratio."""
    key = f"bias_{results.primary.key}"
    reference = squash_quantiles(results.audit.experiment).drop_duplicates("trial")
    erm_of = reference.set_index("trial")["reference"]
    frames = []
    for interface in AUDIT_INTERFACES:
        per_trial = results.under(interface).per_trial
        bias = per_trial.set_index("trial")[key]
        frame = per_trial[["trial", "variant", "label", "seed"]].copy()
        frame["interface"] = interface
        frame["bias"] = bias.to_numpy()
        frame["erm_trial"] = erm_of.reindex(frame["trial"]).to_numpy()
        frame["erm_bias"] = bias.reindex(frame["erm_trial"]).to_numpy()
        frame["ratio"] = frame["bias"] / frame["erm_bias"]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def interface_table(results: Results, ci: CISettings) -> Table | Skipped:
    """Per method (variant) and interface: Bias, ratio to same-seed ERM, change against (a)
    and whether the cut holds (module docstring)."""
    reason = skip_reason(results)
    if reason:
        return Skipped("interfaces", TITLE, reason)
    per_trial = interface_per_trial(results)
    rows = []
    for interface in AUDIT_INTERFACES:
        chosen = per_trial[per_trial["interface"] == interface]
        stats = summarize(chosen, "variant", ["bias", "ratio"], results.variants)
        stats.insert(1, "interface", interface_name(interface))
        _add_intervals(stats, chosen, results.under(interface), ci)
        rows.append(stats)
    table = pd.concat(rows).rename(columns={"variant": "row"})
    order = {variant: index for index, variant in enumerate(results.variants)}
    table = table.sort_values("row", key=lambda rows: rows.map(order), kind="stable")
    paper = table[table["interface"] == interface_name(PAPER_INTERFACE)]
    paper_ratio = paper.set_index("row")["ratio_mean"]
    changes = table["ratio_mean"] - table["row"].map(paper_ratio)
    table["change"] = changes.where(table["interface"] != interface_name(PAPER_INTERFACE))
    references = set(per_trial["erm_trial"])
    erm_rows = per_trial.groupby("variant")["trial"].agg(lambda trials: set(trials) <= references)
    table["cut"] = [
        "reference" if erm_rows[row.row] else cut_verdict(row, ci)
        for row in table.itertuples(index=False)
    ]
    delta = results.primary
    columns = [
        Column("interface", "Interface", "Interface", None, "text"),
        Column("bias", f"Bias@{delta.symbol}", f"Bias@${delta.latex}$"),
        Column("ratio", "Ratio to same-seed ERM", "Ratio to ERM", digits=3),
        Column("change", "Change vs (a)", "Change vs (a)", None, "number", digits=3),
        Column("cut", "Cut holds", "Cut holds", None, "text"),
    ]
    title = (
        f"{TITLE} ({results.split} split): the same saved scores audited at "
        f"{delta.symbol} = {delta.value:.4f} with the same pools and pairs under "
        + "; ".join(
            f"{interface_name(name)}: {interface.summary}"
            for name, interface in AUDIT_INTERFACES.items()
        )
        + ", each from the same-seed ERM trial's validation scores. Ratio: Bias / same-seed "
        "ERM's, mean ± std over seeds; change: against (a); the cut holds where the mean "
        "ratio is below 1 and the method's interval lies below its same-seed ERM trials'."
    )
    return Table("interfaces", title, "Method", columns, table.reset_index(drop=True))


def _add_intervals(
    stats: pd.DataFrame, per_trial: pd.DataFrame, results: Results, ci: CISettings
) -> None:
    """`bias_ci_low/high` of each variant's mean Bias and `erm_ci_low/high` of the mean Bias
    of its same-seed ERM trials, on `results`' interface (`Results.bias_ci`)."""
    if ci.n_boot <= 0:
        return
    delta = results.primary.value
    bounds, erm_bounds = [], []
    for variant in stats["variant"]:
        rows = per_trial[per_trial["variant"] == variant]
        bounds.append(results.bias_ci(list(rows["trial"]), delta, ci.n_boot, ci.level))
        erm = list(dict.fromkeys(rows["erm_trial"]))
        erm_bounds.append(results.bias_ci(erm, delta, ci.n_boot, ci.level))
    stats["bias_ci_low"], stats["bias_ci_high"] = np.array(bounds).T
    stats["erm_ci_low"], stats["erm_ci_high"] = np.array(erm_bounds).T


def cut_verdict(row: tuple, ci: CISettings) -> str:
    """Whether the cut holds: yes, or no and why (`row`: a row of the table with ratio_mean,
    bias_ci_high and erm_ci_low)."""
    if np.isnan(row.ratio_mean):
        return "–"
    if row.ratio_mean >= 1:
        return "no: ratio ≥ 1"
    if ci.n_boot <= 0:
        return "ratio < 1 (no intervals)"
    if row.bias_ci_high < row.erm_ci_low:
        return "yes"
    return "no: intervals overlap"


def interface_words(table: Table | Skipped) -> str:
    """The table in words: per method, whether its cut holds under each interface and how
    much its ratio changes against (a)."""
    if isinstance(table, Skipped):
        return ""
    lines = [
        "Whether each method's cut in Bias survives the audit interface (ratios to the "
        "same-seed ERM trial; change against (a)):"
    ]
    for variant, rows in table.rows.groupby("row", sort=False):
        if (rows["cut"] == "reference").all():
            continue
        clauses = [_clause(row) for row in rows.itertuples(index=False)]
        lines.append(f"- {display_text(str(variant))}: " + "; ".join(clauses) + ".")
    return "\n".join(lines)


def _clause(row: tuple) -> str:
    ratio = f"ratio {row.ratio_mean:.2f}"
    if not np.isnan(row.change):
        ratio += f", {row.change:+.2f} against (a)"
    if row.cut == "yes":
        return f"{row.interface}: the cut holds ({ratio})"
    if row.cut == "no: intervals overlap":
        return (
            f"{row.interface}: the cut does not hold, its interval [{row.bias_ci_low:.4f}, "
            f"{row.bias_ci_high:.4f}] overlaps ERM's [{row.erm_ci_low:.4f}, "
            f"{row.erm_ci_high:.4f}] ({ratio})"
        )
    if row.cut == "no: ratio ≥ 1":
        return f"{row.interface}: no cut ({ratio})"
    return f"{row.interface}: {row.cut} ({ratio})"
