"""Synthetic experiment directories in the exact on-disk format of finished sweeps.

A fixture writer for the tests, the analysis-load benchmark and the notebook's fallback: every
trial is written with `relif_ray.experiment.outputs.write_trial_outputs` into
`<root>/<trial folder>/checkpoint_000000/`, next to a `params.json`, as Ray Tune leaves it.
Labels mean what they mean to a sweep (`relif_ray.sweep.labels`: `variant`, and
`uses_controller` for which labels are crossed with the controller grid), and a ReLiF trial's
trace comes from the library's own `ViolationController` fed a synthetic violation rate. The
numbers are random but shaped like real ones: NYUv2 trials store seg probabilities and raw
(unsquashed) depth/normal feature norms, clinical trials store probabilities, and their
outcomes and stay names as the clinical tasks store them (`Task.outcomes`), named like the
stays of the synthetic data writers (`STAY_NAMES`), so that a group audit can join them to
the attributes of `relif make-data` folders with at least `n_examples` patients.
"""

from __future__ import annotations

import json
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from relif_ray.config import ExperimentConfig, ReLiFConfig
from relif_ray.data.mimic3 import NUM_PHENOTYPES
from relif_ray.evaluation import EvalResult
from relif_ray.experiment.outputs import read_trial_record, write_trial_outputs
from relif_ray.experiment.record import (
    COMPLETED,
    MACRO,
    TRAINING_ITERATION,
    WORST,
    EpochResult,
    TrialRecord,
    Validation,
    record_text,
    split_metric,
)
from relif_ray.experiment.schema import OUTPUTS_DIR, TRIAL_FILE
from relif_ray.relif import STAT_KEYS
from relif_ray.relif.controller import ViolationController
from relif_ray.sweep.labels import setting_values, uses_controller, variant
from relif_ray.sweep.trial_config import apply_overrides
from relif_ray.tasks.clinical import LOS_BIN_EDGES_HOURS, NUM_LOS_BINS

TASKS = {
    "nyuv2": ("seg", "depth", "normal"),
    "mimic3": ("mortality", "decompensation", "length_of_stay", "phenotype"),
    "eicu": ("mortality", "length_of_stay"),
}
STAY_NAMES = {
    "mimic3": "{}_episode1_timeseries.csv".format,  # the first stay of patient 10000 + i
    "eicu": str,  # the unit stay 141000 + i
}
STAY_NUMBERS = {"mimic3": 10000, "eicu": 141000}
"""The name of example i: what the synthetic writers call the stay of their i-th patient."""
OUTCOME_STEPS = 3
"""Labelled steps per stay of the per-step clinical tasks."""

DEMO_EXPERIMENT = Path("relif-results") / "nyuv2-demo"
"""Where the NYUv2 demo sweep writes its experiment, relative to the folder it runs in."""


def example_experiment(repository: Path, scratch: Path | None = None) -> str:
    """An experiment to look at when none is named: the demo sweep's (`python sweeps/nyuv2.py
    --demo` run in `repository` writes `relif-results/nyuv2-demo`), else a generated one in
    a new temporary folder (in `scratch`, default the system's), so that the notebook opens
    as-is from any working folder."""
    demo = repository / DEMO_EXPERIMENT
    if demo.is_dir():
        return str(demo)
    folder = Path(tempfile.mkdtemp(prefix="relif-example-", dir=scratch)) / "nyuv2-generated"
    labels = ("erm", "pcgrad", "relif", "pcgrad+relif")
    return str(write_synthetic_experiment(folder, labels, seeds=3, splits=("val", "test")))


