"""The family of a report's verdicts over seeds, adjusted for making many comparisons at once.

A report makes many claims, and at 95% each comparison alone shows an effect that is not
there 5% of the time: of 40 comparisons, about two. The report's headline claims are its
**family**: the verdicts of its Summary (per method: Bias at the primary delta_ref, Worst,
Macro and Delta-M% against same-seed ERM, `SUMMARY_COMPARISONS`) and of its group audit (per
method, task, attribute and disparity, `relif_ray.analysis.groups`). Each has the p-value of
its own test (`relif_ray.analysis.verdicts.Comparison.p`); statsmodels' `multipletests`
adjusts them over the family at alpha = 1 - level (`ADJUSTMENTS`):

- `holm` (default): Holm-Bonferroni (Holm 1979), the family-wise error: the chance that any
  verdict of the family shows an effect that is not there stays below alpha; uniformly more
  powerful than Bonferroni, and right for a report's headline claims;
- `fdr_bh`: Benjamini-Hochberg (1995), the false discovery rate: the expected share of shown
  verdicts that are wrong stays below alpha; for screening many comparisons for ones to
  follow up;
- `none`: each verdict on its own (p_adjusted is p).

A shown verdict stays shown after the adjustment where its adjusted p-value is below alpha:
"lower than ERM (95%, 10 seeds; also after Holm over 38 comparisons)", or "...; not after Holm
over 38 comparisons)" (`Family.verdict`). Comparisons without a p-value (fewer than two seeds,
values that did not vary) are not tested and not in the family. Outside it, with their own p
and no adjustment: the rest of paired.csv (VR, Bias at the other delta_refs, each task
metric) and the interface table's cuts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from relif_ray.analysis.delta import DeltaRef
from relif_ray.analysis.groups import DISPARITY_NAMES, GroupAudit
from relif_ray.analysis.paired import paired_summary
from relif_ray.analysis.render import display_text
from relif_ray.analysis.results import Results
from relif_ray.analysis.verdicts import VerdictSettings, is_shown
from relif_ray.errors import UserError

ADJUSTMENTS = {"holm": "Holm", "fdr_bh": "Benjamini-Hochberg", "none": ""}
"""`--adjust` values (statsmodels' `multipletests` method names) and how verdicts name them."""
ERRORS = {"holm": "family-wise error", "fdr_bh": "false discovery rate"}
"""What each adjustment holds below 1 - level."""
FAMILY_COLUMNS = ["p_adjusted", "family_size"]
"""What the family adds to paired.csv and to the group audit's verdicts: the adjusted p-value
and the family's size on the family's rows, empty on the others."""
MEMBER_COLUMNS = ["label", "part", "comparison", "p", "p_adjusted"]
"""`Family.members`' columns: the method (the report's row name), "summary" or "group audit",
the comparison in words, its p-value and adjusted p-value."""


def check_adjustment(adjust: str) -> str:
    """`adjust` if it is one of `ADJUSTMENTS`, else a one-line UserError."""
    if adjust not in ADJUSTMENTS:
        raise UserError(f"--adjust: must be holm, fdr_bh or none, got {adjust!r}")
    return adjust


def summary_comparisons(primary: DeltaRef) -> list[tuple[str, str, str]]:
    """(metric, delta key, name) of each comparison of a report's Summary, in its order."""
    return [
        ("bias", primary.key, f"Bias@{primary.symbol}"),
        ("worst", "", "Worst"),
        ("macro", "", "Macro"),
        ("delta_m", "", "Δm%"),
    ]


@dataclass(frozen=True)
class Family:
    """The comparisons adjusted together (`members`, `MEMBER_COLUMNS`), with `adjust`
    (`ADJUSTMENTS`) at alpha = 1 - `level`."""

    adjust: str
    level: float
    members: pd.DataFrame

    @property
    def size(self) -> int:
        """The number of comparisons in the family."""
        return len(self.members)

    @property
    def comparisons(self) -> str:
        """ "38 comparisons" (or "1 comparison")."""
        return f"{self.size} comparison{'s' if self.size != 1 else ''}"

    def verdict(self, verdict: str, p_adjusted: float) -> str:
        """`verdict` with whether it holds after the adjustment, in its first parenthesis:
        "lower than ERM (95%, 10 seeds; also after Holm over 38 comparisons)"; unchanged where
        it shows nothing, is not in the family (NaN) or nothing is adjusted."""
        name = ADJUSTMENTS[self.adjust]
        if not name or math.isnan(p_adjusted) or not is_shown(verdict):
            return verdict
        held = "also" if p_adjusted < 1 - self.level else "not"
        head, _, tail = verdict.partition(")")
        return f"{head}; {held} after {name} over {self.comparisons}){tail}"

    def lines(self) -> list[str]:
        """The family in words, once per report: its size, the adjustment, and per method
        the comparisons it holds."""
        name = ADJUSTMENTS[self.adjust]
        alpha = f"{1 - self.level:.0%}"
        how = (
            f"adjusted by {name} ({ERRORS[self.adjust]} {alpha})"
            if name
            else f"not adjusted (each verdict at {alpha} on its own)"
        )
        grouped = (self.members["part"] == "group audit").any()
        lines = [
            "",
            f"The family of this report's verdicts (`--adjust {self.adjust}`): "
            f"{self.comparisons}, {how}: the Summary's verdicts above"
            + (" and the group audit's" if grouped else "")
            + " that have a p-value (p, p_adjusted and family_size in paired.csv"
            + (" and group_verdicts.csv" if grouped else "")
            + "). Not in it, each at its own level: the rest of the paired table and the "
            "audit-interface cuts.",
        ]
        for label, rows in self.members.groupby("label", sort=False):
            parts = [
                (f"{part}: " if part != "summary" else "") + _compressed(chosen["comparison"])
                for part, chosen in rows.groupby("part", sort=False)
            ]
            lines.append(f"- {display_text(str(label))} ({len(rows)}): {'; '.join(parts)}")
        return lines


def _compressed(names: pd.Series) -> str:
    """Comparison names, those that share a "what: " prefix once under it: "mortality by
    gender: DP difference, EO difference; mortality by age: DP difference"."""
    grouped: dict[str, list[str]] = {}
    for name in names:
        prefix, _, rest = name.rpartition(": ")
        grouped.setdefault(prefix, []).append(rest)
    return "; ".join(
        f"{prefix}: {', '.join(rest)}" if prefix else ", ".join(rest)
        for prefix, rest in grouped.items()
    )


@dataclass(frozen=True)
class AdjustedVerdicts:
    """A report's verdicts over seeds with their family: `paired` (paired.csv: `paired_summary`
    with `FAMILY_COLUMNS`), `groups` (the group audit with `FAMILY_COLUMNS` in its verdicts;
    None without one) and the `family` (for `relif_ray.analysis.group_tables.group_tables`)."""

    paired: pd.DataFrame
    groups: GroupAudit | None
    family: Family


def adjust_verdicts(
    paired: pd.DataFrame,
    groups: GroupAudit | None,
    primary: DeltaRef,
    settings: VerdictSettings,
    adjust: str = "holm",
) -> AdjustedVerdicts:
    """Adjust the p-values of a report's family (module docstring): the Summary's rows of
    `paired` (`paired_summary`) and `groups`' verdicts, where they have a p-value."""
    check_adjustment(adjust)
    names = {(metric, delta): name for metric, delta, name in summary_comparisons(primary)}
    keys = list(zip(paired["metric"], paired["delta"], strict=True))
    in_summary = pd.Series([key in names for key in keys], index=paired.index, dtype=bool)
    summary = paired[in_summary & paired["p"].notna()]
    parts = [
        pd.DataFrame(
            {
                "label": summary["label"],
                "part": "summary",
                "comparison": [
                    names[key] for key in zip(summary["metric"], summary["delta"], strict=True)
                ],
                "p": summary["p"],
                "source": "paired",
            }
        )
    ]
    verdicts = groups.verdicts if groups is not None else None
    if verdicts is not None and len(verdicts):
        tested = verdicts[verdicts["p"].notna()]
        parts.append(
            pd.DataFrame(
                {
                    "label": tested["variant"],
                    "part": "group audit",
                    "comparison": [
                        f"{row.task} by {row.attribute}: {DISPARITY_NAMES[row.metric]}"
                        for row in tested.itertuples()
                    ],
                    "p": tested["p"],
                    "source": "groups",
                }
            )
        )
    members = pd.concat(parts).reset_index(names="row")
    order = {label: index for index, label in enumerate(dict.fromkeys(paired["label"]))}
    members = members.sort_values(
        "label", key=lambda labels: labels.map(order).fillna(len(order)), kind="stable"
    )
    members["p_adjusted"] = _adjusted(members["p"].to_numpy(np.float64), adjust, settings.level)
    family = Family(adjust, settings.level, members[MEMBER_COLUMNS].reset_index(drop=True))
    adjusted_groups = None
    if groups is not None:
        chosen = members[members["source"] == "groups"]
        adjusted_groups = replace(groups, verdicts=_with_family(groups.verdicts, chosen, family))
    chosen = members[members["source"] == "paired"]
    return AdjustedVerdicts(_with_family(paired, chosen, family), adjusted_groups, family)


def report_family(
    results: Results,
    groups: GroupAudit | None = None,
    settings: VerdictSettings | None = None,
    adjust: str = "holm",
) -> AdjustedVerdicts:
    """What `relif report` writes of the verdicts over seeds, for the notebook and the API:
    `paired_summary(results, settings)` and `groups` (the group audit of the same experiment,
    or None) adjusted over their family (`adjust_verdicts`)."""
    settings = settings or VerdictSettings()
    paired = paired_summary(results, settings)
    return adjust_verdicts(paired, groups, results.primary, settings, adjust)


def _adjusted(p_values: np.ndarray, adjust: str, level: float) -> np.ndarray:
    """statsmodels' adjusted p-values at alpha = 1 - level; the p-values with `none`."""
    if adjust == "none" or p_values.size == 0:
        return p_values
    return multipletests(p_values, alpha=1 - level, method=adjust)[1]


def _with_family(frame: pd.DataFrame, members: pd.DataFrame, family: Family) -> pd.DataFrame:
    """`frame` with `FAMILY_COLUMNS`: on the rows of `members` (by their `row`), their adjusted
    p-value and the family's size; NaN on the others."""
    adjusted = members.set_index("row")["p_adjusted"].reindex(frame.index)
    size = pd.Series(family.size, index=members["row"], dtype="Int64").reindex(frame.index)
    return frame.assign(p_adjusted=adjusted.to_numpy(), family_size=size.array)
