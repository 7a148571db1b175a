"""Per-trial results under one held-fixed delta_ref: the single source every table reads.

`compute_results` audits every finished trial on the report split and collects, per trial:
utility of the same checkpoint (Worst, Macro, native metrics), fixed-delta Bias and VR at every
delta_ref, Bias at the delta-sensitivity grid, the validation-induced thresholds (diagnostics),
the "raw" Bias/VR at the trial's own induced thresholds, and its drift budget
eps = sum_ab w_ab |delta_m,ab - delta_ref| (Theorem B.2, w_ab = 1 / #task pairs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from relif_ray.analysis.audit_scores import squash_quantiles
from relif_ray.analysis.delta import DeltaRef, DeltaSpec, as_spec, default_specs, resolve
from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.experiment_audit import ExperimentAudit
from relif_ray.analysis.mtl_metrics import DeltaMOptions, delta_m_per_trial
from relif_ray.analysis.render import latex_escape
from relif_ray.audit import AuditGaps, AuditSettings
from relif_ray.audit_bootstrap import bootstrap_bias_cis_batch
from relif_ray.audit_thresholds import drift_budget
from relif_ray.errors import UserError
from relif_ray.problems import benchmark
from relif_ray.squash import PAPER_INTERFACE, audit_interface

SATURATION_FLAG = 0.2
"""A method is flagged when, on a squashed task, its share of audit scores clipped at 0 or at
1 exceeds its same-seed ERM trial's by more than this (mean over seeds): its gaps may shrink
because the audit clips its scores, not because it became Lipschitz-fair."""

SENSITIVITY_DELTAS = (0.15, 0.20, 0.275, 0.35, 0.45)
"""The delta grid of the paper's fixed-delta sensitivity table (appendix B.2)."""

SPLITS = ("val", "test")
"""The splits a trial's outputs may hold and a report may audit."""


