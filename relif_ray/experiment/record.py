"""What a trial reports, one home for its keys: each epoch's result (the dict Ray Tune records
in `result.json` and `progress.csv`, and hands ASHA, the Optuna studies and the progress
table) and its final record (`trial.json`, which analysis, `relif export` and the benchmarks
read), each a frozen type with its one conversion to and from that form. No Ray, no storage.

A misspelt result key passes every type check and silently breaks a reader (ASHA ranks on a
metric it never finds, the Pareto file stays empty), so the keys are named here once, and
what the Tune side reads is derived from them: the metrics ASHA may rank by
(`SCHEDULER_METRICS`), the Optuna objectives (`OBJECTIVES`), the NaN metrics of an epoch
without validation (`UNEVALUATED_METRICS`), the progress table's columns (`PROGRESS_METRICS`)
and the values `pareto.csv` keeps of a study's trials (`PARETO_METRICS`).

Several seeds in one Tune trial: each seed has its own `EpochResult` and its own
`TrialRecord`, so that each reaches the experiment files and the report as its own trial row
(`seed_row_id`). Tune gets one dict per epoch (`tune_result`: a one-seed trial's is the seed's
own; a trial of several seeds nests each seed's under `SEEDS` and reports at the top the mean
of what the scheduler and the searchers read), and `seed_results` takes it apart again. The
trial's `trial.json` is then a `FusedTrialRecord` naming each seed's folder of outputs, in
which that seed's `TrialRecord` lies (`relif_ray.experiment.outputs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relif_ray.directions import tune_mode
from relif_ray.relif import CONTROLLER_KEYS, STAT_KEYS
from relif_ray.sweep.labels import SETTING_FIELDS

# --- the keys of an epoch's result -------------------------------------------------------

EVALUATED = "evaluated"
"""Whether the epoch validated (`train.eval_every`, the last epoch, ASHA's rungs)."""
LABEL = "label"
SEED = "seed"
EPOCH = "epoch"
TRAIN_STEP = "train_step"
DONE = "done"
DEVICE = "device"
WORST = "worst"
MACRO = "macro"
VAL_BIAS = "val_bias"
"""The live validation audit's Bias, at the sweep's delta (a progress and search signal)."""
VAL_VR = "val_vr"
SQUASH_CONSTANTS = "squash_constants"
"""An ERM reference trial's last result: task -> [q10, q90] of its validation scores (Tune
flattens it into `squash_constants/<task>` for a searcher)."""
CUDA_PEAK_MB = "cuda_peak_mb"
"""On CUDA, the trial's peak GPU memory so far (MiB)."""
CHECKPOINT_SECONDS = "time_checkpoint_s"
"""The seconds of the trial's last checkpoint (written and persisted; NaN before the first),
which the checkpoint cadence reads."""
TRIAL_ID = "trial_id"
"""Tune's id of the trial (Tune adds it to every result; `trial.json` holds it too)."""
SEEDS = "seeds"
"""The result of a trial of several seeds: seed -> that seed's own result."""
TRAINING_ITERATION = "training_iteration"
"""Tune's count of a trial's results (one per epoch), which Tune adds to each."""
TIMED_PARTS = ("train", "evaluate", "audit", "evaluate_test")
"""The parts of an epoch whose seconds a result reports (`part_seconds`)."""
R_STAR, ETA, LAMBDA0 = SETTING_FIELDS  # the keys of the setting, which every result reports
SPLITS = ("val", "test")
"""The splits whose metrics a result reports, as `<split>_<metric>` (`split_metric`)."""


def split_metric(split: str, metric: str) -> str:
    """The result key (and analysis column) of a split's metric: `val_worst`, `test_seg_miou`."""
    return f"{split}_{metric}"


def part_seconds(part: str) -> str:
    """The result key of the seconds of one timed part of an epoch (`TIMED_PARTS`)."""
    return f"time_{part}_s"


VAL_WORST = split_metric("val", WORST)
VAL_MACRO = split_metric("val", MACRO)

SCHEDULER_METRICS = {name: tune_mode(name) for name in (WORST, MACRO, VAL_BIAS)}
"""What `--scheduler asha` may rank trials by, with its mode: validation Worst or Macro
(higher is better) or the live validation Bias (lower is better)."""
OBJECTIVES = {name: tune_mode(name) for name in (VAL_BIAS, WORST)}
"""Optuna's objectives: live validation Bias (minimized) and validation Worst (maximized)."""
UNEVALUATED_METRICS = tuple(dict.fromkeys([*SCHEDULER_METRICS, *OBJECTIVES, VAL_VR]))
"""What an epoch without validation reports, as NaN: every metric ASHA and the Optuna studies
may read (Tune requires them in every result), and the audit's VR beside its Bias."""
PROGRESS_PARAMETERS = {SEED: SEED}
"""The progress table's parameter columns: result key -> header."""
PROGRESS_METRICS = {
    LABEL: "method",
    R_STAR: SETTING_FIELDS[R_STAR][0],
    ETA: SETTING_FIELDS[ETA][0],
    TRAIN_STEP: "step",
    WORST: "Worst",
    MACRO: "Macro",
    VAL_BIAS: "val Bias",
    **{key: key for key in CONTROLLER_KEYS},
}
"""The progress table's metric columns: result key -> header."""
PARETO_METRICS = (LABEL, SEED, TRIAL_ID, R_STAR, ETA, VAL_BIAS, VAL_WORST, VAL_MACRO)
"""What `pareto.csv` keeps of a study's trials, from their last results, under these names
(`relif_ray.sweep.selection.PARETO_COLUMNS`)."""


@dataclass(frozen=True)
class Validation:
    """An epoch's validation, as its result reports it.

    metrics: `<split>_<metric>` of the evaluated splits (`split_metric`: val, and test where
    `train.epoch_test_metrics`); worst, macro: validation Worst and Macro; val_bias, val_vr: the
    live audit at the sweep's delta (NaN where fewer than two tasks have scores);
    squash_constants: an ERM reference trial's last one, task -> its validation [q10, q90].
    """

    metrics: Mapping[str, float]
    worst: float
    macro: float
    val_bias: float
    val_vr: float
    squash_constants: Mapping[str, list[float]] | None = None

    def summary(self) -> tuple[float, ...]:
        """Worst, Macro, Bias and VR in the order of `UNEVALUATED_METRICS`."""
        values = {WORST: self.worst, MACRO: self.macro, VAL_BIAS: self.val_bias}
        return tuple({**values, VAL_VR: self.val_vr}[name] for name in UNEVALUATED_METRICS)


NOT_VALIDATED = Validation({}, math.nan, math.nan, math.nan, math.nan)
"""What an epoch without validation reports: `UNEVALUATED_METRICS` as NaN, no metrics."""


@dataclass(frozen=True)
class EpochResult:
    """One seed's epoch as a trial reports it (`ReLiFTrainable.step`).

    validation: None where the epoch did not validate (`NOT_VALIDATED` is reported); settings:
    `SETTING_FIELDS` (NaN where not identifying); controller: the ReLiF statistics at the
    epoch's last step (`STAT_KEYS`, NaN without ReLiF); seconds: part -> seconds of the parts
    that ran (`TIMED_PARTS`); checkpoint_seconds: `CHECKPOINT_SECONDS`; cuda_peak_mb: on CUDA
    only.
    """

    label: str
    seed: int
    epoch: int
    train_step: int
    done: bool
    device: str
    validation: Validation | None = None
    settings: Mapping[str, float] = field(default_factory=dict)
    controller: Mapping[str, float] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)
    checkpoint_seconds: float = math.nan
    cuda_peak_mb: float | None = None

    @property
    def evaluated(self) -> bool:
        return self.validation is not None

    def to_tune(self) -> dict[str, Any]:
        """Tune's result dict, in the order of its keys in `result.json` and `progress.csv`:
        the validation (metrics, squash constants, then Worst, Macro, Bias, VR), the trial's
        label, seed, setting and controller, the epoch's seconds and device, its progress."""
        validation = self.validation or NOT_VALIDATED
        reported: dict[str, Any] = dict(validation.metrics)
        if validation.squash_constants is not None:
            reported[SQUASH_CONSTANTS] = dict(validation.squash_constants)
        return {
            **reported,
            **dict(zip(UNEVALUATED_METRICS, validation.summary(), strict=True)),
            EVALUATED: self.evaluated,
            LABEL: self.label,
            SEED: self.seed,
            **self.settings,
            **self.controller,
            **{part_seconds(part): value for part, value in self.seconds.items()},
            CHECKPOINT_SECONDS: self.checkpoint_seconds,
            **({} if self.cuda_peak_mb is None else {CUDA_PEAK_MB: self.cuda_peak_mb}),
            DEVICE: self.device,
            EPOCH: self.epoch,
            TRAIN_STEP: self.train_step,
            DONE: self.done,
        }

    @classmethod
    def from_tune(cls, result: Mapping[str, Any]) -> EpochResult:
        """The epoch of one seed's Tune result, as the trial reported it or as Tune recorded it
        (Tune's own keys, such as `training_iteration`, are left out; squash constants may be
        flattened). A result without `EVALUATED` (written before the eval cadence) validated."""
        prefixes = tuple(f"{split}_" for split in SPLITS)
        summary = set(UNEVALUATED_METRICS)
        validation = None
        if was_evaluated(result):
            validation = Validation(
                metrics={
                    key: value
                    for key, value in result.items()
                    if key.startswith(prefixes) and key not in summary
                },
                worst=result[WORST],
                macro=result[MACRO],
                val_bias=result[VAL_BIAS],
                val_vr=result[VAL_VR],
                squash_constants=reported_constants(result) or None,
            )
        seconds = {
            part: result[part_seconds(part)] for part in TIMED_PARTS if part_seconds(part) in result
        }
        return cls(
            label=result[LABEL],
            seed=result[SEED],
            epoch=result[EPOCH],
            train_step=result[TRAIN_STEP],
            done=result[DONE],
            device=result[DEVICE],
            validation=validation,
            settings={key: result[key] for key in SETTING_FIELDS if key in result},
            controller={key: result[key] for key in STAT_KEYS if key in result},
            seconds=seconds,
            checkpoint_seconds=result.get(CHECKPOINT_SECONDS, math.nan),
            cuda_peak_mb=result.get(CUDA_PEAK_MB),
        )

    def summary(self) -> tuple[float, ...]:
        """Worst, Macro, Bias and VR (`UNEVALUATED_METRICS`; NaN where it did not validate)."""
        return (self.validation or NOT_VALIDATED).summary()


