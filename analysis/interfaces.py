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
(`relif_ray.analysis.results.Results.under`).

Per method and interface:
- Bias: mean ± sample std over seeds [the main table's bootstrap interval of the seed mean];
- ratio: Bias / the same-seed ERM trial's Bias, mean ± std over seeds (ERM: 1);
- change: the mean ratio minus the mean ratio under (a);
- cut over seeds: the verdict over seeds on the per-seed ratios (`relif_ray.analysis.verdicts.
  compare_ratios`: the Student-t interval of the mean log ratio; "lower than ERM (95%, n
  seeds)", "not shown with n seeds" or "higher than ERM"), with the geometric mean ratio and
  its interval, on this interface.
A data set whose audit scores are all probabilities (MIMIC-III, eICU) has nothing to vary:
the table is skipped with one line, as it is when a sweep's ERM reference was lent by
`--reference` (only its q10/q90 travel, not the validation scores (b) and (c) need).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relif_ray.analysis.audit_scores import squash_quantiles, squashed_tasks
from relif_ray.analysis.render import Column, Table, bound_text, display_text, summarize
from relif_ray.analysis.results import Results
from relif_ray.analysis.tables import CISettings, Skipped
from relif_ray.analysis.verdicts import VerdictSettings, compare_ratios
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


def interface_table(
    results: Results, ci: CISettings, settings: VerdictSettings | None = None
) -> Table | Skipped:
    """Per method (variant) and interface: Bias, ratio to same-seed ERM, change against (a)
    and the cut over seeds (module docstring)."""
    settings = settings or VerdictSettings()
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
        stats["cut"] = [
            _cut(chosen.loc[chosen["variant"] == variant, "ratio"].to_numpy(), settings)
            for variant in stats["variant"]
        ]
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
    table["cut"] = table["cut"].where(~table["row"].map(erm_rows), "reference")
    delta = results.primary
    columns = [
        Column("interface", "Interface", "Interface", None, "text"),
        Column("bias", f"Bias@{delta.symbol}", f"Bias@${delta.latex}$"),
        Column("ratio", "Ratio to same-seed ERM", "Ratio to ERM", digits=3),
        Column("change", "Change vs (a)", "Change vs (a)", None, "number", digits=3),
        Column("cut", "Cut over seeds", "Cut over seeds", None, "text"),
    ]
    title = (
        f"{TITLE} ({results.split} split): the same saved scores audited at "
        f"{delta.symbol} = {delta.value:.4f} with the same pools and pairs under "
        + "; ".join(
            f"{interface_name(name)}: {interface.summary}"
            for name, interface in AUDIT_INTERFACES.items()
        )
        + ", each from the same-seed ERM trial's validation scores. Ratio: Bias / same-seed "
        "ERM's, mean ± std over seeds; change: against (a); cut over seeds: the verdict of the "
        f"{settings.level:.0%} Student-t interval of the mean log ratio over seeds, with the "
        "geometric mean ratio and that interval."
    )
    return Table("interfaces", title, "Method", columns, table.reset_index(drop=True))


def _cut(ratios: np.ndarray, settings: VerdictSettings) -> str:
    """The cut over seeds in words: the verdict, then the geometric mean ratio and its
    interval where there is one."""
    comparison = compare_ratios(ratios, settings)
    if comparison.n < 2:
        return comparison.verdict
    if np.isnan(comparison.ci_low):  # the seeds did not vary: no interval
        return f"{comparison.verdict}: {comparison.estimate:.2f}x"
    low, high = (bound_text(bound, 1.0, 2) for bound in (comparison.ci_low, comparison.ci_high))
    return f"{comparison.verdict}: {comparison.estimate:.2f}x [{low}, {high}]"


def _add_intervals(
    stats: pd.DataFrame, per_trial: pd.DataFrame, results: Results, ci: CISettings
) -> None:
    """`bias_ci_low/high`: the bootstrap interval over the audit's pairs of each variant's
    mean Bias on `results`' interface (`Results.bias_ci`), as the other tables show Bias."""
    if ci.n_boot <= 0:
        return
    delta = results.primary.value
    bounds = [
        results.bias_ci(
            list(per_trial.loc[per_trial["variant"] == variant, "trial"]),
            delta,
            ci.n_boot,
            ci.level,
        )
        for variant in stats["variant"]
    ]
    stats["bias_ci_low"], stats["bias_ci_high"] = np.array(bounds).T


def interface_words(table: Table | Skipped) -> str:
    """The table in words: per method, its cut over seeds under each interface and how much
    its mean ratio changes against (a)."""
    if isinstance(table, Skipped):
        return ""
    lines = [
        "Whether each method's cut in Bias survives the audit interface, over seeds (ratios "
        "to the same-seed ERM trial; change of the mean ratio against (a)):"
    ]
    for variant, rows in table.rows.groupby("row", sort=False):
        if (rows["cut"] == "reference").all():
            continue
        clauses = [_clause(row) for row in rows.itertuples(index=False)]
        lines.append(f"- {display_text(str(variant))}: " + "; ".join(clauses) + ".")
    return "\n".join(lines)


INTERFACE_DEPENDENT = "the cut depends on the audit interface"
"""How the report's summary flags a method whose Bias cut is shown under one audit interface and
not under another (`interface_dependence`)."""


def interface_dependence(table: Table | Skipped) -> dict[str, str]:
    """Variant -> the summary's flag where its cut over seeds is shown ("lower than ERM") under
    some interface and not under another: `INTERFACE_DEPENDENT`, with the interfaces of each
    kind. A cut shown under every interface, or under none, is not flagged."""
    if isinstance(table, Skipped):
        return {}
    flags = {}
    for variant, rows in table.rows.groupby("row", sort=False):
        shown = rows["cut"].str.startswith("lower than ERM")
        if shown.any() and not shown.all():
            flags[str(variant)] = (
                f"{INTERFACE_DEPENDENT} (shown under {', '.join(rows.loc[shown, 'interface'])}; "
                f"not under {', '.join(rows.loc[~shown, 'interface'])})"
            )
    return flags


def _clause(row: tuple) -> str:
    change = "" if np.isnan(row.change) else f", {row.change:+.2f} against (a)"
    return f"{row.interface}: {row.cut}{change}"
