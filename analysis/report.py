"""`analysis.write_report`, behind `relif report`: every table and figure of the paper for
experiment directories, and a `report.md` (its prose: `relif_ray.analysis.sections` and
`relif_ray.analysis.provenance`) that follows the paper's reporting checklist (section 6): the
source of delta_ref and its calibration distribution, the pair seed and pool construction,
fixed-delta Bias/VR, method-induced thresholds as diagnostics only, utility of the same
checkpoint, and the training and controller settings. The tables: `relif_ray.analysis.tables`
(utility and fixed-delta), `drift_tables` (threshold drift), `relif_tables` (ablation and
controller), `interfaces`, `fronts`, `paired`, `group_tables`.

Output folder:
    report.md                 the report (all tables inline; every link points into this folder)
    tables/<name>.{md,tex,csv}  main, paired (every label against same-seed ERM over seeds:
                              estimates, intervals, verdicts, seeds needed), violation,
                              saturation, interfaces, hypervolume, drift, shift, certificate,
                              ablation, delta_sensitivity, controller (applicable ones),
                              utility (every utility metric of the report split and Delta-M%)
    figures/pareto.png, figures/delta_sensitivity.png, figures/rank_shift.png,
    figures/score_distributions.png, figures/controller_<variant>.png
    per_trial.csv             the per-trial numbers every table aggregates
    pareto_points.csv, pareto_means.csv (with each method's front_share over seed
                              resamples), induced_thresholds.csv, squash_quantiles.csv
    interface_per_trial.csv   per trial and audit interface: Bias, same-seed ERM's, ratio
                              (where the interface table applies)
    delta_ref.json            the held-fixed thresholds and their sources
    clinical data sets only, the group audit (`relif_ray.analysis.groups`,
    `relif_ray.analysis.group_tables`): tables/groups_<task>.*, tables/group_disparities.*,
    group_per_group.csv, group_per_trial.csv, group_paired.csv, group_verdicts.csv

The verdicts of the Summary (`relif_ray.analysis.summary`) and of the group audit are one
family, adjusted together (`relif_ray.analysis.family`, `ReportOptions.adjust`): paired.csv,
group_verdicts.csv and group_disparities.csv carry p, p_adjusted and family_size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from relif_ray.analysis.audit_scores import squash_quantiles
from relif_ray.analysis.controller_activity import (
    ACTIVITY_FILE,
    activity_section,
    controller_activity,
    inert_flags,
)
from relif_ray.analysis.delta import DeltaSpec
from relif_ray.analysis.drift_tables import certificate_table, drift_table, shift_table
from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.family import Family, adjust_verdicts, check_adjustment
from relif_ray.analysis.fronts import hypervolume_table, pareto_means, pareto_points
from relif_ray.analysis.group_tables import FILES, group_section, group_tables
from relif_ray.analysis.groups import GroupAudit, GroupOptions, group_audit, has_attributes
from relif_ray.analysis.interfaces import interface_per_trial, interface_table, skip_reason
from relif_ray.analysis.mtl_metrics import DeltaMOptions
from relif_ray.analysis.paired import paired_summary, paired_table
from relif_ray.analysis.provenance import problems, sources
from relif_ray.analysis.relif_tables import ablation_table, controller_table
from relif_ray.analysis.render import Table
from relif_ray.analysis.results import SENSITIVITY_DELTAS, Results, audit
from relif_ray.analysis.sections import audited_sections
from relif_ray.analysis.summary import verdicts_section
from relif_ray.analysis.tables import (
    CISettings,
    Skipped,
    main_table,
    saturation_table,
    sensitivity_table,
    utility_table,
    violation_table,
)
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.audit import AuditSettings
from relif_ray.errors import UserError
from relif_ray.progress import progress


@dataclass
class ReportOptions:
    """Everything `relif report` can be told. `deltas` empty: the data set's default
    (NYUv2: erm:p75 and erm:p50; MIMIC-III 0.275; eICU 0.06); the first is the primary.
    `adjust`: how the family of the report's verdicts is adjusted
    (`relif_ray.analysis.family.ADJUSTMENTS`)."""

    deltas: list[DeltaSpec] = field(default_factory=list)
    distribution: str = "distances"
    split: str | None = None
    settings: AuditSettings = field(default_factory=AuditSettings)
    sensitivity: tuple[float, ...] = SENSITIVITY_DELTAS
    drift_baseline: str | None = None
    ci: CISettings = field(default_factory=CISettings)
    verdicts: VerdictSettings = field(default_factory=VerdictSettings)
    delta_m: DeltaMOptions = field(default_factory=DeltaMOptions)
    figures: bool = True
    groups: GroupOptions = field(default_factory=GroupOptions)
    adjust: str = "holm"

    def __post_init__(self) -> None:
        check_adjustment(self.adjust)


def write_report(
    experiment: Experiment, out_dir: str | Path, options: ReportOptions | None = None
) -> Path:
    """Write the report folder (see module doc); return report.md's path. The folder is made
    once the audit has run, so a report stopped by a bad input leaves none behind."""
    options = options or ReportOptions()
    out = Path(out_dir)
    parts = ["# relif-ray report\n", sources(experiment)]
    if experiment.trials.empty:
        parts.append("No finished trials: nothing to audit.\n")
    else:
        parts += _audited_sections(experiment, out, options)
    parts.append(problems(experiment))
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.md"
    report.write_text("\n".join(parts))
    return report


def _audited_sections(experiment: Experiment, out: Path, options: ReportOptions) -> list[str]:
    results = audit(
        experiment,
        options.deltas or None,
        options.split,
        options.settings,
        options.distribution,
        options.sensitivity,
        delta_m=options.delta_m,
    )
    if not results.variants:
        raise UserError(
            f"no trial could be audited on the {results.split} split: nothing to report"
        )
    baseline = options.drift_baseline or (
        "relif" if "relif" in results.variants else results.variants[0]
    )
    if baseline not in results.variants:
        raise UserError(
            f"--drift-baseline: no method {baseline!r} (methods: {', '.join(results.variants)})"
        )
    groups = (
        group_audit(experiment, results.split, options.groups, options.verdicts)
        if has_attributes(experiment.trials)
        else None
    )
    verdicts = adjust_verdicts(
        paired_summary(results, options.verdicts),
        groups,
        results.primary,
        options.verdicts,
        options.adjust,
    )
    paired, groups = verdicts.paired, verdicts.groups
    tables = _tables(results, experiment, options, baseline, paired)
    out.mkdir(parents=True, exist_ok=True)
    for table in tables:
        if isinstance(table, Table):
            table.write(out / "tables")
    _write_data(out, experiment, results, options)
    figures = _write_figures(out, experiment, results, options) if options.figures else {}
    named = {table.name: table for table in tables}
    activity = controller_activity(experiment)
    activity.to_csv(out / ACTIVITY_FILE, index=False)
    summary = verdicts_section(
        results,
        paired,
        options.verdicts,
        named["interfaces"],
        verdicts.family,
        inert_flags(activity),
    )
    sections = audited_sections(
        experiment, results, options.settings, options.ci, named, figures, options.verdicts
    )
    if groups is not None:
        sections.append(_group_part(out, groups, options.ci, verdicts.family))
    return [summary, activity_section(activity), *sections]


def _group_part(out: Path, audit: GroupAudit, ci: CISettings, family: Family) -> str:
    """The group audit's tables (its verdicts adjusted over `family`) and files, and its
    section of report.md."""
    tables = group_tables(audit, family)
    for table in tables:
        if isinstance(table, Table):
            table.write(out / "tables")
    if audit.skipped is None:
        frames = (audit.per_group, audit.per_trial, audit.paired, audit.verdicts)
        for name, frame in zip(FILES, frames, strict=True):
            frame.to_csv(out / name, index=False)
    return group_section(audit, tables, ci)


def _tables(
    results: Results,
    experiment: Experiment,
    options: ReportOptions,
    baseline: str,
    paired: pd.DataFrame,
) -> list[Table | Skipped]:
    """Every table of the report (or why it is skipped), in the order they are built."""
    builders = [
        partial(main_table, results, options.ci, paired),
        partial(paired_table, paired, results, options.verdicts),
        partial(violation_table, results),
        partial(saturation_table, results),
        partial(interface_table, results, options.ci, options.verdicts),
        partial(hypervolume_table, results),
        partial(drift_table, results, baseline),
        partial(shift_table, results, options.ci),
        partial(certificate_table, results),
        partial(ablation_table, results, experiment, options.ci),
        partial(sensitivity_table, results, options.ci),
        partial(controller_table, results, experiment, options.ci),
        partial(utility_table, results),
    ]
    return [build() for build in progress(builders, "relif report: tables", unit="table")]


def _write_data(
    out: Path, experiment: Experiment, results: Results, options: ReportOptions
) -> None:
    deltas = results.deltas
    results.per_trial.to_csv(out / "per_trial.csv", index=False)
    results.induced.to_csv(out / "induced_thresholds.csv", index=False)
    squash_quantiles(experiment).to_csv(out / "squash_quantiles.csv", index=False)
    if skip_reason(results) is None:
        interface_per_trial(results).to_csv(out / "interface_per_trial.csv", index=False)
    pareto_points(results).to_csv(out / "pareto_points.csv", index=False)
    pareto_means(results, options.verdicts).to_csv(out / "pareto_means.csv", index=False)
    record = {
        "primary": deltas[0].key,
        "reference_distribution": options.distribution,
        "audit": vars(options.settings),
        "deltas": [vars(d) for d in deltas],
    }
    (out / "delta_ref.json").write_text(json.dumps(record, indent=2) + "\n")


def _write_figures(
    out: Path, experiment: Experiment, results: Results, options: ReportOptions
) -> dict:
    from relif_ray.analysis.figures import (
        controller_figure,
        controller_variants,
        pareto_figure,
        rank_shift_figure,
        score_distributions_figure,
        sensitivity_figure,
        slug,
    )

    folder = out / "figures"
    folder.mkdir(exist_ok=True)
    written: dict = {
        "pareto": folder / "pareto.png",
        "delta_sensitivity": folder / "delta_sensitivity.png",
        "score_distributions": folder / "score_distributions.png",
        "rank_shift": folder / "rank_shift.png",
        "controller": [],
    }
    jobs = [
        (written["pareto"], partial(pareto_figure, results, None, options.verdicts)),
        (written["delta_sensitivity"], partial(sensitivity_figure, results)),
        (written["score_distributions"], partial(score_distributions_figure, results)),
        (written["rank_shift"], partial(rank_shift_figure, results)),
    ]
    for variant in controller_variants(experiment):
        path = folder / f"controller_{slug(variant)}.png"
        jobs.append((path, partial(controller_figure, experiment, variant)))
        written["controller"].append(path)
    for path, draw in progress(jobs, "relif report: figures", unit="figure"):
        draw().savefig(path, dpi=150)
    return written