def reported_constants(result: Mapping[str, Any]) -> dict[str, list[float]]:
    """task -> [q10, q90] that a reference trial's result reports (nested, as the trial reports
    it and `result.json` holds it, or flattened into `squash_constants/<task>`, as Tune hands
    a result to a searcher); empty where it reports none."""
    nested = result.get(SQUASH_CONSTANTS)
    if isinstance(nested, Mapping):
        return {task: [float(value) for value in bounds] for task, bounds in nested.items()}
    prefix = f"{SQUASH_CONSTANTS}/"
    return {
        key.removeprefix(prefix): [float(value) for value in bounds]
        for key, bounds in result.items()
        if key.startswith(prefix)
    }


def reported_seed_constants(result: Mapping[str, Any], seed: int) -> dict[str, list[float]]:
    """`reported_constants` of one seed of a trial of several (`tune_result`), nested or
    flattened as Tune hands it to a searcher (`seeds/<seed>/squash_constants/<task>`)."""
    nested = result.get(SEEDS)
    if isinstance(nested, Mapping):
        return reported_constants(nested.get(str(seed), {}))
    prefix = f"{SEEDS}/{seed}/"
    own = {
        key.removeprefix(prefix): value for key, value in result.items() if key.startswith(prefix)
    }
    return reported_constants(own)


