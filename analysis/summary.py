"""The report's *Summary: verdicts over seeds* (`relif_ray.analysis.report`): per method, its
verdicts against the same-seed ERM trial (`relif_ray.analysis.paired`) in words, each shown one
with whether it holds after the adjustment over the report's family
(`relif_ray.analysis.family`), and the family listed once."""

from __future__ import annotations

import pandas as pd

from relif_ray.analysis.family import Family, summary_comparisons
from relif_ray.analysis.interfaces import interface_dependence
from relif_ray.analysis.paired import reference_variants
from relif_ray.analysis.render import Table, bound_text, display_text, margin_text
from relif_ray.analysis.results import Results
from relif_ray.analysis.tables import Skipped
from relif_ray.analysis.verdicts import (
    VerdictSettings,
    equivalence_bound,
    equivalence_level,
    planning_estimate,
)

CLAUSE_OPTIONS = {"bias": {"ratio": True}, "delta_m": {"digits": 2}}
"""How the Summary words a comparison other than as a difference with 3 decimals."""
EQUIVALENCE_NAMES = {"worst": "Worst", "macro": "Macro"}
"""The metrics with an equivalence test, whose spread over ERM's seeds the Summary gives."""


def verdicts_section(
    results: Results,
    paired: pd.DataFrame,
    settings: VerdictSettings,
    interfaces: Table | Skipped | None = None,
    family: Family | None = None,
    inert: dict[str, str] | None = None,
) -> str:
    """The report's summary: per method, its verdicts over seeds against the same-seed ERM
    trial (`relif_ray.analysis.paired`): Bias at the primary delta_ref, Worst, Macro and
    Delta-M%, each shown one with whether it holds after the adjustment over `family`; from
    the `interfaces` table, whether its cut depends on the audit interface
    (`interface_dependence`); `inert`'s flag where its controller did not act
    (`relif_ray.analysis.controller_activity.inert_flags`); then the family."""
    dependent = {} if interfaces is None else interface_dependence(interfaces)
    inert = inert or {}
    heading = "## Summary: verdicts over seeds\n"
    if paired.empty:
        return heading + "No method has a same-seed ERM trial to be compared with.\n"
    level = f"{settings.level:.0%}"
    inner = f"{equivalence_level(settings.level):.0%}"
    lines = [
        heading,
        "Each method is compared with the ERM trial of the same seed, and the comparison is "
        "summarised over seeds: Bias as the geometric mean ratio to ERM's with the "
        f"{level} Student-t interval of the mean log ratio; Worst and Macro as the mean "
        f"difference, called within ±{settings.margin:g} of ERM only where two one-sided "
        f"tests show it at {level}, i.e. where their {inner} interval lies inside "
        f"±{settings.margin:g} (that interval is given with the verdict, and the equivalence "
        "bound: the smallest margin it lies within); Δm% as the mean difference from ERM's. "
        "Where a verdict is not shown: a planning estimate at the observed effect (post hoc, "
        "not evidence): the seeds, more than those used, at which a test would have "
        f"{settings.power:.0%} power against an effect of the observed size. "
        "The Bias intervals of the tables below resample the "
        "audit's pairs only, not the seeds. Every label, metric and δ_ref: *Paired "
        "comparisons with same-seed ERM, over seeds* below."
        + "".join(f" {part}" for part in _erm_spread(results, settings.margin))
        + "\n",
    ]
    key = results.primary.key
    for label, rows in paired.groupby("label", sort=False):
        chosen = rows.set_index(["metric", "delta"])
        clauses = [
            _clause(
                chosen, (metric, delta), name, family, settings, **CLAUSE_OPTIONS.get(metric, {})
            )
            for metric, delta, name in summary_comparisons(results.primary)
        ]
        n = int(chosen.loc[("bias", key), "n_seeds"]) if ("bias", key) in chosen.index else 0
        seeds = f"{n} seed{'s' if n != 1 else ''}"
        clauses.append(f"**{dependent[label]}**" if label in dependent else "")
        clauses.append(f"**{inert[label]}**" if label in inert else "")
        text = "; ".join(clause for clause in clauses if clause)
        lines.append(f"- **{display_text(str(label))}** ({seeds}): {text}.")
    lines += _notes(paired, results)
    if family is not None:
        lines += family.lines()
    return "\n".join(lines) + "\n"


