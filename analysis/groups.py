"""Group fairness beside the fixed-delta audit: does each clinical task treat the patients of
each sex, age band and ethnicity alike, and does a method widen or narrow the gaps?

The fixed-delta audit (`relif_ray.analysis.results`) measures individual fairness across tasks. This
audit measures group fairness within each task, with Fairlearn (`MetricFrame` and its
disparity metrics) on what every clinical trial stores (`relif_ray.experiment.outputs`: its
outcomes and its stays' names), joined by stay to the sensitive attributes of the data set's
files (`relif_ray.problems.AttributeSource`). Nothing is retrained: other attributes,
thresholds or bands re-audit a saved experiment.

`GroupAudit.per_group`, per trial, task, attribute and group: stays, samples (labelled stays,
    steps or stay-label pairs), positives; `value`, the task's own metric (`TASK_METRICS`:
    AUROC; macro AUROC over the phenotypes; linear-weighted kappa over the length-of-stay
    bins); tpr, fpr and selection_rate of the task's decision (NaN where the group has no
    positives, or no negatives, to rate); `small`: fewer than `min_group_size` stays.
`GroupAudit.per_trial`, per trial, task and attribute, over the COMPARED groups (at least
    `min_group_size` stays and both classes of the decision): Fairlearn's
    demographic_parity_difference (the largest between-group gap in selection rate) and
    equalized_odds_difference (the larger of the largest gaps in TPR and in FPR), and
    metric_gap, the largest between-group gap in the task's own metric (the largest minus
    the smallest of the compared groups' values in the `MetricFrame`); NaN with fewer than
    two compared groups. `overall`: the task's metric over every sample, the trial's own
    metric.
`GroupAudit.paired`, per trial other than the plain ERM ones: each of those three against
    the same-seed ERM trial's (`relif_ray.analysis.audit_scores.erm_partner`): label, variant, seed,
    attribute, task, metric, value, erm_value, difference (NaN without one same-seed ERM).
`GroupAudit.verdicts`, per variant, task, attribute and disparity: those differences over
    seeds, summed up by `relif_ray.analysis.verdicts.compare_differences` (mean, Student-t interval,
    verdict in words, seeds needed where not shown, p-value); in a report, adjusted with the
    Summary's verdicts over the report's family (`relif_ray.analysis.family.adjust_verdicts`
    adds its p_adjusted and family_size).

Decisions (`decisions`): a binary task (mortality, decompensation, each phenotype) predicts
positive where sigmoid(logit) >= `threshold`; length of stay is "long" where the remaining
stay is at least `long_stay_hours`, and predicted long where the arg-max bin starts there or
later.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from fairlearn.metrics import (
    false_positive_rate,
    selection_rate,
    true_positive_rate,
)
from scipy.special import expit

from relif_ray.analysis.audit_scores import erm_partner
from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.group_outcomes import (
    OUTCOME_DISPARITIES,
    OUTCOME_METRICS,
    group_tables,
    metric_frames,
    outcome_groups_by_trial,
)
from relif_ray.analysis.results import report_split
from relif_ray.analysis.verdicts import VerdictSettings, compare_differences
from relif_ray.data.attributes import UNKNOWN, band_names
from relif_ray.errors import UserError
from relif_ray.problems import AttributeSource, benchmark
from relif_ray.tasks import clinical
from relif_ray.tasks.clinical import LOS_BIN_EDGES_HOURS

ATTRIBUTES = ("gender", "age", "ethnicity")
"""The audited attributes of the clinical data sets, age as bands (`age_bands`); a data set
whose attribute table has other columns (a table's groups, `relif_ray.data.tabular`) is
audited on those, in their order."""
DISPARITIES = ("demographic_parity_difference", "equalized_odds_difference", "metric_gap")
"""The per-trial disparities of a task with a binary decision (the clinical kinds and a
table's binary task), each paired with same-seed ERM in `GroupAudit.paired`."""
ALL_DISPARITIES = (*DISPARITIES, *OUTCOME_DISPARITIES)
"""Every disparity, those of a table's multiclass and regression tasks
(`relif_ray.analysis.group_outcomes`) after the others."""
VERDICT_COLUMNS = [
    "label", "variant", "task", "attribute", "metric", "n_seeds", "estimate", "ci_low",
    "ci_high", "std", "verdict", "seeds_needed", "p",
]  # fmt: skip
"""`GroupAudit.verdicts`' columns (p: the p-value of the verdict's t test, `Comparison.p`); a
report's family adds `relif_ray.analysis.family.FAMILY_COLUMNS`."""
DISPARITY_NAMES = {
    "demographic_parity_difference": "DP difference",
    "equalized_odds_difference": "EO difference",
    "metric_gap": "metric gap",
    "error_gap": "error gap",
    "prediction_gap": "prediction gap",
}
"""How the report names the disparities."""


@dataclass(frozen=True)
class GroupOptions:
    """What the group audit reads and decides; docs/clinical.md says why these defaults.

    attributes: the folder with the sensitive attributes (MIMIC-III: the benchmark's root/;
        eICU: the folder of all_data.csv); None: the trials' data folder where the data set
        keeps them there (eICU), else no group audit (MIMIC-III).
    threshold: the probability at or above which a binary task predicts positive.
    long_stay_hours: a remaining stay of at least this many hours is "long"; one of the
        length-of-stay bin edges (`LOS_BIN_EDGES_HOURS`), so that each bin is long or not.
    age_bands: the inner edges of the age bands in years: (45, 65, 80) gives <45, [45, 65),
        [65, 80), >=80.
    min_group_size: a group with fewer stays is flagged small and left out of the gaps.
    """

    attributes: str | None = None
    threshold: float = 0.5
    long_stay_hours: float = 168.0
    age_bands: tuple[float, ...] = (45.0, 65.0, 80.0)
    min_group_size: int = 50

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise UserError(f"--group-threshold: must be in (0, 1), got {self.threshold:g}")
        if self.long_stay_hours not in LOS_BIN_EDGES_HOURS:
            edges = ", ".join(f"{edge:g}" for edge in LOS_BIN_EDGES_HOURS)
            raise UserError(
                f"--long-stay-hours: must be a length-of-stay bin edge ({edges}), "
                f"got {self.long_stay_hours:g}"
            )
        bands = self.age_bands
        if not bands or list(bands) != sorted(set(bands)) or not all(np.isfinite(bands)):
            raise UserError(f"--age-bands: need increasing finite ages, got {list(bands)}")
        if self.min_group_size < 1:
            raise UserError(f"--min-group-size: must be >= 1, got {self.min_group_size}")


class MissingAttributes(UserWarning):
    """Stays the attribute files do not have: counted in one line (`relif report` prints it),
    and put in the unknown group of every attribute."""


@dataclass
class GroupAudit:
    """The group audit of an experiment's trials on one split (module docstring). `skipped`
    says why there is none (the frames are then empty); `notes` what the reader should know
    (the attribute folder, trials left out)."""

    split: str
    options: GroupOptions
    per_group: pd.DataFrame = field(default_factory=pd.DataFrame)
    per_trial: pd.DataFrame = field(default_factory=pd.DataFrame)
    paired: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdicts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=VERDICT_COLUMNS))
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)
    level: float = VerdictSettings.level
    """The level of the verdicts' intervals and tests."""