@dataclass
class Results:
    """per_trial: one row per finished trial: trial, variant, label, method, relif, seed,
    worst, macro, native metrics, bias_<key> / vr_<key> per delta_ref, bias_at_<delta> per
    sensitivity delta, induced_mean, raw_bias, raw_vr, drift (for the primary delta_ref),
    the saturation columns where scores are squashed, and last delta_m (Delta-M% as
    `delta_m` says, `relif_ray.analysis.mtl_metrics.delta_m_per_trial`).
    induced: trial, pair, induced (validation-induced thresholds, diagnostics only)."""

    per_trial: pd.DataFrame
    induced: pd.DataFrame
    deltas: list[DeltaRef]
    sensitivity: list[float]
    split: str
    native: list[tuple[str, str, str, str]]
    variants: list[str]
    audit: ExperimentAudit
    delta_m: DeltaMOptions = field(default_factory=DeltaMOptions)
    _intervals: dict = field(default_factory=dict, repr=False)
    _interfaces: dict = field(default_factory=dict, repr=False)

    @property
    def primary(self) -> DeltaRef:
        return self.deltas[0]

    @property
    def interface(self) -> str:
        """The audit interface of every number here (`relif_ray.squash.AUDIT_INTERFACES`)."""
        return self.audit.interface

    def under(self, interface: str) -> Results:
        """The same trials on another audit interface, at the same primary delta VALUE (even
        where it was calibrated on audit-score gaps), split, pools and pairs, without the
        sensitivity grid: what the audit-interface table compares (no retraining). Cached."""
        if interface == self.interface:
            return self
        if interface not in self._interfaces:
            audit = self.audit.under(interface)
            self._interfaces[interface] = compute_results(
                audit, [self.primary], self.split, (), self.delta_m
            )
        return self._interfaces[interface]

    def bias_ci(
        self, trials: list[str], delta: float | None, n_boot: int, level: float
    ) -> tuple[float, float]:
        """Percentile bootstrap interval of the mean Bias of `trials` (the seeds of one
        method) at `delta`, or each at its own induced thresholds when `delta` is None.

        `relif_ray.audit_bootstrap.bootstrap_bias_ci` on the trials' gaps stacked as one
        audit with a stratum per (task pair, trial), whose aggregate is the mean over the
        trials: each replicate resamples every trial's S gaps within every task pair. It
        measures the pair-sampling uncertainty, not the spread over seeds (that is the ± std).
        Cached, as several tables show the same Bias; at a number, the intervals at every
        delta the tables show (`deltas` and `sensitivity`) come from one resampling
        (`relif_ray.audit_bootstrap.bootstrap_bias_cis_batch`: each as it would be alone, to
        float rounding), with every variant's trials in the same batch.
        """
        cache_key = (tuple(trials), delta, n_boot, level)
        if cache_key not in self._intervals:
            self._bias_cis(trials, delta, n_boot, level)
        return self._intervals[cache_key]

    def _bias_cis(self, trials: list[str], delta: float | None, n_boot: int, level: float) -> None:
        """The intervals of `trials` and of every variant's trials (the lists the tables ask
        for next) at `delta` and every delta the tables show, or at the induced thresholds,
        as one batch (`relif_ray.audit_bootstrap.bootstrap_bias_cis_batch`)."""
        lists = [
            listed
            for listed in dict.fromkeys([tuple(trials), *self._variant_trials()])
            if (listed, delta, n_boot, level) not in self._intervals
        ]
        stacked = [self._stacked_gaps(listed) for listed in lists]
        if delta is None:
            values: list[float | None] = [None]
            induced = self.induced.set_index(["trial", "pair"])["induced"]
            requests = [(gaps, [stratum_thresholds(gaps, induced)]) for gaps in stacked]
        else:
            shown = [d.value for d in self.deltas] + [float(d) for d in self.sensitivity]
            values = list(dict.fromkeys([delta, *shown]))
            requests = [(gaps, values) for gaps in stacked]
        batch = bootstrap_bias_cis_batch(requests, n_boot, level)
        for listed, bounds in zip(lists, batch, strict=True):
            for value, interval in zip(values, bounds, strict=True):
                self._intervals[listed, value, n_boot, level] = interval

    def _variant_trials(self) -> list[tuple[str, ...]]:
        """Each variant's trials in `per_trial`'s order, as the tables list them."""
        return [
            tuple(self.per_trial.loc[self.per_trial["variant"] == variant, "trial"])
            for variant in self.variants
        ]

    def _stacked_gaps(self, trials: tuple[str, ...]) -> AuditGaps:
        """The trials' gaps as one audit with a stratum per (task pair, trial), whose
        aggregate Bias is the mean over the trials."""
        gaps = self.audit.gaps(self.split)
        return AuditGaps(
            {f"{pair}@{t}": values for t in trials for pair, values in gaps[t].gaps.items()}
        )


def stratum_thresholds(stacked: AuditGaps, induced: pd.Series) -> dict[str, float]:
    """Each stratum's (`Results._stacked_gaps`: "<pair>@<trial>") own validation-induced
    threshold, from `induced` indexed by (trial, pair)."""
    thresholds = {}
    for key in stacked.gaps:
        pair, trial = key.rsplit("@", 1)
        thresholds[key] = float(induced[trial, pair])
    return thresholds


