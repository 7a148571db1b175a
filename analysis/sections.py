"""The prose of `report.md` (`relif_ray.analysis.report`): its sections, each a Markdown string
built from the experiment, the `Results` and the tables, following the paper's reporting checklist
(section 6); the Summary of verdicts over seeds is `relif_ray.analysis.summary`'s."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from relif_ray.analysis.audit_scores import squashed_tasks
from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.fronts import pareto_means
from relif_ray.analysis.interfaces import TITLE, interface_words
from relif_ray.analysis.render import Table, display_text
from relif_ray.analysis.results import Results
from relif_ray.analysis.tables import CISettings, Skipped
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.audit import AuditSettings
from relif_ray.experiment import storage
from relif_ray.experiment.lock import still_running
from relif_ray.relif.controller import PAPER_NYUV2_STEPS
from relif_ray.squash import SQUASH_FORMULA

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

TRAINING_FIELDS = ("optimizer", "lr", "weight_decay", "batch_size", "epochs", "max_steps")
"""`train.*` settings listed in the report, with the learning-rate schedule and the steps each
trial ran: what must match before two runs' numbers are compared."""


def section(
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
            f"interval of the seed mean over the audit's sampled pairs, {ci.n_boot} "
            "replicates: the pair-sampling uncertainty only, not an interval over seeds; "
            "seeds: the summary's verdicts].\n"
        )
    files = ", ".join(link(f"tables/{table.name}.{kind}") for kind in ("md", "tex", "csv"))
    lines.append(f"Files: {files}.\n")
    if extra:
        lines.append(extra + "\n")
    return "\n".join(lines)


def link(relative: str) -> str:
    """A Markdown link to a file of the report folder (`relative` to report.md)."""
    return f"[{relative.rpartition('/')[2]}]({relative})"


def figure_line(path: Path | None) -> str:
    return f"![{path.stem}](figures/{path.name})" if path else ""


def sources(experiment: Experiment) -> str:
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
        lines += data_lines(trials)
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


def data_lines(trials: pd.DataFrame) -> list[str]:
    """The recorded data spec of each data set that a spec defines (the tabular benchmark):
    the table, tasks and kinds, the features used, groups, split sizes, labelled rows per task
    and split, and the imputed cells (`relif_ray.data.tabular.TableData.summary`)."""
    lines = []
    seen = set()
    for config in trials["config"]:
        data = config["data"]
        summary = data.get("spec", {}).get("summary")
        key = repr((data["dataset"], data["root"], summary))
        if not summary or key in seen:
            continue
        seen.add(key)
        tasks = ", ".join(summary["tasks"])
        features = summary["features"]
        categorical = summary["categorical_features"]
        sizes = _per_split(summary["split_sizes"])
        labelled = "; ".join(
            f"{task}: {_per_split(counts)}" for task, counts in summary["labelled"].items()
        )
        imputed = "; ".join(
            f"{feature}: {_per_split(counts)}" for feature, counts in summary["imputed"].items()
        )
        lines += [
            f"Data ({data['dataset']}): `{data['root']}`",
            f"- tasks: {tasks}",
            f"- features ({len(features)}, {summary['encoded_width']} columns once encoded; "
            f"categorical: {', '.join(categorical) or 'none'}): {', '.join(features)}",
            f"- groups: {', '.join(summary['groups']) or 'none'}",
            f"- splits (fractions {summary['fractions']}, data seed {summary['data_seed']}): "
            f"{sizes}",
            f"- labelled rows: {labelled}",
            f"- imputed feature cells (training-split median or level): {imputed or 'none'}",
        ]
    return lines


def _per_split(counts: dict[str, int]) -> str:
    return ", ".join(f"{split} {counts[split]}" for split in ("train", "val", "test"))


