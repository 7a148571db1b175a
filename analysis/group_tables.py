"""The group-fairness section of a clinical report (`relif_ray.analysis.groups`), as tables.

- `groups_<task>`: per method, attribute and group, the group's size (stays; positives of the
  task's decision), the task's own metric, TPR and FPR at the task's threshold, mean ± sample
  std over seeds, and whether the group is small (fewer than the minimum size of stays);
- `group_disparities`: per method, task, attribute and disparity (Fairlearn's demographic-
  parity and equalized-odds differences and the gap in the task's metric over the compared
  groups): its value over seeds, its paired difference from the same-seed ERM trial's with
  the Student-t interval over seeds, and the verdict (`relif_ray.analysis.verdicts`), with
  whether it holds after the adjustment over the report's family where one is given
  (`relif_ray.analysis.family`; the CSV adds p, p_adjusted and family_size).

`group_tables` builds them for `relif report` (written with the other tables) and for the
notebook and the API alike, so that both show the same numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relif_ray.analysis.family import ADJUSTMENTS, FAMILY_COLUMNS, Family
from relif_ray.analysis.groups import (
    ALL_DISPARITIES,
    ATTRIBUTES,
    DISPARITY_NAMES,
    GroupAudit,
    band_names,
    disparity_rows,
)
from relif_ray.analysis.render import Column, Table, bound_text, summarize
from relif_ray.analysis.sections import link, section
from relif_ray.analysis.tables import CISettings, Skipped
from relif_ray.data.attributes import UNKNOWN

TITLE = "Group fairness: patient groups"
METRIC_HEADERS = {
    "auroc": "AUROC",
    "auroc_macro": "Macro AUROC",
    "kappa": "Kappa",
    "error": "Error rate",
    "mae": "MAE",
}
FILES = ("group_per_group.csv", "group_per_trial.csv", "group_paired.csv", "group_verdicts.csv")
"""The report's files of the group audit: `GroupAudit.per_group`, `.per_trial`, `.paired`,
`.verdicts`."""


def group_tables(audit: GroupAudit, family: Family | None = None) -> list[Table | Skipped]:
    """One table per task and the disparity table (its verdicts adjusted over `family`, the
    report's, where given: `relif_ray.analysis.family.adjust_verdicts`' audit and family);
    one `Skipped` saying why when the audit did not run."""
    if audit.skipped is not None:
        return [Skipped("groups", TITLE, audit.skipped)]
    tasks = list(dict.fromkeys(audit.per_group["task"]))
    return [task_table(audit, task) for task in tasks] + [disparity_table(audit, family)]


def ordered(frame: pd.DataFrame, audit: GroupAudit) -> pd.DataFrame:
    """`frame` (columns among task, attribute, group, metric, variant) in the audit's order:
    tasks and methods as the trials list them, attributes as `ATTRIBUTES` (a table's groups
    after them), disparities as `ALL_DISPARITIES`, age bands by age, other groups by name, unknown
    groups last."""
    ranks = {
        "task": list(dict.fromkeys(audit.per_trial["task"])),
        "attribute": list(dict.fromkeys([*ATTRIBUTES, *audit.per_trial["attribute"]])),
        "metric": list(ALL_DISPARITIES),
        "variant": list(dict.fromkeys(audit.per_trial["variant"])),
    }
    bands = band_names(audit.options.age_bands)
    keys = pd.DataFrame(index=frame.index)
    for column in ("task", "attribute", "group", "metric", "variant"):
        if column not in frame:
            continue
        if column == "group":
            keys["band"] = [bands.index(g) if g in bands else len(bands) for g in frame[column]]
            keys["unknown"] = [UNKNOWN in g for g in frame[column]]
            keys["group"] = frame[column]
        else:
            keys[column] = frame[column].map({v: i for i, v in enumerate(ranks[column])})
    order = keys.sort_values(list(keys.columns), kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def task_table(audit: GroupAudit, task: str) -> Table:
    chosen = audit.per_group[audit.per_group["task"] == task]
    metric = chosen["metric"].iloc[0]
    extra = outcome_columns(chosen) if metric in OUTCOME_HEADERS else ["tpr", "fpr"]
    keys = ["value", *extra]
    by = ["attribute", "group", "variant"]
    counts = ["stays"] if metric in OUTCOME_HEADERS else ["stays", "positives"]
    rows = summarize(chosen, by, [*keys, *counts])
    small = chosen.groupby(by, sort=False)["small"].any()
    rows["small"] = ["small" if small[tuple(r)] else "" for r in rows[by].itertuples(index=False)]
    for count in counts:
        rows[count] = rows[f"{count}_mean"]
    rows = ordered(rows, audit).rename(columns={"variant": "row"})
    header = METRIC_HEADERS[metric]
    columns = [
        Column("attribute", "Attribute", "Attribute", kind="text"),
        Column("group", "Group", "Group", kind="text"),
        *(Column(c, c.capitalize(), c.capitalize(), kind="number", digits=0) for c in counts),
        Column("value", header, header, digits=3),
        *(Column(key, *[extra_header(key)] * 2, digits=3) for key in extra),
        Column("small", "Small", "Small", kind="text"),
    ]
    if metric in OUTCOME_HEADERS:
        what = f"rows, {header}, {OUTCOME_HEADERS[metric]}"
    else:
        what = (
            f"stays, positives of the decision ({decision_words(metric, audit)}), {header}, "
            "TPR and FPR"
        )
    title = (
        f"{task} by patient group ({audit.split} split): {what}, mean ± sample std over "
        f"seeds; small: fewer than {audit.options.min_group_size} stays, left out of the "
        "disparities."
        + ("" if metric in OUTCOME_HEADERS else " TPR ('–'): no positives; FPR: no negatives.")
    )
    return Table(f"groups_{task}", title, "Method", columns, rows)


OUTCOME_HEADERS = {
    "error": "the share of rows predicted as each class (predicted k)",
    "mae": "the mean prediction",
}
"""What the group table of a multiclass (error) or regression (MAE) task shows beside its
metric (`relif_ray.analysis.group_outcomes`)."""


def outcome_columns(chosen: pd.DataFrame) -> list[str]:
    """The per-group columns of a multiclass or regression task beside its metric."""
    shares = sorted((c for c in chosen if c.startswith("share_")), key=lambda c: int(c[6:]))
    present = [c for c in shares if chosen[c].notna().any()]
    return present or ["mean_prediction"]


def extra_header(key: str) -> str:
    names = {"tpr": "TPR", "fpr": "FPR", "mean_prediction": "Mean prediction"}
    return names.get(key, f"Predicted {key.removeprefix('share_')}")


def decision_words(metric: str, audit: GroupAudit) -> str:
    """What the task's decision calls a positive."""
    if metric == "kappa":
        return f"remaining stay of at least {audit.options.long_stay_hours:g} h"
    every = " per phenotype" if metric == "auroc_macro" else ""
    return f"probability >= {audit.options.threshold:g}{every}"