def audit(
    experiment: Experiment,
    deltas: Sequence[DeltaSpec | float | str] | DeltaSpec | float | str | None = None,
    split: str | None = None,
    settings: AuditSettings | None = None,
    distribution: str = "distances",
    sensitivity: Sequence[float] = SENSITIVITY_DELTAS,
    interface: str = PAPER_INTERFACE,
    delta_m: DeltaMOptions | None = None,
) -> Results:
    """Audit every finished trial under held-fixed thresholds (the first is the primary).

    deltas: numbers, "M:pQQ" (percentile of method M's validation reference distribution) or
    "M:ALPHA" (split-conformal); None: the data set's default (see `relif_ray.analysis.delta`).
    split: default test where the trials have it, else val (`report_split`).
    interface: how squashed (non-probability) scores are mapped into [0, 1], a name of
    `relif_ray.squash.AUDIT_INTERFACES`: "q10-q90" (the paper's squash), "q1-q99" or "ecdf"
    (the same-seed ERM empirical CDF); a delta calibrated on "gaps" is calibrated on it too.
    delta_m: how per_trial's `delta_m` is computed (default: LibMTL's, against same-seed ERM).
    """
    audit_interface(interface)
    trials = experiment.trials
    if trials.empty:
        raise UserError("no finished trials to audit")
    split = split or report_split(trials)
    if split not in SPLITS or f"{split}_worst" not in trials.columns:
        raise UserError(f"--split {split}: the trials have no {split} split")
    if deltas is None:
        specs = default_specs(list(trials["dataset"]), list(trials["label"]))
    elif isinstance(deltas, DeltaSpec | float | int | str):
        specs = [as_spec(deltas)]
    else:
        specs = [as_spec(value) for value in deltas]
    experiment_audit = ExperimentAudit(experiment, settings, interface)
    resolved = [resolve(spec, experiment_audit, distribution) for spec in specs]
    keys = [delta.key for delta in resolved]
    if len(set(keys)) < len(keys):
        raise UserError(f"delta options: the same threshold is given twice ({keys})")
    return compute_results(experiment_audit, resolved, split, sensitivity, delta_m)


def native_metrics(dataset: str) -> list[tuple[str, str, str, str]]:
    """The native task metrics of the main table of `dataset` (its benchmark's
    `report_metrics`): (metric, header, LaTeX header, better); empty where the benchmark names
    none (each task's normalized score `<task>_score` is shown instead)."""
    described = benchmark(dataset, "data set of the trials")
    return [
        (
            metric.column,
            metric.header,
            metric.latex or latex_escape(metric.header),
            direction(described.metric_directions.get(metric.column)),
        )
        for metric in described.report_metrics
    ]


def direction(higher_is_better: bool | None) -> str | None:
    """A metric's declared direction as the tables' `better`: "higher", "lower" or None."""
    if higher_is_better is None:
        return None
    return "higher" if higher_is_better else "lower"


def report_split(trials: pd.DataFrame) -> str:
    """Utility is reported on the test split where trials have one, else on validation."""
    return "test" if "test_worst" in trials.columns else "val"


def sensitivity_key(delta: float) -> str:
    return f"bias_at_{delta:g}"


def compute_results(
    audit: ExperimentAudit,
    deltas: list[DeltaRef],
    split: str,
    sensitivity: Sequence[float] = SENSITIVITY_DELTAS,
    delta_m: DeltaMOptions | None = None,
) -> Results:
    """Audit every finished trial of `audit.experiment` on `split` (see module doc)."""
    delta_m = delta_m or DeltaMOptions()
    trials = audit.experiment.trials
    if f"{split}_worst" not in trials.columns or trials[f"{split}_worst"].isna().any():
        missing = (
            trials["trial"].iloc[0]
            if f"{split}_worst" not in trials.columns
            else trials.loc[trials[f"{split}_worst"].isna(), "trial"].iloc[0]
        )
        raise UserError(f"--split {split}: trial {missing} has no {split} metrics")
    datasets = sorted(set(trials["dataset"]))
    native = native_metrics(datasets[0]) if len(datasets) == 1 else []
    if not native:
        tasks = sorted(audit.scores["task"].astype(str).unique())
        native = [(f"{t}_score", f"{t} score", latex_escape(f"{t} score"), "higher") for t in tasks]
    native = [entry for entry in native if f"{split}_{entry[0]}" in trials.columns]
    per_trial = trials[["trial", "variant", "label", "method", "relif", "seed"]].copy()
    for metric in ["worst", "macro", *(entry[0] for entry in native)]:
        per_trial[metric] = trials[f"{split}_{metric}"].to_numpy(dtype=np.float64)
    fixed = audit.fixed(sorted({d.value for d in deltas}), split)  # two refs may coincide
    for delta in deltas:
        chosen = fixed[fixed["delta"] == delta.value].set_index("trial")
        per_trial[f"bias_{delta.key}"] = chosen.loc[per_trial["trial"], "bias"].to_numpy()
        per_trial[f"vr_{delta.key}"] = chosen.loc[per_trial["trial"], "vr"].to_numpy()
    grid = audit.fixed(list(sensitivity), split)
    for delta in sensitivity:
        chosen = grid[grid["delta"] == delta].set_index("trial")
        per_trial[sensitivity_key(delta)] = chosen.loc[per_trial["trial"], "bias"].to_numpy()
    induced = audit.induced()
    _add_raw(per_trial, induced, audit.gaps(split), deltas[0].value)
    _add_saturation(per_trial, audit, split)
    epochs = audit.experiment.epochs if delta_m.epochs != "final" else None
    per_trial["delta_m"] = delta_m_per_trial(trials, split, delta_m, epochs).to_numpy()
    return Results(
        per_trial=per_trial,
        induced=induced,
        deltas=deltas,
        sensitivity=list(sensitivity),
        split=split,
        native=native,
        variants=list(dict.fromkeys(per_trial["variant"])),
        audit=audit,
        delta_m=delta_m,
    )