def was_evaluated(result: Mapping[str, Any]) -> bool:
    """Whether a Tune result is of an epoch that validated (a result without the key, of an
    older trial, counts as validated)."""
    return result.get(EVALUATED) is not False


def tune_result(seeds: Sequence[EpochResult]) -> dict[str, Any]:
    """Tune's result of one trial's epoch, for the seeds it trains (one `EpochResult` each, in
    the trial's order). One seed: its own dict (`EpochResult.to_tune`). Several: each seed's
    under `SEEDS`, and at the top the trial's label, its progress (the seeds train in step),
    its device and the mean over its seeds of what the scheduler and the searchers read
    (`UNEVALUATED_METRICS`), so that ASHA and Optuna see one trial."""
    if not seeds:
        raise ValueError("a trial reports at least one seed")
    if len(seeds) == 1:
        return seeds[0].to_tune()
    first = seeds[0]
    columns = zip(*(seed.summary() for seed in seeds), strict=True)
    means = {
        name: float(sum(values) / len(values))
        for name, values in zip(UNEVALUATED_METRICS, columns, strict=True)
    }
    return {
        **means,
        EVALUATED: first.evaluated,
        LABEL: first.label,
        SEEDS: {str(seed.seed): seed.to_tune() for seed in seeds},
        DEVICE: first.device,
        EPOCH: first.epoch,
        TRAIN_STEP: first.train_step,
        DONE: first.done,
    }