def disparity_table(audit: GroupAudit, family: Family | None = None) -> Table:
    """Per method, task, attribute and disparity: its value over seeds, its paired difference
    from same-seed ERM with the Student-t interval over seeds, and the verdict."""
    keys = ["task", "attribute", "variant"]
    long = disparity_rows(audit.per_trial, [*keys, "compared"])
    by = [*keys, "metric"]
    rows = summarize(long, by, ["value"])
    compared = long.groupby(by, sort=False)["compared"].agg(
        lambda counts: " / ".join(dict.fromkeys(str(c) for c in counts))
    )
    index = pd.MultiIndex.from_frame(rows[by])
    rows["compared"] = compared.reindex(index).to_numpy()
    verdicts = audit.verdicts.set_index(by).reindex(index)
    for column in ("estimate", "ci_low", "ci_high", "std", "n_seeds", "seeds_needed"):
        rows[f"difference_{column}"] = verdicts[column].to_numpy()
    rows["difference"] = [
        "–"
        if pd.isna(row.estimate)
        else f"{row.estimate:+.3f} [{bound_text(row.ci_low, 0.0, 3)}, "
        f"{bound_text(row.ci_high, 0.0, 3)}]"
        for row in verdicts.itertuples()
    ]
    rows["verdict"] = verdict_column(rows, verdicts, audit, family)
    rows["disparity"] = rows["metric"].map(DISPARITY_NAMES)
    for column in ("p", *FAMILY_COLUMNS):
        if column in verdicts:
            rows[column] = verdicts[column].array
    rows = ordered(rows, audit).rename(columns={"variant": "row"})
    columns = [
        Column("task", "Task", "Task", kind="text"),
        Column("attribute", "Attribute", "Attribute", kind="text"),
        Column("disparity", "Disparity", "Disparity", kind="text"),
        Column("compared", "Groups compared", "Groups", kind="text"),
        Column("value", "Value", "Value", digits=3),
        Column("difference", "Δ vs same-seed ERM [interval]", r"$\Delta$ vs ERM", kind="text"),
        Column("verdict", "Verdict over seeds", "Verdict", kind="text"),
    ]
    title = (
        f"Group disparities ({audit.split} split) over the groups of at least "
        f"{audit.options.min_group_size} stays with both classes of the decision (Fairlearn): "
        "DP difference, the largest gap in selection rate; EO difference, the larger of the "
        "largest gaps in TPR and FPR; metric gap, the largest gap in the task's metric; "
        "for a multiclass or regression task (groups of at least that many rows), error gap, "
        "the largest gap in the error rate or MAE, and prediction gap, the largest gap in the "
        "mean prediction (multiclass: in the share predicted as any one class). "
        "Value: mean ± sample std over seeds. Δ vs same-seed ERM: the mean over seeds of each "
        f"seed's difference from its ERM trial's [{audit.level:.0%} Student-t interval over "
        "seeds]; the verdict says whether the method's gap is lower or higher than ERM's over "
        "seeds (lower: narrower)."
    )
    if family is not None and ADJUSTMENTS[family.adjust]:
        title += (
            f" A shown verdict says whether it also holds after {ADJUSTMENTS[family.adjust]} "
            f"over the report's family of {family.comparisons} (listed under its summary)."
        )
    return Table("group_disparities", title, "Method", columns, rows)