def _add_raw(
    per_trial: pd.DataFrame, induced: pd.DataFrame, gaps: dict[str, AuditGaps], ref: float
) -> None:
    """Raw audit (each trial at its own induced thresholds) and drift budget per trial."""
    raw_bias, raw_vr, drift, means = [], [], [], []
    by_trial = {trial: rows for trial, rows in induced.groupby("trial", sort=False)}
    for trial in per_trial["trial"]:
        rows = by_trial[trial]
        per_pair = dict(zip(rows["pair"], rows["induced"], strict=True))
        means.append(per_pair.pop("mean"))
        result = gaps[trial].audit(per_pair)
        raw_bias.append(result.bias)
        raw_vr.append(result.vr)
        drift.append(drift_budget(per_pair, ref))
    per_trial["induced_mean"] = means
    per_trial["raw_bias"] = raw_bias
    per_trial["raw_vr"] = raw_vr
    per_trial["drift"] = drift


def _add_saturation(per_trial: pd.DataFrame, audit: ExperimentAudit, split: str) -> None:
    """Per squashed task: `clip0_<task>` / `clip1_<task>`, the share of the trial's valid
    audit scores on `split` that the squash clipped to 0 / 1; and `saturation_excess`, the
    largest of these shares minus its same-seed ERM trial's (NaN without such a trial in the
    experiment, e.g. constants lent by `--reference`)."""
    quantiles = squash_quantiles(audit.experiment)
    if quantiles.empty:
        return
    scores = audit.scores
    scores = scores[(scores["split"] == split) & scores["valid"].astype(bool)]
    squashed = scores[scores["task"].isin(set(quantiles["task"]))]
    grouped = squashed.groupby(["trial", "task"], observed=True)["score"]
    shares = pd.DataFrame({"clip0": grouped.apply(lambda s: (s <= 0).mean())})
    shares["clip1"] = grouped.apply(lambda s: (s >= 1).mean())
    wide = shares.unstack("task")
    columns = [f"{bound}_{task}" for bound, task in wide.columns]
    wide.columns = columns
    wide.index = wide.index.astype(str)
    for column in columns:
        per_trial[column] = wide[column].reindex(per_trial["trial"]).to_numpy()
    reference = quantiles.drop_duplicates("trial").set_index("trial")["reference"]
    table = per_trial.set_index("trial")[columns]
    excess = []
    for trial in per_trial["trial"]:
        erm = reference.get(trial)
        if erm not in table.index:
            excess.append(np.nan)
            continue
        excess.append(float((table.loc[trial] - table.loc[erm]).max()))
    per_trial["saturation_excess"] = excess
