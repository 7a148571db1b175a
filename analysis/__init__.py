"""Offline analysis of relif-ray experiments.

The whole API in a few lines (each name is in `__all__`):

    from relif_ray import analysis
    experiment = analysis.load("relif-results/nyuv2")        # or s3://, gs://, file:// URIs
    experiment.trials, experiment.epochs, experiment.traces   # per trial / epoch / step
    results = analysis.audit(experiment, ["erm:p75", "erm:p50"])  # fixed-delta audits
    results.per_trial                                         # one row per trial
    analysis.by_pair(results)                                 # Bias per task pair x method
    analysis.paired_summary(results)                          # every label against same-seed ERM,
                                                              #   over seeds: verdicts and p-values
    analysis.pareto_means(results)                            # the front over methods
    analysis.hypervolume_table(results)                       # hypervolume per method
    analysis.interface_table(results, analysis.CISettings())  # a Bias cut under wider audit
                                                              #   interfaces (the squash's clip?)
    analysis.pareto_figure(results)                           # paper Figure 2
    groups = analysis.group_audit(experiment, options=analysis.GroupOptions(attributes="root/"))
    adjusted = analysis.report_family(results, groups)        # the report's family, adjusted:
    adjusted.paired, adjusted.groups.verdicts, adjusted.family  #   paired.csv, group_verdicts.csv
    analysis.group_tables(adjusted.groups, adjusted.family)   # the report's group-fairness tables
    analysis.write_report(experiment, "report/")              # everything `relif report` writes
"""

from __future__ import annotations

from relif_ray.analysis.breakdown import by_pair, pair_audits
from relif_ray.analysis.experiment import Experiment, load
from relif_ray.analysis.family import report_family
from relif_ray.analysis.fronts import (
    front_with_verdicts,
    hypervolume_table,
    pareto_means,
    pareto_points,
)
from relif_ray.analysis.group_tables import group_tables
from relif_ray.analysis.groups import GroupAudit, GroupOptions, group_audit
from relif_ray.analysis.interfaces import interface_table
from relif_ray.analysis.mtl_metrics import DeltaMOptions
from relif_ray.analysis.paired import front_shares, paired_per_seed, paired_summary
from relif_ray.analysis.report import write_report
from relif_ray.analysis.results import Results, audit
from relif_ray.analysis.tables import CISettings, Skipped
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.audit import AuditSettings
from relif_ray.sweep.selection import non_dominated


def pareto_figure(
    results: Results, title: str | None = None, settings: VerdictSettings | None = None
):
    """The Pareto-front figure (matplotlib Figure); see `relif_ray.analysis.figures`."""
    from relif_ray.analysis.figures import pareto_figure as draw

    return draw(results, title, settings)


__all__ = [
    "AuditSettings",
    "CISettings",
    "DeltaMOptions",
    "VerdictSettings",
    "Experiment",
    "GroupAudit",
    "GroupOptions",
    "Results",
    "Skipped",
    "audit",
    "by_pair",
    "front_shares",
    "front_with_verdicts",
    "group_audit",
    "group_tables",
    "hypervolume_table",
    "interface_table",
    "load",
    "non_dominated",
    "paired_per_seed",
    "paired_summary",
    "pair_audits",
    "report_family",
    "pareto_figure",
    "pareto_means",
    "pareto_points",
    "write_report",
]