def has_attributes(trials: pd.DataFrame) -> bool:
    """Whether any trial's data set has patient attributes (`Benchmark.attributes`): such a
    report has a group-fairness section, audited or saying why not."""
    return any(benchmark(dataset).attributes for dataset in set(trials["dataset"]))


def group_audit(
    experiment: Experiment,
    split: str | None = None,
    options: GroupOptions | None = None,
    verdicts: VerdictSettings | None = None,
) -> GroupAudit:
    """The group audit of every finished trial of a data set with sensitive attributes, on
    `split` (default: test where the trials have it, else val), with verdicts over seeds at
    `verdicts`' level."""
    options = options or GroupOptions()
    trials = experiment.trials
    audit = GroupAudit(split or report_split(trials), options)
    sources = {dataset: benchmark(dataset).attributes for dataset in sorted(set(trials["dataset"]))}
    if not any(sources.values()):
        audit.skipped = f"{', '.join(sources) or 'no data set'}: no patient attributes to audit"
        return audit
    groups, per_trial = [], []
    for dataset, source in sources.items():
        if source is None:
            continue
        chosen = trials[trials["dataset"] == dataset]
        found = _dataset_audit(experiment, chosen, source, audit)
        if found is not None:
            groups.append(found[0])
            per_trial.append(found[1])
    if not groups:
        return audit
    audit.skipped = None
    audit.per_group = pd.concat(groups, ignore_index=True)
    audit.per_trial = pd.concat(per_trial, ignore_index=True)
    audit.paired = paired_differences(audit.per_trial, trials)
    settings = verdicts or VerdictSettings()
    audit.level = settings.level
    audit.verdicts = paired_verdicts(audit.paired, settings)
    return audit


