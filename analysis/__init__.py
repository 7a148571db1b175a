"""Offline analysis of relif-ray experiments.

import analysis
experiment = analysis.load("relif-results/nyuv2")        # or s3://, gs://, file:// URIs
experiment.trials, experiment.epochs, experiment.traces   # per trial / epoch / step
results = analysis.audit(experiment, ["erm:p75", "erm:p50"])  # fixed-delta audits
results.per_trial                                         # one row per trial
analysis.by_pair(results)                                 # Bias per task pair x method
analysis.pareto_means(results)                            # the front over methods
analysis.pareto_figure(results)                           # paper Figure 2
analysis.write_report(experiment, "report/")              # everything `relif report` writes
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis.breakdown import by_pair, pair_audits
from analysis.delta import DeltaSpec, as_spec, default_specs, resolve
from analysis.experiment import Experiment, load
from analysis.experiment_audit import ExperimentAudit
from analysis.fronts import pareto_means, pareto_points
from analysis.report import write_report
from analysis.results import SENSITIVITY_DELTAS, Results, compute_results, report_split
from relif_ray.audit import AuditSettings
from relif_ray.errors import UserError
from relif_ray.sweep.selection import non_dominated


def audit(
    experiment: Experiment,
    deltas: Sequence[DeltaSpec | float | str] | DeltaSpec | float | str | None = None,
    split: str | None = None,
    settings: AuditSettings | None = None,
    distribution: str = "distances",
    sensitivity: Sequence[float] = SENSITIVITY_DELTAS,
) -> Results:
    """Audit every finished trial under held-fixed thresholds (the first is the primary).

    deltas: numbers, "M:pQQ" (percentile of method M's validation reference distribution) or
    "M:ALPHA" (split-conformal); None: the data set's default (see `analysis.delta`).
    split: default test where the trials have it, else val.
    """
    trials = experiment.trials
    if trials.empty:
        raise UserError("no finished trials to audit")
    if deltas is None:
        specs = default_specs(list(trials["dataset"]), list(trials["label"]))
    elif isinstance(deltas, DeltaSpec | float | int | str):
        specs = [as_spec(deltas)]
    else:
        specs = [as_spec(value) for value in deltas]
    experiment_audit = ExperimentAudit(experiment, settings)
    resolved = [resolve(spec, experiment_audit, distribution) for spec in specs]
    return compute_results(experiment_audit, resolved, split or report_split(trials), sensitivity)


def pareto_figure(results: Results, title: str | None = None):
    """The Pareto-front figure (matplotlib Figure); see `analysis.figures`."""
    from analysis.figures import pareto_figure as draw

    return draw(results, title)


__all__ = [
    "AuditSettings",
    "Experiment",
    "Results",
    "audit",
    "by_pair",
    "load",
    "non_dominated",
    "pair_audits",
    "pareto_figure",
    "pareto_means",
    "pareto_points",
    "write_report",
]
