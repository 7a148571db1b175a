"""The sections of `report.md` that say what ran (`relif_ray.analysis.report`): the experiment
directories and finished trials with their seeds, the data specs, the trials the Tune scheduler
stopped, a sweep still writing, the training and controller settings of every method (what must
match before two runs' numbers are compared, the paper's reporting checklist, section 6) and the
trials without outputs. The audit's sections are `relif_ray.analysis.sections`'."""

from __future__ import annotations

import pandas as pd

from relif_ray.analysis.experiment import Experiment
from relif_ray.analysis.render import display_text
from relif_ray.experiment import storage
from relif_ray.experiment.lock import still_running
from relif_ray.relif.controller import PAPER_NYUV2_STEPS

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


def sources(experiment: Experiment) -> str:
    """The experiment directories, the finished trials per method with their seeds, the data
    specs, the trials the Tune scheduler stopped early and a sweep still running."""
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
    """Per ReLiF variant, its controller settings (the paper's Table 7 rows) and how far the
    controller can move lambda over a trial's budget (eta x steps, warmup / steps)."""
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


def problems(experiment: Experiment) -> str:
    """The trial folders without outputs (errored, running, incomplete, damaged), each with its
    status and error: listed, not dropped."""
    if experiment.problems.empty:
        return "## Trials without outputs\n\nNone.\n"
    lines = ["## Trials without outputs (listed, not dropped)\n"]
    for _, problem in experiment.problems.iterrows():
        lines.append(f"- {problem['status']}: `{problem['path']}` {problem['error']}".rstrip())
    return "\n".join(lines) + "\n"