def _erm_spread(results: Results, margin: float) -> list[str]:
    """Per plain-ERM variant, the sample std over its seeds of Worst and Macro, against which
    to read the equivalence margin."""
    per_trial = results.per_trial
    metrics = [metric for metric in EQUIVALENCE_NAMES if metric in per_trial]
    parts = []
    for variant in [v for v in results.variants if v in reference_variants(results)]:
        rows = per_trial[per_trial["variant"] == variant]
        who = f"{display_text(str(variant))}'s"
        if len(rows) < 2 or not metrics:
            parts.append(f"{who} {len(rows)} seed gives no spread to read the margin against.")
            continue
        stds = [float(rows[metric].std(ddof=1)) for metric in metrics]
        spread = " and ".join(
            f"{EQUIVALENCE_NAMES[metric]} {std:.2g}"
            for metric, std in zip(metrics, stds, strict=True)
        )
        sizes = " and ".join(f"{margin / std:.1f}" if std > 0 else "–" for std in stds)
        parts.append(
            f"{who} standard deviation over its {len(rows)} seeds, to read the margin "
            f"±{margin:g} against: {spread} (the margin is {sizes} of them)."
        )
    return parts


def _notes(paired: pd.DataFrame, results: Results) -> list[str]:
    """Each distinct note of `paired` (seeds left out, trials that did not vary) once per
    label, with the comparisons it concerns."""
    noted = paired[paired["note"].fillna("") != ""]
    if noted.empty:
        return []
    symbols = {delta.key: delta.symbol for delta in results.deltas}
    lines = ["", "Notes on the comparisons above and in the paired table:"]
    for (label, note), rows in noted.groupby(["label", "note"], sort=False):
        names = [
            f"{metric}@{symbols.get(delta, delta)}" if delta else metric
            for metric, delta in zip(rows["metric"], rows["delta"], strict=True)
        ]
        lines.append(f"- {display_text(str(label))} ({', '.join(names)}): {note}.")
    return lines


def _clause(
    rows: pd.DataFrame,
    key: tuple[str, str],
    name: str,
    family: Family | None,
    settings: VerdictSettings,
    ratio: bool = False,
    digits: int = 3,
) -> str:
    """One comparison in words: estimate [interval], and for an equivalence test its
    (2 level - 1) interval: verdict, with the family's adjustment (a planning estimate where
    not shown); the equivalence bound; per seed."""
    if key not in rows.index:
        return ""
    inner = f"{equivalence_level(settings.level):.0%}"
    row = rows.loc[key]
    verdict = row["verdict"]
    if family is not None:
        verdict = family.verdict(verdict, float(row["p_adjusted"]))
    if pd.isna(row["estimate"]):
        return f"{name}: {verdict}"
    null, sign = (1.0, False) if ratio else (0.0, True)
    interval = f" [{_bounds(row['ci_low'], row['ci_high'], null, 2 if ratio else digits, sign)}]"
    if ratio:
        estimate = f"{row['estimate']:.2f}x ERM's"
    else:
        estimate = f"{row['estimate']:+.{digits}f} against ERM"
    if pd.isna(row["ci_low"]):
        interval = ""
    equivalence = not pd.isna(row["tost_low"])
    if equivalence:
        interval += f", {inner} [{_bounds(row['tost_low'], row['tost_high'], 0.0, digits)}]"
    text = f"{name} {estimate}{interval}: {verdict}"
    if not pd.isna(row["seeds_needed"]) or (
        row["verdict"].startswith("not shown") and not pd.isna(row["std"])
    ):
        text += f" ({planning_estimate(row['seeds_needed'], settings.power)})"
    if equivalence:
        text += f", equivalence bound: {bound_phrase(row['tost_low'], row['tost_high'], settings)}"
    if ratio:
        text += f", per seed {_per_seed(row['per_seed'])}"
    return text


def bound_phrase(tost_low: float, tost_high: float, settings: VerdictSettings) -> str:
    """The equivalence bound of an equivalence test's (2 level - 1) interval in words, "within
    ±0.0042 (90%)": the smallest margin it lies within, rounded up (`equivalence_bound`)."""
    bound = margin_text(equivalence_bound(tost_low, tost_high))
    return f"within ±{bound} ({equivalence_level(settings.level):.0%})"


def _bounds(low: float, high: float, null: float, digits: int, sign: bool = True) -> str:
    """ "low, high", each printed apart from the null value (`bound_text`)."""
    return f"{bound_text(low, null, digits, sign)}, {bound_text(high, null, digits, sign)}"


def _per_seed(values: str) -> str:
    """ "0: 0.8123; 1: 0.4012" -> "0.81x (seed 0), 0.40x (seed 1)"."""
    parts = [part.split(": ") for part in values.split("; ") if part]
    return ", ".join(f"{float(value):.2f}x (seed {seed})" for seed, value in parts)