def write_synthetic_experiment(
    root: str | Path,
    labels: Sequence[str] = ("erm", "relif"),
    seeds: int | Sequence[int] = 3,
    dataset: str = "nyuv2",
    n_examples: int = 40,
    splits: Sequence[str] = ("val",),
    representation_dim: int = 16,
    trace_steps: int = 30,
    controller_grid: Sequence[tuple[float, float]] = ((0.24, 1e-3),),
    static_lambdas: Sequence[float] = (),
    warmup_steps: int = 5,
    errored: int = 0,
    incomplete: int = 0,
    seed: int = 0,
    epochs: int = 4,
) -> Path:
    """Write one experiment directory: every variant x seed as a finished trial (a label whose
    controller adapts lambda at every (r*, eta) of `controller_grid`, a static-lambda label at
    every lambda0 of `static_lambdas` (default: the config's), every other label once), plus
    `errored` trials with an `error.txt` and
    `incomplete` trials without outputs. Trial ids are `<root folder name>_<index>`. ReLiF
    trials get `warmup_steps` (short, so that lambda moves within a short trace). Each trial
    folder gets Tune's `result.json` with `epochs` per-epoch validation results that rise
    towards the final ones. Returns `root`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    masks = _valid_masks(dataset, splits, n_examples, seed)
    index = 0
    for label in labels:
        for item in _variants(label, controller_grid, static_lambdas):
            for trial_seed in seed_list:
                config = _config(dataset, item, trial_seed, warmup_steps)
                rng = np.random.default_rng([seed, index, zlib.crc32(label.encode())])
                _write_trial(
                    root, index, label, config, rng, masks, representation_dim, trace_steps
                )
                _write_results(root / f"ReLiFTrainable_{index:05d}", config, rng, epochs)
                index += 1
    for number in range(errored + incomplete):
        folder = root / f"ReLiFTrainable_{index + number:05d}_broken"
        folder.mkdir()
        (folder / "params.json").write_text(json.dumps({"seed": number}))
        if number < errored:
            (folder / "error.txt").write_text(f"Traceback ...\nRuntimeError: synthetic {number}\n")
    return root


def _variants(
    label: str, controller_grid: Sequence[tuple[float, float]], static_lambdas: Sequence[float]
) -> list[dict[str, Any]]:
    """The sweep's variants of `label` (`relif_ray.sweep.labels.variant`) on these grids."""
    if uses_controller(label):
        return [variant(label, r_star, eta) for r_star, eta in controller_grid]
    static = variant(label)["overrides"].get("relif.controller") == "static"
    if static and static_lambdas:
        return [variant(label, extra={"relif.lambda0": value}) for value in static_lambdas]
    return [variant(label)]


def _config(dataset: str, item: dict[str, Any], seed: int, warmup_steps: int) -> dict[str, Any]:
    """The trial's full config: defaults, the variant's overrides, a short warmup (so that
    lambda moves within a short trace)."""
    values = apply_overrides(ExperimentConfig().to_dict(), item["overrides"])
    values["data"] = {"dataset": dataset, "root": "/synthetic"}
    values["relif"]["warmup_steps"] = warmup_steps
    values["seed"] = seed
    return ExperimentConfig.from_dict(values).to_dict()


def _write_trial(
    root: Path,
    index: int,
    label: str,
    config: dict[str, Any],
    rng: np.random.Generator,
    masks: dict[str, dict[str, np.ndarray]],
    representation_dim: int,
    trace_steps: int,
) -> None:
    folder = root / f"ReLiFTrainable_{index:05d}"
    checkpoint = folder / "checkpoint_000000"
    checkpoint.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps({"seed": config["seed"], "label": label}))
    tasks = TASKS[config["data"]["dataset"]]
    spread = 0.5 if config["relif"]["enabled"] else 1.0
    dataset = config["data"]["dataset"]
    results = {
        split: _eval_result(dataset, rng, valid, spread, representation_dim)
        for split, valid in masks.items()
    }
    if dataset in STAY_NAMES:  # their own random stream: the other numbers stay as they were
        outcome_rng = np.random.default_rng([index, zlib.crc32(label.encode()), 11])
        for result in results.values():
            result.outcomes = _outcomes(dataset, outcome_rng, len(result.example_ids))
            number = STAY_NUMBERS[dataset]
            result.names = [STAY_NAMES[dataset](number + i) for i in result.example_ids]
    record = TrialRecord(
        trial_id=f"{root.name}_{index:05d}",
        label=label,
        method=config["method"]["name"],
        relif=config["relif"]["enabled"],
        seed=config["seed"],
        steps=trace_steps,
        config=config,
        status=COMPLETED,
    )
    trace = _trace(tasks, config["relif"], rng, trace_steps)
    write_trial_outputs(checkpoint, record, results, trace)