def running_note(experiment: Experiment) -> str | None:
    """What to say when a sweep still writes an experiment (`relif_ray.experiment.lock`):
    the trials it left out, by folder, in one line."""
    problems = experiment.problems
    running = problems.loc[problems["status"] == "running", "path"]
    if running.empty:
        return None
    folders = [path.rstrip("/").rpartition("/")[2] for path in running]
    return (
        f"A sweep is still running: {still_running(folders)}, not in this report; "
        f"it covers the {len(experiment.trials)} finished trial(s)"
    )


def protocol(experiment: Experiment, results: Results, settings: AuditSettings) -> str:
    datasets = sorted(set(experiment.trials["dataset"]))
    squashed = sorted({t for d in datasets for t in squashed_tasks(d)})
    interface = (
        f"audit scores of {', '.join(squashed)} are raw (unbounded: feature norms, "
        f"regression predictions), squashed by "
        f"{SQUASH_FORMULA} with q10/q90 of the SAME-SEED ERM trial's "
        "validation scores, identically for every method (values in "
        f"{link('squash_quantiles.csv')}; two other interfaces: {TITLE}); "
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
        f"(primary: {results.primary.symbol}; values and sources in {link('delta_ref.json')}):",
    ]
    for delta in results.deltas:
        lines.append(f"  - {delta.symbol} = {delta.value:.6f}: {delta.source}.")
    lines += [
        "- Method-induced thresholds (validation split, the mean cosine-induced distance of "
        "each method's own representations over the audit's pairs) are reported only as "
        "threshold-drift diagnostics; methods are compared under δ_ref (per task pair: "
        f"{link('induced_thresholds.csv')}).",
        "- Utility metrics are those of the same checkpoint whose audit scores are audited "
        "(each trial's final checkpoint). The per-trial numbers behind every table: "
        f"{link('per_trial.csv')}.",
        "- Training settings (optimiser, budget, learning-rate schedule) of every method and "
        "controller settings of every ReLiF variant: see *Training settings* and *Controller "
        "settings* below.",
        "",
    ]
    return "\n".join(lines)


def pareto_section(
    results: Results,
    figure: Path | None,
    hypervolume: Table | Skipped,
    ci: CISettings,
    settings: VerdictSettings,
) -> str:
    means = pareto_means(results, settings)
    front = ", ".join(
        display_text(row.variant) + _share_text(row.front_share)
        for row in means[means["on_front"]].itertuples()
    )
    return "\n".join(
        [
            "## Utility-fairness Pareto front\n",
            f"Fixed-δ Bias@{results.primary.symbol} (lower is better) against Worst (higher is "
            f"better). Non-dominated methods (means over seeds): **{front}**; a mean on the "
            "front is one draw of the seeds, and front_share is the share of seed resamples "
            "(every method's seeds resampled together) in which it stays there. Per-seed points "
            f"and per-method means: {link('pareto_points.csv')}, {link('pareto_means.csv')}.\n",
            figure_line(figure) + "\n",
            section("Hypervolume", hypervolume, ci, level=3),
        ]
    )


def _share_text(share: float) -> str:
    return "" if pd.isna(share) else f" (on the front in {share:.0%} of seed resamples)"


def schedule_text(train: dict) -> str:
    """A trial's learning-rate schedule (`train.scheduler`, `relif_ray.config.TrainConfig`)
    with the fields it uses; a trial recorded before schedules existed ran with none."""
    scheduler = train.get("scheduler", "none")
    if scheduler == "step":
        step_size, gamma = train["scheduler_step_size"], train["scheduler_gamma"]
        return f"step (x {gamma:g} every {step_size} epochs)"
    if scheduler == "cosine":
        horizon = train["scheduler_epochs"] or "the run's"
        return f"cosine (to {train['scheduler_min_lr']:g} over {horizon} epochs)"
    return str(scheduler)


def _values_text(values: list) -> str:
    """The distinct values of a method's seeds, in seed order, '/'-separated ("-": unset)."""
    texts = [
        "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
        for value in values
    ]
    return " / ".join(dict.fromkeys(texts))