def _dataset_audit(
    experiment: Experiment, trials: pd.DataFrame, source: AttributeSource, audit: GroupAudit
) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The per-group and per-trial frames of one data set's trials, or None (and why, in
    `audit.skipped`)."""
    dataset = trials["dataset"].iloc[0]
    given = audit.options.attributes
    folder = given or (trials["config"].iloc[0]["data"]["root"] if source.in_data_root else None)
    if folder is None:
        audit.skipped = (
            f"{dataset}: no attribute folder given; the attributes are in {source.folder}: "
            "give it as --attributes DIR (GroupOptions.attributes)"
        )
        return None
    outcomes = {trial: experiment.outcomes(trial, audit.split) for trial in trials["trial"]}
    missing = [trial for trial, frame in outcomes.items() if frame is None]
    if missing:
        audit.notes.append(
            f"{len(missing)} {dataset} trial(s) stored no outcomes and are left out: "
            + ", ".join(missing)
        )
    outcomes = {trial: frame for trial, frame in outcomes.items() if frame is not None}
    if not outcomes:
        audit.skipped = f"{dataset}: no trial stored outcomes (outcomes.parquet)"
        return None
    stays = sorted({name for frame in outcomes.values() for name in frame["name"].dropna()})
    try:
        table = source.read(str(folder), stays)
    except UserError as error:
        if given:
            raise
        audit.skipped = (
            f"{dataset}: the trials' data folder is not readable here ({error}); give the "
            "folder as --attributes DIR (GroupOptions.attributes)"
        )
        return None
    audit.notes.append(f"{dataset}: attributes from `{folder}`")
    groups = attribute_groups(table, stays, audit.options.age_bands, str(folder), audit.split)
    kinds = {task.name: task.outcome_kind for task in benchmark(dataset).tasks()}
    ids = trials.set_index("trial")[["label", "variant", "seed"]]
    per_group, per_trial = trial_groups(outcomes, groups, kinds, ids, audit.options)
    leading = ["trial", "label", "variant", "seed", "task", "attribute"]
    return per_group[leading + [c for c in per_group if c not in leading]], per_trial


def trial_groups(
    outcomes: dict[str, pd.DataFrame],
    groups: pd.DataFrame,
    kinds: dict[str, str | None],
    ids: pd.DataFrame,
    options: GroupOptions,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trials' per-group frame and per-trial rows, per task and attribute (`ids`: each
    trial's label, variant and seed, repeated on every row; in the order of `outcomes`)."""
    rows = pd.concat(
        [frame.assign(trial=trial) for trial, frame in outcomes.items()], ignore_index=True
    )
    per_group, per_trial = [], []
    for task, chosen in rows.groupby("task", sort=False):
        for attribute in groups.columns:
            sensitive = groups[attribute].reindex(chosen["name"]).fillna(UNKNOWN).to_numpy()
            trials = chosen["trial"].to_numpy()
            found = task_groups_by_trial(chosen, kinds[task], sensitive, trials, options)
            for trial, (frame, disparities) in found.items():
                keys = {"trial": trial, **ids.loc[trial], "task": task, "attribute": attribute}
                per_group.append(frame.assign(**keys))
                per_trial.append({**keys, "kind": kinds[task], **disparities})
    order = {trial: index for index, trial in enumerate(outcomes)}
    per_group_frame = pd.concat(per_group, ignore_index=True)
    per_trial_frame = pd.DataFrame(per_trial)
    return tuple(  # type: ignore[return-value]
        frame.sort_values("trial", key=lambda t: t.map(order), kind="stable").reset_index(drop=True)
        for frame in (per_group_frame, per_trial_frame)
    )