def verdict_column(
    rows: pd.DataFrame, verdicts: pd.DataFrame, audit: GroupAudit, family: Family | None
) -> list[str]:
    """Per row of the disparity table (`verdicts`: the audit's verdicts in its order), the
    verdict, with the adjustment over `family` where given; "reference" for plain ERM, "–"
    without a verdict."""
    compared = rows["variant"].isin(set(audit.paired["variant"])).to_numpy()
    adjusted = verdicts.get("p_adjusted", pd.Series(np.nan, index=verdicts.index))
    cells = []
    for verdict, p_adjusted, with_erm in zip(verdicts["verdict"], adjusted, compared, strict=True):
        if not with_erm:
            cells.append("reference")
        elif pd.isna(verdict):
            cells.append("–")
        else:
            cells.append(verdict if family is None else family.verdict(verdict, p_adjusted))
    return cells


def attribute_words(audit: GroupAudit) -> str:
    """The audited attributes in words: the clinical ones as the clinical docs name them, a
    table's groups by name with their groups."""
    attributes = list(dict.fromkeys(audit.per_trial["attribute"]))
    if attributes == list(ATTRIBUTES):
        bands = ", ".join(band_names(audit.options.age_bands))
        return f"gender, age in bands ({bands}) and ethnicity"
    groups = audit.per_group.groupby("attribute", sort=False)["group"].unique()
    return "; ".join(f"{name} ({', '.join(map(str, groups[name]))})" for name in attributes)


def group_section(audit: GroupAudit, tables: list[Table | Skipped], ci: CISettings) -> str:
    """The report's group-fairness section: what was audited, then the tables."""
    heading = f"## {TITLE}\n"
    if audit.skipped is not None:
        return heading + f"Skipped: {audit.skipped}.\n"
    options = audit.options
    lines = [
        heading,
        "Group fairness within each task (Fairlearn's MetricFrame and disparity metrics), "
        f"beside the fixed-δ audit's individual fairness across tasks: {attribute_words(audit)}, "
        "each missing or "
        f"unknown value in its own group. Decisions: probability >= {options.threshold:g} "
        f"(binary tasks); remaining stay >= {options.long_stay_hours:g} h (length of stay); "
        "the arg-max class (multiclass); regression tasks by their error and prediction. "
        "Each method's disparities are compared with its same-seed ERM trial's over seeds, "
        "with the verdicts of the summary. docs/clinical.md says which groups and what this "
        "measures that the fixed-δ audit does not.",
        *(f"- {note}" for note in audit.notes),
        "",
    ]
    for table in tables:
        task = table.name.removeprefix("groups_")
        title = "Disparities" if table.name == "group_disparities" else task
        lines.append(section(title, table, ci, level=3))
    files = ", ".join(link(name) for name in FILES)
    lines.append(f"Per group, per trial, per seed pair and per comparison over seeds: {files}.\n")
    return "\n".join(lines)
