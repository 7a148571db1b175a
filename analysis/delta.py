"""Choosing delta_ref once, then holding it fixed for every method (paper section 3.2, B.3).

Three ways, each recorded with its source in the report:

- `--delta 0.275`: a number given by the user (the paper's MIMIC-III 0.275, eICU 0.06).
- `--delta-from M:pQQ`: the QQ-th percentile (numpy's linear interpolation) of a reference
  validation distribution of method label M, e.g. `erm:p75` (the paper's delta_p75).
- `--delta-conformal M:ALPHA`: the split-conformal rule of Theorem B.3
  (`relif_ray.audit_thresholds.conformal_delta`) on the same reference distribution.

The reference distribution (`distribution`), pooled over all trials of label M (its seeds)
on the VALIDATION split, over exactly the pairs the audit samples (same N_eval pools, S pairs,
pair_seed, eval_seed):

- "distances" (default): the cosine-induced distances (1 - cos(f(x), f(y))) / 2 of M's own
  L2-normalised shared representations - the representation-scale "reference-pair distances"
  of Theorem B.3, whose per-task-pair means are M's induced thresholds. Why this one: the
  paper's MIMIC-III delta_ref 0.275 equals ReLiF's mean validation-induced threshold (0.2752,
  Table 3), and at NYUv2's delta_p75 ERM still violates on about 69% of pairs (Table 10),
  which a 75th percentile of ERM's own score gaps could not give (that would be 25% by
  construction).
- "gaps": the audit-score gaps |p_a(x) - p_b(y)| of M (on the shared audit interface).

The paper does not spell the reference distribution out; this is our reading, and a field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from relif_ray.analysis.experiment_audit import ExperimentAudit
from relif_ray.audit import check_delta
from relif_ray.audit_thresholds import conformal_delta, delta_from_quantile
from relif_ray.errors import UserError, finite_number
from relif_ray.problems import benchmark

DISTRIBUTIONS = ("distances", "gaps")
CALIBRATED_DEFAULT = ["erm:p75", "erm:p50"]
"""The default of a benchmark without one held-fixed delta_ref (NYUv2): ERM's p75 and p50."""


@dataclass(frozen=True)
class DeltaSpec:
    """A delta option as given: kind ("fixed", "quantile", "conformal") and its text."""

    kind: str
    text: str

    @property
    def flag(self) -> str:
        flag = {"fixed": "--delta", "quantile": "--delta-from", "conformal": "--delta-conformal"}
        return f"{flag[self.kind]} {self.text}"


@dataclass(frozen=True)
class DeltaRef:
    """One held-fixed delta_ref and where it came from.

    key: short column name ("p75", "0.275", "conf0.1"); symbol / latex: how headers name it;
    source: one sentence for the report; reference: the label it was calibrated on (or None);
    n: the size of the calibration distribution (0 for a given number).
    """

    value: float
    key: str
    symbol: str
    latex: str
    source: str
    reference: str | None = None
    n: int = 0


def fixed(text: str) -> DeltaSpec:
    return DeltaSpec("fixed", text)


def quantile(text: str) -> DeltaSpec:
    return DeltaSpec("quantile", text)


def conformal(text: str) -> DeltaSpec:
    return DeltaSpec("conformal", text)


def as_spec(value: DeltaSpec | float | str) -> DeltaSpec:
    """A delta option from Python: a DeltaSpec, a number (fixed), "M:pQQ" (quantile of M's
    reference distribution) or "M:ALPHA" (split-conformal on it)."""
    if isinstance(value, DeltaSpec):
        return value
    if isinstance(value, int | float):
        return fixed(repr(float(value)))
    text = str(value)
    if ":" not in text:
        return fixed(text)
    return quantile(text) if text.partition(":")[2].startswith("p") else conformal(text)


def default_specs(datasets: list[str], labels: list[str]) -> list[DeltaSpec]:
    """The paper's choices per data set: the benchmark's delta_ref (MIMIC-III 0.275, eICU
    0.06), else ERM's p75 and p50 (NYUv2), which need ERM trials to calibrate on."""
    if len(set(datasets)) != 1:
        raise UserError(
            f"trials of several data sets ({', '.join(sorted(set(datasets)))}): delta_ref is "
            "chosen per data set, report one data set at a time"
        )
    dataset = datasets[0]
    delta_ref = benchmark(dataset, "data set of the trials").delta_ref
    if delta_ref is not None:
        return [fixed(f"{delta_ref:g}")]
    if "erm" not in labels:
        raise UserError(
            f"no delta option given and no ERM trials to calibrate delta_ref on ({dataset}): "
            "give --delta D, --delta-from LABEL:pQQ or --delta-conformal LABEL:ALPHA"
        )
    return [quantile(text) for text in CALIBRATED_DEFAULT]