def rewrite_output(path: Path, frame: pd.DataFrame) -> None:
    """Replace one parquet file of a trial's outputs as the trial would have written it: its
    trial.json lists the new size (`TrialRecord.files`), so the folder still reads as whole."""
    frame.to_parquet(path)
    record = read_trial_record(path.parent)
    assert isinstance(record, TrialRecord)
    files = {**(record.files or {}), path.name: path.stat().st_size}
    (path.parent / TRIAL_FILE).write_text(record_text(replace(record, files=files)))


def _write_results(
    folder: Path, config: dict[str, Any], rng: np.random.Generator, epochs: int
) -> None:
    """Tune's `result.json` (one JSON line per epoch, `ReLiFTrainable.step`'s `EpochResult`
    and Tune's iteration): normalized task scores rise to the final validation ones, the live
    Bias falls."""
    record = read_trial_record(folder / "checkpoint_000000" / OUTPUTS_DIR)
    assert isinstance(record, TrialRecord)
    final = record.metrics["val"]
    dataset = config["data"]["dataset"]
    lines = []
    for epoch in range(1, epochs + 1):
        progress = 0.5 + 0.5 * epoch / epochs
        normalized = {t: final[f"{t}_score"] * progress for t in TASKS[dataset]}
        metrics = _metrics(dataset, normalized)
        validation = Validation(
            metrics={split_metric("val", name): value for name, value in metrics.items()},
            worst=metrics[WORST],
            macro=metrics[MACRO],
            val_bias=float(rng.uniform(0.1, 0.2) / progress),
            val_vr=float(rng.uniform(0.3, 0.6) / progress),
        )
        result = EpochResult(
            label=record.label,
            seed=config["seed"],
            epoch=epoch,
            train_step=epoch * 10,
            done=epoch == epochs,
            device="cpu",
            validation=validation,
            settings=setting_values(ReLiFConfig(**config["relif"])),
        )
        lines.append(json.dumps({**result.to_tune(), TRAINING_ITERATION: epoch}))
    (folder / "result.json").write_text("\n".join(lines) + "\n")


def _valid_masks(
    dataset: str, splits: Sequence[str], n_examples: int, seed: int
) -> dict[str, dict[str, np.ndarray]]:
    """Which examples have a valid audit score, per split and task. As with real data this
    depends on the data only (NYUv2 depth/normal: some images without valid pixels), so it is
    the same for every trial."""
    rng = np.random.default_rng([seed, 7])
    return {
        split: {
            task: rng.random(n_examples) > (0.05 if dataset == "nyuv2" and task != "seg" else 0)
            for task in TASKS[dataset]
        }
        for split in splits
    }


def _eval_result(
    dataset: str,
    rng: np.random.Generator,
    valid: dict[str, np.ndarray],
    spread: float,
    representation_dim: int,
) -> EvalResult:
    parts, normalized = [], {}
    for task, mask in valid.items():
        ids = np.arange(mask.size)
        if dataset == "nyuv2" and task in ("depth", "normal"):
            score = np.exp(rng.normal(1.0, 0.4 * spread, mask.size))
        else:
            score = np.clip(rng.normal(0.6, 0.2 * spread, mask.size), 0.0, 1.0)
        parts.append(
            pd.DataFrame(
                {"task": task, "example_id": ids, "score": score.astype(np.float32), "valid": mask}
            )
        )
        normalized[task] = float(rng.uniform(0.4, 0.9))
    metrics = _metrics(dataset, normalized)
    n_examples = ids.size
    offset = rng.normal(0.0, 1.0, representation_dim)
    matrix = offset + rng.normal(0.0, 1.0 + spread, (n_examples, representation_dim))
    return EvalResult(metrics, pd.concat(parts, ignore_index=True), matrix.astype(np.float32), ids)