def seed_results(result: Mapping[str, Any]) -> list[EpochResult]:
    """The seeds' epochs of one Tune result (`tune_result`, read back)."""
    if SEEDS in result:
        return [EpochResult.from_tune(each) for each in result[SEEDS].values()]
    return [EpochResult.from_tune(result)]


def seed_part(result: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """One seed's epoch in a result that Tune recorded of a trial of several seeds
    (`tune_result`): the seed's own result, with the keys Tune added to the trial's
    (`training_iteration`, `time_total_s`, ...)."""
    trial = {key: value for key, value in result.items() if key != SEEDS}
    return {**trial, **result[SEEDS][str(seed)]}


def seed_row_id(trial_id: str, seed: int) -> str:
    """The trial row of one seed of a Tune trial that trains several: its own id in the
    experiment (analysis' `trial` column)."""
    return f"{trial_id}_seed{seed}"


# --- trial.json ---------------------------------------------------------------------------

TRIAL_KEYS = ("trial_id", "label", "method", "relif", "seed", "steps", "config", "metrics")
"""What every one-seed trial.json holds (analysis reads them; the others are descriptive)."""
FILES_KEY = "files"
"""trial.json's list of the folder's other files: name -> size in bytes (absent in outputs
written before it was added: those are taken as complete)."""
SEED_FOLDERS_KEY = "seed_folders"
"""A `FusedTrialRecord`'s seeds: seed -> the folder of its outputs."""
COMPLETED, STOPPED = "completed", "stopped"
"""A record's `status`: the trial ran its budget, or a scheduler may stop it here (ASHA's
rung: its outputs are a snapshot where it goes on)."""
_DESCRIBING = ("status", "device", "restored_from_checkpoint", "started_at", "finished_at")


@dataclass(frozen=True)
class TrialRecord:
    """One seed's finished trial, as its `trial.json` holds it: one trial row in analysis.

    trial_id: the row's id (Tune's trial id for a trial of one seed, `seed_row_id` for each
    seed of a trial of several); metrics: split -> metric -> value; config: the full
    `ExperimentConfig.to_dict()` it ran; steps: training steps taken; status `COMPLETED` or
    `STOPPED`; device, restored_from_checkpoint and the wall-clock started_at / finished_at
    describe the run (None: not recorded, as in a synthetic experiment); files: the other
    files of its outputs folder and their sizes (None: not listed, outputs written before the
    list); extra: keys that this release does not know, kept as they were."""

    trial_id: str
    label: str
    method: str
    relif: bool
    seed: int
    steps: int
    config: Mapping[str, Any]
    metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    status: str | None = COMPLETED
    device: str | None = None
    restored_from_checkpoint: bool | None = None
    started_at: float | None = None
    finished_at: float | None = None
    files: Mapping[str, int] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """trial.json's object (written sorted by key, `relif_ray.experiment.outputs`)."""
        record: dict[str, Any] = {
            "trial_id": self.trial_id,
            "label": self.label,
            "method": self.method,
            "relif": self.relif,
            "seed": self.seed,
            "steps": self.steps,
            "config": self.config,
            "metrics": self.metrics,
        }
        for key in _DESCRIBING:
            if getattr(self, key) is not None:
                record[key] = getattr(self, key)
        if self.files is not None:
            record[FILES_KEY] = self.files
        return {**self.extra, **record}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> TrialRecord:
        """The record of a one-seed trial.json's object; ValueError naming the keys missing.
        A trial.json without a status (written before it was recorded) is a completed one."""
        if missing := [key for key in TRIAL_KEYS if key not in record]:
            raise ValueError(f"no {', '.join(missing)}")
        known = {*TRIAL_KEYS, *_DESCRIBING, FILES_KEY}
        return cls(
            trial_id=record["trial_id"],
            label=record["label"],
            method=record["method"],
            relif=record["relif"],
            seed=record["seed"],
            steps=record["steps"],
            config=record["config"],
            metrics=record["metrics"],
            status=record.get("status"),
            device=record.get("device"),
            restored_from_checkpoint=record.get("restored_from_checkpoint"),
            started_at=record.get("started_at"),
            finished_at=record.get("finished_at"),
            files=record.get(FILES_KEY),
            extra={key: value for key, value in record.items() if key not in known},
        )


@dataclass(frozen=True)
class FusedTrialRecord:
    """trial.json of a Tune trial that trained several seeds: its Tune trial id and status, the
    folder of each seed's own outputs (a one-seed trial's files, with that seed's
    `TrialRecord`) and every file below it with its size."""

    trial_id: str
    seed_folders: Mapping[int, str]
    status: str = COMPLETED
    files: Mapping[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "trial_id": self.trial_id,
            "status": self.status,
            SEED_FOLDERS_KEY: {str(seed): folder for seed, folder in self.seed_folders.items()},
        }
        return record if self.files is None else {**record, FILES_KEY: self.files}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> FusedTrialRecord:
        folders = record[SEED_FOLDERS_KEY]
        if not isinstance(folders, Mapping) or not folders:
            raise ValueError(f"{SEED_FOLDERS_KEY}: not a list of seed folders")
        return cls(
            trial_id=record["trial_id"],
            seed_folders={int(seed): str(folder) for seed, folder in folders.items()},
            status=record.get("status", COMPLETED),
            files=record.get(FILES_KEY),
        )


def trial_record(record: Any) -> TrialRecord | FusedTrialRecord:
    """The record of a trial.json's object: a `FusedTrialRecord` where it names seed folders,
    else a `TrialRecord`; ValueError where it is neither."""
    if not isinstance(record, Mapping):
        raise ValueError("not a JSON object")
    if SEED_FOLDERS_KEY in record:
        return FusedTrialRecord.from_json(record)
    return TrialRecord.from_json(record)


def record_text(record: TrialRecord | FusedTrialRecord) -> str:
    """trial.json's text: the record's object, sorted by key and indented by two."""
    return json.dumps(record.to_json(), indent=2, sort_keys=True)