def training_settings(trials: pd.DataFrame) -> str:
    """Per method, the optimiser, budget and learning-rate schedule its trials ran with."""
    rows = []
    for variant, group in trials.groupby("variant", sort=False):
        group = group.sort_values("seed")
        trains = [config["train"] for config in group["config"]]
        cells = [_values_text([train.get(name) for train in trains]) for name in TRAINING_FIELDS]
        cells.append(_values_text([schedule_text(train) for train in trains]))
        cells.append(_values_text(list(group["steps"])))
        rows.append("| " + " | ".join([display_text(variant), *cells]) + " |")
    fields = [*TRAINING_FIELDS, "scheduler", "steps run"]
    note = (
        "The `train.*` fields of the trials' configs (values of different seeds '/'-separated); "
        "the learning rate changes at the end of each complete epoch (`train.scheduler`); "
        "steps run counts each trial's optimiser steps (fewer where the Tune scheduler stopped "
        "it early).\n"
    )
    table = ["| variant | " + " | ".join(fields) + " |", "|" + "---|" * (len(fields) + 1), *rows]
    return "\n".join(["## Training settings\n", note, *table, ""])


def controller_settings(trials: pd.DataFrame) -> str:
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
        "`--demo` keeps both, and a sweep at another budget can, with "
        "`relif_ray.relif.controller.scale_to_budget`.\n"
    )
    table = [header, "|" + "---|" * (len(fields) + 1), *rows]
    return "\n".join([heading, note, *table, ""])


def interface_section(table: Table | Skipped, ci: CISettings) -> str:
    """The audit-interface table, its verdicts in words and its per-trial file."""
    extra = interface_words(table)
    if not isinstance(table, Skipped):
        extra += f"\n\nPer trial and interface: {link('interface_per_trial.csv')}."
    return section(TITLE, table, ci, extra)


def problems(experiment: Experiment) -> str:
    if experiment.problems.empty:
        return "## Trials without outputs\n\nNone.\n"
    lines = ["## Trials without outputs (listed, not dropped)\n"]
    for _, problem in experiment.problems.iterrows():
        lines.append(f"- {problem['status']}: `{problem['path']}` {problem['error']}".rstrip())
    return "\n".join(lines) + "\n"


def audited_sections(
    experiment: Experiment,
    results: Results,
    settings: AuditSettings,
    ci: CISettings,
    named: dict[str, Table | Skipped],
    figures: dict,
    verdicts: VerdictSettings,
) -> list[str]:
    """The sections after the sources: the audit protocol, then each table (by name, as
    `relif_ray.analysis.report` built them) with its figures, in the order of the paper's
    checklist."""
    return [
        protocol(experiment, results, settings),
        section(
            "Utility and fixed-δ Bias",
            named["main"],
            ci,
            "Utility metrics and audit scores come from the same (final) checkpoint.",
        ),
        section("Paired comparisons with same-seed ERM, over seeds", named["paired"], ci),
        section("Violation rates", named["violation"], ci),
        section(
            "Audit-score saturation",
            named["saturation"],
            ci,
            figure_line(figures.get("score_distributions")),
        ),
        interface_section(named["interfaces"], ci),
        pareto_section(results, figures.get("pareto"), named["hypervolume"], ci, verdicts),
        "## Threshold-drift diagnostics (not the comparison metric)\n",
        section("Method-induced thresholds", named["drift"], ci, level=3),
        section(
            "Raw versus fixed-δ ranking",
            named["shift"],
            ci,
            figure_line(figures.get("rank_shift")),
            level=3,
        ),
        section("Theorem B.2 ranking certificate", named["certificate"], ci, level=3),
        section("ReLiF component ablation", named["ablation"], ci),
        section(
            "δ-sensitivity",
            named["delta_sensitivity"],
            ci,
            figure_line(figures.get("delta_sensitivity")),
        ),
        section(
            "Controller sensitivity",
            named["controller"],
            ci,
            "\n".join(figure_line(path) for path in figures.get("controller", [])),
        ),
        training_settings(experiment.trials),
        controller_settings(experiment.trials),
        section("All utility metrics", named["utility"], ci),
    ]