def _outcomes(dataset: str, rng: np.random.Generator, n_examples: int) -> pd.DataFrame:
    """Outcomes shaped like the clinical tasks' (`relif_ray.tasks.clinical`): a logit per
    stay (mortality), per step (decompensation) or per phenotype, with labels it predicts
    better than chance; remaining hours and a predicted bin near the true one per step."""
    frames = []
    widths = {"mortality": 1, "decompensation": OUTCOME_STEPS, "phenotype": NUM_PHENOTYPES}
    for task in TASKS[dataset]:
        width = widths.get(task, OUTCOME_STEPS)
        ids = np.repeat(np.arange(n_examples), width)
        if task == "length_of_stay":
            label = rng.exponential(120.0, ids.size)
            true_bin = np.searchsorted(LOS_BIN_EDGES_HOURS, label, side="right")
            prediction = np.clip(true_bin + rng.integers(-1, 2, ids.size), 0, NUM_LOS_BINS - 1)
        else:
            label = (rng.random(ids.size) < 0.3).astype(float)
            prediction = rng.normal(2.0 * label - 1.0, 1.5)
        frames.append(
            pd.DataFrame(
                {
                    "task": task,
                    "example_id": ids,
                    "position": np.tile(np.arange(width), n_examples),
                    "label": label.astype(np.float32),
                    "prediction": prediction.astype(np.float32),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _metrics(dataset: str, normalized: dict[str, float]) -> dict[str, float]:
    """Native metrics consistent with the normalized scores (NYUv2: seg = mIoU, depth =
    1/(1+RMSE), normal = 1 - mean angle/180), Worst and Macro."""
    metrics = {f"{task}_score": value for task, value in normalized.items()}
    if dataset == "nyuv2":
        metrics["seg_miou"] = normalized["seg"]
        metrics["depth_rmse"] = 1.0 / normalized["depth"] - 1.0
        metrics["normal_angle_mean"] = 180.0 * (1.0 - normalized["normal"])
    values = list(normalized.values())
    metrics[WORST], metrics[MACRO] = float(min(values)), float(np.mean(values))
    return metrics


def _trace(
    tasks: Sequence[str], relif: dict[str, Any], rng: np.random.Generator, steps: int
) -> list[dict[str, float]]:
    """Per-step losses and weights; ReLiF trials add lambda, r, r_ema, tau, kappa, loss_lip
    from the library's controller (`ViolationController.from_config`, as the regularizer
    builds it) fed a noisy violation rate."""
    config = ReLiFConfig(**relif)
    controller = ViolationController.from_config(config) if config.enabled else None
    rows = []
    for step in range(steps):
        row = {"step": float(step)}
        for task in tasks:
            row[f"loss_{task}"] = float(rng.gamma(2.0, 0.5))
            row[f"weight_{task}"] = 1.0
        if controller is not None:
            r = float(np.clip(rng.normal(0.3, 0.1), 0.0, 1.0))
            lam = float(controller.update(torch.tensor(r)))
            values = (lam, r, float(controller.r_ema), 0.2, 0.1, float(rng.gamma(1.0, 0.1)))
            row.update(zip(STAT_KEYS[:6], values, strict=True))  # all but the clipped share
        rows.append(row)
    return rows


__all__ = ["DEMO_EXPERIMENT", "example_experiment", "write_synthetic_experiment"]