def resolve(spec: DeltaSpec, audit: ExperimentAudit, distribution: str = "distances") -> DeltaRef:
    """The number behind one delta option, calibrated where it says so."""
    if spec.kind == "fixed":
        value = check_delta(finite_number(spec.text, spec.flag), spec.flag)
        return DeltaRef(
            value,
            f"{value:g}",
            f"δ={value:g}",
            f"\\delta={value:g}",
            f"given as a number ({spec.flag})",
        )
    label, _, argument = spec.text.partition(":")
    if not label or not argument:
        raise UserError(
            f"{spec.flag}: expected LABEL:{'pQQ' if spec.kind == 'quantile' else 'ALPHA'}"
        )
    values = reference_distribution(audit, label, distribution, spec.flag)
    described = _describe(audit, label, distribution, values.size)
    if spec.kind == "quantile":
        match = re.fullmatch(r"p(\d+(?:\.\d+)?)", argument)
        if not match or not 0 <= float(match.group(1)) <= 100:
            raise UserError(f"{spec.flag}: the quantile must look like p75 (0..100)")
        percent = float(match.group(1))
        name = f"p{match.group(1)}"
        value = delta_from_quantile(values, percent / 100)
        return DeltaRef(
            value,
            name,
            f"δ_{name}",
            f"\\delta_{{{name}}}",
            f"the {percent:g}th percentile (linear interpolation) of {described} ({spec.flag})",
            label,
            values.size,
        )
    alpha = finite_number(argument, spec.flag)
    if not 0.0 < alpha < 1.0:
        raise UserError(f"{spec.flag}: alpha must be in (0, 1)")
    value = conformal_delta(values, alpha)
    return DeltaRef(
        value,
        f"conf{alpha:g}",
        f"δ_conf(α={alpha:g})",
        f"\\delta_{{\\mathrm{{conf}},\\alpha={alpha:g}}}",
        f"the split-conformal threshold (Theorem B.3, k = ceil((n+1)(1-α)), "
        f"α={alpha:g}) of {described} ({spec.flag})",
        label,
        values.size,
    )


def reference_distribution(
    audit: ExperimentAudit, label: str, distribution: str, flag: str = "delta"
) -> np.ndarray:
    """The pooled validation distances (or gaps) of every trial of `label`, in trial order
    and task-pair order."""
    if distribution not in DISTRIBUTIONS:
        raise UserError(f"reference distribution: must be one of {DISTRIBUTIONS}")
    trials = audit.experiment.trials
    chosen = list(trials.loc[trials["label"] == label, "trial"]) if len(trials) else []
    if not chosen:
        known = ", ".join(dict.fromkeys(trials["label"])) if len(trials) else "none"
        raise UserError(f"{flag}: no finished trials with label {label!r} (labels: {known})")
    if distribution == "gaps":
        gaps = audit.gaps("val")
        parts = [values for trial in chosen for values in gaps[trial].gaps.values()]
    else:
        parts = [values for trial in chosen for values in audit.distances(trial).values()]
    return np.concatenate(parts)


def _describe(audit: ExperimentAudit, label: str, distribution: str, n: int) -> str:
    trials = audit.experiment.trials
    seeds = sorted(trials.loc[trials["label"] == label, "seed"])
    what = (
        "the cosine-induced distances (1 - cos)/2 of its shared validation representations"
        if distribution == "distances"
        else "its validation audit-score gaps |p_a(x) - p_b(y)|"
    )
    settings = audit.settings
    return (
        f"{label}'s reference distribution: {what} over the audit's sampled validation pairs "
        f"(N_eval={settings.pool_size}, S={settings.pairs}, pair_seed={settings.pair_seed}, "
        f"eval_seed={settings.eval_seed}), pooled over task pairs and seeds "
        f"{', '.join(map(str, seeds))} (n={n})"
    )