def attribute_groups(
    table: pd.DataFrame, stays: list[str], edges: tuple[float, ...], folder: str, split: str
) -> pd.DataFrame:
    """Each stay's group per attribute (index: the stay's name; columns: the table's other
    than `stay`, `ATTRIBUTES` for the clinical readers; a numeric `age` banded by `age_band`).
    A stay without an attribute row is in `UNKNOWN` for every attribute, counted in one
    `MissingAttributes` warning."""
    found = table.drop_duplicates("stay").set_index("stay").reindex(stays)
    absent = int((~pd.Index(stays).isin(table["stay"])).sum())
    if absent:
        warnings.warn(
            f"{absent} of {len(stays)} stays of the {split} split have no attribute row in "
            f"{folder}: they are in the '{UNKNOWN}' group of every attribute",
            MissingAttributes,
            stacklevel=2,
        )
    columns = {}
    for attribute in found.columns:
        values = found[attribute]
        if attribute == "age" and pd.api.types.is_numeric_dtype(values):
            columns[attribute] = age_band(values.to_numpy(dtype=np.float64), edges)
        else:
            columns[attribute] = values.fillna(UNKNOWN)
    return pd.DataFrame(columns, index=found.index)


def age_band(ages: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """The band of each age (`band_names(edges)`; NaN: `UNKNOWN`). Bands are half-open:
    edges (45, 65) give <45, [45, 65), >=65."""
    names = np.array(band_names(edges), dtype=object)
    bands = names[np.searchsorted(np.asarray(edges), np.nan_to_num(ages), side="right")]
    return np.where(np.isnan(ages), UNKNOWN, bands)


def decisions(
    kind: str, rows: pd.DataFrame, options: GroupOptions
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(y_true, y_pred, the own metric's sample parameters) of one task's outcome rows (kinds:
    `relif_ray.tasks.base.OUTCOME_KINDS`; the decisions: module docstring)."""
    label = rows["label"].to_numpy(dtype=np.float64)
    prediction = rows["prediction"].to_numpy(dtype=np.float64)
    if kind == "length_of_stay":
        edges = np.asarray(LOS_BIN_EDGES_HOURS)
        true_bin = np.searchsorted(edges, label, side="right")
        long_bin = LOS_BIN_EDGES_HOURS.index(options.long_stay_hours) + 1
        params = {"true_bin": true_bin, "predicted_bin": prediction.astype(np.int64)}
        return (
            (label >= options.long_stay_hours).astype(int),
            (prediction >= long_bin).astype(int),
            params,
        )
    params = {"score": prediction}
    if kind == "multilabel":
        params["label_index"] = rows["position"].to_numpy()
    return label.astype(int), (expit(prediction) >= options.threshold).astype(int), params


def auroc(y_true: np.ndarray, y_pred: np.ndarray, score: np.ndarray) -> float:
    """The task's AUROC of the logits (`relif_ray.tasks.clinical.binary_auroc`; NaN with one
    class)."""
    return clinical.binary_auroc(score, y_true)


def macro_auroc(
    y_true: np.ndarray, y_pred: np.ndarray, score: np.ndarray, label_index: np.ndarray
) -> float:
    """The phenotype task's macro AUROC (`relif_ray.tasks.clinical.macro_auroc`) over the
    labels of the rows."""
    labels = np.unique(label_index)
    return clinical.macro_auroc((score[label_index == k], y_true[label_index == k]) for k in labels)


def kappa(
    y_true: np.ndarray, y_pred: np.ndarray, true_bin: np.ndarray, predicted_bin: np.ndarray
) -> float:
    """The length-of-stay task's linear-weighted kappa over the bins
    (`relif_ray.tasks.clinical.linear_weighted_kappa`; NaN where undefined)."""
    return clinical.linear_weighted_kappa(true_bin, predicted_bin)


TASK_METRICS: dict[str, tuple[str, Callable[..., float]]] = {
    "binary": ("auroc", auroc),
    "multilabel": ("auroc_macro", macro_auroc),
    "length_of_stay": ("kappa", kappa),
}
"""Per outcome kind, the task's own metric: its name in the trials' metrics and the function."""


def task_groups(
    rows: pd.DataFrame, kind: str, sensitive: np.ndarray, options: GroupOptions
) -> tuple[pd.DataFrame, dict[str, float | str | int]]:
    """One task's per-group frame and per-trial disparities for one attribute (`sensitive`:
    each row's group); a multiclass or regression task's are
    `relif_ray.analysis.group_outcomes`'."""
    trials = np.zeros(len(rows), dtype=np.int64)
    return task_groups_by_trial(rows, kind, sensitive, trials, options)[0]


def task_groups_by_trial(
    rows: pd.DataFrame,
    kind: str,
    sensitive: np.ndarray,
    trials: np.ndarray,
    options: GroupOptions,
) -> dict[object, tuple[pd.DataFrame, dict[str, float | str | int]]]:
    """`task_groups` of each trial's rows (`trials`: each row's trial), from one
    `MetricFrame` (`relif_ray.analysis.group_outcomes.metric_frames`)."""
    if kind in OUTCOME_METRICS:
        return outcome_groups_by_trial(rows, kind, sensitive, trials, options.min_group_size)
    y_true, y_pred, params = decisions(kind, rows, options)
    metric, function = TASK_METRICS[kind]
    metrics = {
        "value": function,
        "tpr": true_positive_rate,
        "fpr": false_positive_rate,
        "selection_rate": selection_rate,
    }
    frames = metric_frames(metrics, y_true, y_pred, sensitive, trials, {"value": params})
    ids = rows["example_id"].to_numpy()
    tables = group_tables(
        frames, ids, sensitive, trials, metric, options.min_group_size, positives=y_true
    )
    found = {}
    for trial, (by_group, overall) in frames.items():
        per_group = tables[trial]
        per_group["tpr"] = per_group["tpr"].where(per_group["positives"] > 0)
        per_group["fpr"] = per_group["fpr"].where(per_group["positives"] < per_group["samples"])
        compared = per_group.loc[
            ~per_group["small"] & per_group["tpr"].notna() & per_group["fpr"].notna(), "group"
        ]
        values = by_group["value"].loc[list(compared)]
        found[trial] = (
            per_group,
            {
                "metric": metric,
                "overall": float(overall["value"]),
                "groups": len(per_group),
                "compared": len(compared),
                **_disparities(by_group, set(compared)),
                "metric_gap": float(values.max() - values.min()) if len(compared) > 1 else np.nan,
            },
        )
    return found


def _disparities(by_group: pd.DataFrame, compared: set[str]) -> dict[str, float]:
    """Fairlearn's demographic-parity and equalized-odds differences (`between_groups`, the
    worst case of TPR and FPR) over the compared groups, from the `MetricFrame`'s per-group
    rates: the largest minus the smallest group's selection rate, and the larger of that gap
    in TPR and in FPR (NaN with fewer than two groups). `demographic_parity_difference` and
    `equalized_odds_difference` on the compared groups' rows give the same numbers (tested);
    each would compute a `MetricFrame` of its own again."""
    if len(compared) < 2:
        return dict.fromkeys(DISPARITIES[:2], np.nan)
    rates = by_group.loc[sorted(compared)]

    def gap(column: str) -> float:
        return float(rates[column].max() - rates[column].min())

    return {
        "demographic_parity_difference": gap("selection_rate"),
        "equalized_odds_difference": max(gap("tpr"), gap("fpr")),
    }


def paired_differences(per_trial: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Each trial's disparities (`DISPARITIES`) against its same-seed ERM trial's
    (`relif_ray.analysis.audit_scores.erm_partner`, the pairing of every comparison with ERM), one
    row per trial, attribute, task and disparity: label, variant, seed, attribute, task, metric,
    value, erm_value, difference (value - erm_value), trial, erm_trial. The plain ERM trials
    themselves are left out; a trial without exactly one same-seed ERM trial has NaN."""
    partner = erm_partner(trials)
    keys = ["trial", "label", "variant", "seed", "attribute", "task"]
    long = disparity_rows(per_trial, keys)
    values = long.set_index(["trial", "attribute", "task", "metric"])["value"]
    long["erm_trial"] = long["trial"].map(partner)
    index = pd.MultiIndex.from_arrays(
        [long["erm_trial"], long["attribute"], long["task"], long["metric"]]
    )
    long["erm_value"] = values.reindex(index).to_numpy()
    long["difference"] = long["value"] - long["erm_value"]
    long = long[long["erm_trial"] != long["trial"]]
    columns = ["label", "variant", "seed", "attribute", "task", "metric", "value", "erm_value"]
    return long[[*columns, "difference", "trial", "erm_trial"]].reset_index(drop=True)


def disparity_rows(per_trial: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`per_trial` in long form: `keys`, metric (each disparity of the row's task kind) and
    value; the disparities of other kinds are not rows (without a `kind` column: a binary
    decision's)."""
    columns = [name for name in ALL_DISPARITIES if name in per_trial]
    kinds = per_trial if "kind" in per_trial else per_trial.assign(kind="binary")
    long = kinds.melt([*keys, "kind"], columns, var_name="metric", value_name="value")
    applies = [
        metric in (OUTCOME_DISPARITIES if kind in OUTCOME_METRICS else DISPARITIES)
        for metric, kind in zip(long["metric"], long["kind"], strict=True)
    ]
    return long[applies].drop(columns="kind").reset_index(drop=True)


def paired_verdicts(paired: pd.DataFrame, settings: VerdictSettings) -> pd.DataFrame:
    """Per variant, task, attribute and disparity, its paired differences from same-seed ERM
    over seeds as `relif_ray.analysis.verdicts.compare_differences` sums them up: n_seeds, the mean
    difference with its Student-t interval, the sample std, the verdict in words ("lower than
    ERM (95%, 3 seeds)": the method narrows the gap), where not shown the seeds needed, and
    the p-value of the verdict's t test."""
    rows = []
    keys = ["variant", "task", "attribute", "metric"]
    for (variant, task, attribute, metric), chosen in paired.groupby(keys, sort=False):
        differences = chosen.sort_values("seed")["difference"].to_numpy()
        found = compare_differences(differences, settings)
        if found.n == 0:  # no seed had two groups to compare
            found = replace(found, verdict="no seed with two groups to compare")
        rows.append(
            [
                chosen["label"].iloc[0], variant, task, attribute, metric, found.n,
                found.estimate, found.ci_low, found.ci_high, found.std, found.verdict,
                found.seeds_needed, found.p,
            ]
        )  # fmt: skip
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)
