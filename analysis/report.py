"""`relif report`: every table and figure of the paper for experiment directories, and a
`report.md` that follows the paper's reporting checklist (section 6): the source of delta_ref
and its calibration distribution, the pair seed and pool construction, fixed-delta Bias/VR,
method-induced thresholds as diagnostics only, utility of the same checkpoint, and the
controller settings.

Output folder:
    report.md                 the report (all tables inline; every link points into this folder)
    tables/<name>.{md,tex,csv}  main, violation, drift, shift, certificate, ablation,
                              delta_sensitivity, controller (applicable ones), utility (every
                              utility metric of the report split)
    figures/pareto.png, figures/delta_sensitivity.png, figures/controller_<variant>.png
    per_trial.csv             the per-trial numbers every table aggregates
    pareto_points.csv, pareto_means.csv, induced_thresholds.csv, squash_quantiles.csv
    delta_ref.json            the held-fixed thresholds and their sources
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from analysis import delta as delta_options
from analysis.audit_scores import squash_quantiles, squashed_tasks
from analysis.delta import DeltaRef, DeltaSpec
from analysis.experiment import Experiment
from analysis.experiment_audit import ExperimentAudit
from analysis.fronts import pareto_means, pareto_points
from analysis.render import (
    Column,
    Table,
    display_text,
    latex_escape,
    metric_digits,
    metric_header,
    summarize,
)
from analysis.results import (
    SENSITIVITY_DELTAS,
    Results,
    compute_results,
    direction,
    report_split,
)
from analysis.tables import (
    CISettings,
    Skipped,
    ablation_table,
    certificate_table,
    controller_table,
    drift_table,
    main_table,
    saturation_table,
    sensitivity_table,
    shift_table,
    violation_table,
)
from relif_ray.audit import AuditSettings
from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.problems import benchmark
from relif_ray.progress import progress
from relif_ray.reference import SQUASH_FORMULA
from relif_ray.relif.controller import PAPER_NYUV2_STEPS

SPLITS = ("val", "test")
CONTROLLER_FIELDS = (
    "r_star",
    "eta",
    "lambda0",
    "lambda_min",
    "lambda_max",
    "warmup_steps",
    "violation_ema",
    "beta",
    "mu",
    "prototypes_per_task",
    "prototype_pairing",
    "quantile_alignment",
    "controller",
    "lipschitz_branch",
)
"""ReLiF settings listed in the report (the paper's Table 7 rows)."""


@dataclass
class ReportOptions:
    """Everything `relif report` can be told. `deltas` empty: the data set's default
    (NYUv2: erm:p75 and erm:p50; MIMIC-III 0.275; eICU 0.06); the first is the primary."""

    deltas: list[DeltaSpec] = field(default_factory=list)
    distribution: str = "distances"
    split: str | None = None
    settings: AuditSettings = field(default_factory=AuditSettings)
    sensitivity: tuple[float, ...] = SENSITIVITY_DELTAS
    drift_baseline: str | None = None
    ci: CISettings = field(default_factory=CISettings)
    figures: bool = True


def write_report(
    experiment: Experiment, out_dir: str | Path, options: ReportOptions | None = None
) -> Path:
    """Write the report folder (see module doc); return report.md's path."""
    options = options or ReportOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = ["# relif-ray report\n", _sources(experiment)]
    if experiment.trials.empty:
        sections.append("No finished trials: nothing to audit.\n")
    else:
        sections += _audited_sections(experiment, out, options)
    sections.append(_problems(experiment))
    report = out / "report.md"
    report.write_text("\n".join(sections))
    return report


def _audited_sections(experiment: Experiment, out: Path, options: ReportOptions) -> list[str]:
    trials = experiment.trials
    split = options.split or report_split(trials)
    if split not in SPLITS or f"{split}_worst" not in trials.columns:
        raise UserError(f"--split {split}: the trials have no {split} split")
    specs = options.deltas or delta_options.default_specs(
        list(trials["dataset"]), list(trials["label"])
    )
    audit = ExperimentAudit(experiment, options.settings)
    deltas = [delta_options.resolve(spec, audit, options.distribution) for spec in specs]
    keys = [d.key for d in deltas]
    if len(set(keys)) < len(keys):
        raise UserError(f"delta options: the same threshold is given twice ({keys})")
    results = compute_results(audit, deltas, split, options.sensitivity)
    baseline = options.drift_baseline or (
        "relif" if "relif" in results.variants else results.variants[0]
    )
    if baseline not in results.variants:
        raise UserError(
            f"--drift-baseline: no method {baseline!r} (methods: {', '.join(results.variants)})"
        )
    builders = [
        partial(main_table, results, options.ci),
        partial(violation_table, results),
        partial(saturation_table, results),
        partial(drift_table, results, baseline),
        partial(shift_table, results, options.ci),
        partial(certificate_table, results),
        partial(ablation_table, results, experiment, options.ci),
        partial(sensitivity_table, results, options.ci),
        partial(controller_table, results, experiment, options.ci),
        partial(utility_table, trials, split),
    ]
    tables = [build() for build in progress(builders, "relif report: tables", unit="table")]
    for table in tables:
        if isinstance(table, Table):
            table.write(out / "tables")
    _write_data(out, experiment, results, deltas, options)
    figures = _write_figures(out, experiment, results) if options.figures else {}
    named = {table.name: table for table in tables}
    return [
        _protocol(experiment, results, options),
        _section(
            "Utility and fixed-δ Bias",
            named["main"],
            options.ci,
            "Utility metrics and audit scores come from the same (final) checkpoint.",
        ),
        _section("Violation rates", named["violation"], options.ci),
        _section(
            "Audit-score saturation",
            named["saturation"],
            options.ci,
            _figure_line(figures.get("score_distributions")),
        ),
        _pareto_section(results, figures.get("pareto")),
        "## Threshold-drift diagnostics (not the comparison metric)\n",
        _section("Method-induced thresholds", named["drift"], options.ci, level=3),
        _section("Raw versus fixed-δ ranking", named["shift"], options.ci, level=3),
        _section("Theorem B.2 ranking certificate", named["certificate"], options.ci, level=3),
        _section("ReLiF component ablation", named["ablation"], options.ci),
        _section(
            "δ-sensitivity",
            named["delta_sensitivity"],
            options.ci,
            _figure_line(figures.get("delta_sensitivity")),
        ),
        _section(
            "Controller sensitivity",
            named["controller"],
            options.ci,
            "\n".join(_figure_line(path) for path in figures.get("controller", [])),
        ),
        _controller_settings(trials),
        _section("All utility metrics", named["utility"], options.ci),
    ]


def utility_table(trials: pd.DataFrame, split: str) -> Table:
    """Every metric of `split` (normalized `<task>_score` columns left out) per method."""
    prefix = f"{split}_"
    metrics = [c[len(prefix) :] for c in trials.columns if c.startswith(prefix)]
    leading = [m for m in ("worst", "macro") if m in metrics]
    metrics = leading + [m for m in metrics if m not in leading and not m.endswith("_score")]
    per_trial = trials[["variant", "seed"]].copy()
    for metric in metrics:
        per_trial[metric] = trials[prefix + metric].to_numpy(dtype=float)
    order = list(dict.fromkeys(trials["variant"]))
    rows = summarize(per_trial, "variant", metrics, order).rename(columns={"variant": "row"})
    directions = metric_directions(set(trials["dataset"]))
    columns = [
        Column(
            m,
            metric_header(m),
            latex_escape(metric_header(m)),
            direction(directions.get(m)),
            digits=metric_digits(m),
        )
        for m in metrics
    ]
    title = f"All utility metrics ({split} split), mean ± sample std over seeds."
    return Table("utility", title, "label", columns, rows)


def metric_directions(datasets: set[str]) -> dict[str, bool]:
    """`<task>_<metric>` -> higher is better, as the tasks of the trials' benchmarks declare."""
    directions: dict[str, bool] = {}
    for dataset in sorted(datasets):
        directions.update(benchmark(dataset, "data set of the trials").metric_directions)
    return directions


def _section(
    title: str, table: Table | Skipped, ci: CISettings, extra: str = "", level: int = 2
) -> str:
    heading = "#" * level + f" {title}\n"
    if isinstance(table, Skipped):
        return heading + f"Skipped: {table.reason}.\n"
    lines = [heading, table.title + "\n", table.markdown()]
    if ci.n_boot > 0 and any(
        c.key.startswith("bias") or c.key == "raw_bias" for c in table.columns if c.kind == "stat"
    ):
        lines.append(
            f"Bias cells: mean ± sample std over seeds [{ci.level:.0%} percentile bootstrap "
            f"interval of the seed mean over the sampled pairs, {ci.n_boot} replicates].\n"
        )
    files = ", ".join(_link(f"tables/{table.name}.{kind}") for kind in ("md", "tex", "csv"))
    lines.append(f"Files: {files}.\n")
    if extra:
        lines.append(extra + "\n")
    return "\n".join(lines)


def _link(relative: str) -> str:
    """A Markdown link to a file of the report folder (`relative` to report.md)."""
    return f"[{relative.rpartition('/')[2]}]({relative})"


def _figure_line(path: Path | None) -> str:
    return f"![{path.stem}](figures/{path.name})" if path else ""


def _sources(experiment: Experiment) -> str:
    trials = experiment.trials
    lines = [
        "Experiment directories: " + ", ".join(f"`{storage.display(p)}`" for p in experiment.paths)
    ]
    if not trials.empty:
        counts = trials.groupby("variant", sort=False)["seed"].apply(
            lambda seeds: ", ".join(map(str, sorted(seeds)))
        )
        lines.append(
            f"Finished trials: {len(trials)} (data set: "
            f"{', '.join(sorted(set(trials['dataset'])))})"
        )
        lines += [f"- {display_text(variant)}: seeds {seeds}" for variant, seeds in counts.items()]
        stopped = trials[trials["status"] == "stopped"]
        if len(stopped):
            lines.append(
                f"Stopped early by the Tune scheduler (ASHA), outputs at the epoch they stopped: "
                f"{len(stopped)}"
            )
            lines += [
                f"- stopped: {display_text(row.variant)} seed {row.seed} after {row.steps} "
                f"steps (`{row.trial}`)"
                for row in stopped.itertuples()
            ]
    lines.append(f"Trials without outputs: {len(experiment.problems)} (listed at the end)")
    note = running_note(experiment)
    if note:
        lines.append(f"**{note}.**")
    return "\n".join(lines) + "\n"


def running_note(experiment: Experiment) -> str | None:
    """What to say when a sweep still writes an experiment (`relif_ray.experiment.lock`)."""
    running = int((experiment.problems["status"] == "running").sum())
    if not running:
        return None
    return (
        f"A sweep is still running: {running} trial(s) still running, not in this report; "
        f"it covers the {len(experiment.trials)} finished trial(s)"
    )


def _protocol(experiment: Experiment, results: Results, options: ReportOptions) -> str:
    settings = options.settings
    datasets = sorted(set(experiment.trials["dataset"]))
    squashed = sorted({t for d in datasets for t in squashed_tasks(d)})
    interface = (
        f"audit scores of {', '.join(squashed)} are raw feature norms, squashed by "
        f"{SQUASH_FORMULA} with q10/q90 of the SAME-SEED ERM trial's "
        "validation scores, identically for every method (values in "
        f"{_link('squash_quantiles.csv')}); "
        "the other tasks' scores are probabilities and pass unchanged"
        if squashed
        else "all audit scores are probabilities in [0, 1] and are used unchanged"
    )
    lines = [
        "## Audit protocol (reporting checklist)\n",
        f"- Audit split: **{results.split}**. Audit interface: {interface}.",
        f"- Pools and pairs (Algorithm 1): per task a pool of N_eval = {settings.pool_size} "
        f"valid examples drawn without replacement with eval_seed = {settings.eval_seed} "
        f"(all of them when a task has fewer); per unordered task pair S = {settings.pairs} "
        f"pairs drawn uniformly with replacement with pair_seed = {settings.pair_seed}. "
        "Bias = mean (|p_a(x) - p_b(y)| - δ)_+, VR = mean 1[gap > δ], averaged over task "
        "pairs (weights 1/#pairs).",
        "- δ_ref, chosen once and held fixed for every method and every table "
        f"(primary: {results.primary.symbol}; values and sources in {_link('delta_ref.json')}):",
    ]
    for delta in results.deltas:
        lines.append(f"  - {delta.symbol} = {delta.value:.6f}: {delta.source}.")
    lines += [
        "- Method-induced thresholds (validation split, the mean cosine-induced distance of "
        "each method's own representations over the audit's pairs) are reported only as "
        "threshold-drift diagnostics; methods are compared under δ_ref (per task pair: "
        f"{_link('induced_thresholds.csv')}).",
        "- Utility metrics are those of the same checkpoint whose audit scores are audited "
        "(each trial's final checkpoint). The per-trial numbers behind every table: "
        f"{_link('per_trial.csv')}.",
        "- Controller settings of every ReLiF variant: see *Controller settings* below.",
        "",
    ]
    return "\n".join(lines)


def _pareto_section(results: Results, figure: Path | None) -> str:
    means = pareto_means(results)
    front = ", ".join(display_text(v) for v in means.loc[means["on_front"], "variant"])
    return "\n".join(
        [
            "## Utility-fairness Pareto front\n",
            f"Fixed-δ Bias@{results.primary.symbol} (lower is better) against Worst (higher is "
            f"better). Non-dominated methods (means over seeds): **{front}**. Per-seed points and "
            f"per-method means: {_link('pareto_points.csv')}, {_link('pareto_means.csv')}.\n",
            _figure_line(figure) + "\n",
        ]
    )


def _controller_settings(trials: pd.DataFrame) -> str:
    relif = trials[trials["relif"].astype(bool)]
    heading = "## Controller settings (for reproducibility; not audit thresholds)\n"
    if relif.empty:
        return heading + "No ReLiF trials.\n"
    rows = []
    for variant, group in relif.groupby("variant", sort=False):
        config = group["config"].iloc[0]["relif"]
        steps = int(group["steps"].iloc[0])
        budget = [f"{config['eta'] * steps:.3g}", f"{config['warmup_steps'] / steps:.3g}"]
        cells = [display_text(variant), *(str(config[f]) for f in CONTROLLER_FIELDS), *budget]
        rows.append("| " + " | ".join(cells) + " |")
    fields = [*CONTROLLER_FIELDS, "eta x steps", "warmup / steps"]
    header = "| variant | " + " | ".join(fields) + " |"
    note = (
        f"eta x steps and warmup / steps say how far the controller can move lambda over a "
        f"trial's budget: the paper's NYUv2 run has {1e-3 * PAPER_NYUV2_STEPS:g} and "
        f"{100 / PAPER_NYUV2_STEPS:g} (eta 1e-3, warmup 100, {PAPER_NYUV2_STEPS:,} steps); "
        "`--demo` and the fidelity benchmark keep both with "
        "`relif_ray.relif.controller.scale_to_budget`.\n"
    )
    table = [header, "|" + "---|" * (len(fields) + 1), *rows]
    return "\n".join([heading, note, *table, ""])


def _problems(experiment: Experiment) -> str:
    if experiment.problems.empty:
        return "## Trials without outputs\n\nNone.\n"
    lines = ["## Trials without outputs (listed, not dropped)\n"]
    for _, problem in experiment.problems.iterrows():
        lines.append(f"- {problem['status']}: `{problem['path']}` {problem['error']}".rstrip())
    return "\n".join(lines) + "\n"


def _write_data(
    out: Path,
    experiment: Experiment,
    results: Results,
    deltas: list[DeltaRef],
    options: ReportOptions,
) -> None:
    results.per_trial.to_csv(out / "per_trial.csv", index=False)
    results.induced.to_csv(out / "induced_thresholds.csv", index=False)
    squash_quantiles(experiment).to_csv(out / "squash_quantiles.csv", index=False)
    pareto_points(results).to_csv(out / "pareto_points.csv", index=False)
    pareto_means(results).to_csv(out / "pareto_means.csv", index=False)
    record = {
        "primary": deltas[0].key,
        "reference_distribution": options.distribution,
        "audit": vars(options.settings),
        "deltas": [vars(d) for d in deltas],
    }
    (out / "delta_ref.json").write_text(json.dumps(record, indent=2) + "\n")


def _write_figures(out: Path, experiment: Experiment, results: Results) -> dict:
    from analysis.figures import (
        controller_figure,
        controller_variants,
        pareto_figure,
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
        "controller": [],
    }
    jobs = [
        (written["pareto"], partial(pareto_figure, results)),
        (written["delta_sensitivity"], partial(sensitivity_figure, results)),
        (written["score_distributions"], partial(score_distributions_figure, results)),
    ]
    for variant in controller_variants(experiment):
        path = folder / f"controller_{slug(variant)}.png"
        jobs.append((path, partial(controller_figure, experiment, variant)))
        written["controller"].append(path)
    for path, draw in progress(jobs, "relif report: figures", unit="figure"):
        draw().savefig(path, dpi=150)
    return written
