"""The result contract (`relif_ray.experiment.record`): an epoch's result and a trial's record
convert to Tune's dict and to trial.json and back without loss, in the order and form a
sweep writes them; what the Tune side reads is derived from the named keys; and a Tune trial
that trained two seeds reaches the experiment files, analysis and export as two trial rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.config import ExperimentConfig
from relif_ray.directions import tune_mode
from relif_ray.evaluation import EvalResult
from relif_ray.experiment.export import export_experiment
from relif_ray.experiment.outputs import SeedOutputs, read_trial_record, write_fused_outputs
from relif_ray.experiment.record import (
    OBJECTIVES,
    PROGRESS_METRICS,
    SCHEDULER_METRICS,
    SEEDS,
    UNEVALUATED_METRICS,
    EpochResult,
    FusedTrialRecord,
    TrialRecord,
    Validation,
    record_text,
    seed_results,
    seed_row_id,
    trial_record,
    tune_result,
)

RELEASED_TRIAL_JSON = Path(__file__).with_name("trial_record_release.json")
"""A trial.json as the release before the record type wrote it (the demo's ERM trial)."""


def epoch(seed: int = 0, validated: bool = True, number: int = 2, **fields: object) -> EpochResult:
    """Epoch `number` of one seed of a ReLiF trial, as `ReLiFTrainable.step` reports it."""
    validation = Validation(
        metrics={"val_seg_miou": 0.4, "val_worst": 0.3, "test_worst": 0.25},
        worst=0.3 + seed,
        macro=0.5,
        val_bias=0.1 * (seed + 1),
        val_vr=0.2,
        squash_constants={"depth": [0.5, 2.0]},
    )
    return EpochResult(
        label="relif",
        seed=seed,
        epoch=number,
        train_step=4 * number,
        done=True,
        device="cpu",
        validation=validation if validated else None,
        settings={"r_star": 0.24, "eta": 1e-3, "lambda0": math.nan},
        controller={"lambda": 0.1, "r_ema": 0.3},
        seconds={"train": 1.5, "evaluate": 0.5, "audit": 0.1},
        **fields,
    )


def test_an_epoch_result_is_tunes_dict_in_the_trainables_key_order_and_back():
    result = epoch(checkpoint_seconds=0.7)
    reported = result.to_tune()
    assert list(reported) == [
        *("val_seg_miou", "val_worst", "test_worst", "squash_constants"),
        *("worst", "macro", "val_bias", "val_vr", "evaluated", "label", "seed"),
        *("r_star", "eta", "lambda0", "lambda", "r_ema"),
        *("time_train_s", "time_evaluate_s", "time_audit_s", "time_checkpoint_s"),
        *("device", "epoch", "train_step", "done"),
    ]
    assert EpochResult.from_tune(reported) == result
    recorded = {**reported, "training_iteration": 2, "time_this_iter_s": 2.1, "pid": 7}
    assert EpochResult.from_tune(recorded) == result  # Tune's own keys are Tune's
    flattened = {k: v for k, v in reported.items() if k != "squash_constants"}
    flattened["squash_constants/depth"] = [0.5, 2.0]  # as Tune hands it to a searcher
    assert EpochResult.from_tune(flattened) == result
    on_cuda = epoch(cuda_peak_mb=512.0).to_tune()
    assert list(on_cuda)[-5:] == ["cuda_peak_mb", "device", "epoch", "train_step", "done"]


def test_an_epoch_without_validation_reports_nan_for_what_asha_and_optuna_read():
    reported = epoch(validated=False).to_tune()
    assert list(reported)[:5] == [*UNEVALUATED_METRICS, "evaluated"]
    assert all(math.isnan(reported[key]) for key in UNEVALUATED_METRICS)
    assert not any(
        key.startswith(("val_", "test_")) for key in reported if key not in UNEVALUATED_METRICS
    )
    assert reported["evaluated"] is False
    assert EpochResult.from_tune(reported) == epoch(validated=False)


def test_what_the_tune_side_reads_is_derived_from_the_named_keys():
    assert set(SCHEDULER_METRICS) | set(OBJECTIVES) <= set(UNEVALUATED_METRICS)
    assert UNEVALUATED_METRICS == ("worst", "macro", "val_bias", "val_vr")
    assert OBJECTIVES == {"val_bias": "min", "worst": "max"}
    assert all(mode == tune_mode(name) for name, mode in SCHEDULER_METRICS.items())
    assert set(PROGRESS_METRICS) <= set(epoch().to_tune())  # every column is reported


def test_a_trial_json_of_the_current_release_reads_and_is_written_back_byte_for_byte():
    text = RELEASED_TRIAL_JSON.read_text()
    record = trial_record(json.loads(text))
    assert isinstance(record, TrialRecord)
    assert (record.label, record.seed, record.status, record.restored_from_checkpoint) == (
        "erm",
        0,
        "completed",
        False,
    )
    assert record_text(record) == text
    unknown = {**json.loads(text), "note": "kept"}  # a key this release does not know
    assert TrialRecord.from_json(unknown).to_json() == unknown
    with pytest.raises(ValueError, match="^no label, seed$"):
        trial_record({k: v for k, v in json.loads(text).items() if k not in ("label", "seed")})


def test_two_seeds_of_one_trial_report_to_tune_as_one_result_and_come_back_apart():
    seeds = [epoch(seed=0), epoch(seed=1)]
    reported = tune_result(seeds)
    assert reported["worst"] == pytest.approx(0.8) and reported["val_bias"] == pytest.approx(0.15)
    assert set(reported[SEEDS]) == {"0", "1"} and reported["epoch"] == 2
    assert seed_results(reported) == seeds
    assert tune_result(seeds[:1]) == seeds[0].to_tune()  # one seed: its own dict
    assert seed_results(seeds[0].to_tune()) == seeds[:1]


def eval_result(rng: np.random.Generator, worst: float) -> EvalResult:
    tasks = ("seg", "depth", "normal")
    scores = pd.DataFrame(
        {
            "task": np.repeat(tasks, 8),
            "example_id": np.tile(np.arange(8), 3),
            "score": rng.uniform(0.2, 0.9, 24).astype(np.float32),
            "valid": True,
        }
    )
    metrics = {"seg_score": worst, "depth_score": 0.6, "normal_score": 0.7, "worst": worst}
    matrix = rng.normal(size=(8, 4)).astype(np.float32)
    return EvalResult({**metrics, "macro": 0.6}, scores, matrix, np.arange(8))


def write_two_seed_trial(root: Path) -> Path:
    """One Tune trial folder whose trial trained seeds 3 and 5, with its result.json."""
    folder = root / "ReLiFTrainable_fused_00000"
    checkpoint = folder / "checkpoint_000000"
    checkpoint.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps({"label": "erm"}))
    rng = np.random.default_rng(0)
    seeds = []
    for seed in (3, 5):
        values = ExperimentConfig().to_dict()
        values["data"] = {"dataset": "nyuv2", "root": "/synthetic"}
        values["seed"] = seed
        record = TrialRecord(
            trial_id=seed_row_id("fused_00000", seed),
            label="erm",
            method="erm",
            relif=False,
            seed=seed,
            steps=4,
            config=ExperimentConfig.from_dict(values).to_dict(),
        )
        trace = [{"step": float(step), "loss_seg": 1.0 / (step + seed)} for step in range(1, 4)]
        seeds.append(SeedOutputs(record, {"val": eval_result(rng, 0.1 * seed)}, trace))
    write_fused_outputs(checkpoint, "fused_00000", "completed", seeds)
    lines = []
    for number in (1, 2):
        results = [epoch(seed=seed, number=number) for seed in (3, 5)]
        lines.append(json.dumps({**tune_result(results), "training_iteration": number}))
    (folder / "result.json").write_text("\n".join(lines) + "\n")
    return folder


def test_a_trial_of_two_seeds_is_two_trial_rows_in_analysis_and_in_an_export(tmp_path):
    root = tmp_path / "fused"
    folder = write_two_seed_trial(root)
    top = read_trial_record(folder / "checkpoint_000000" / "outputs")
    assert isinstance(top, FusedTrialRecord) and top.seed_folders == {3: "seed3", 5: "seed5"}
    export_experiment(str(root), tmp_path / "copy")
    for copy in (root, tmp_path / "copy"):
        loaded = analysis.load(copy)
        assert loaded.problems.empty
        trials = loaded.trials.set_index("trial")
        ids = [seed_row_id("fused_00000", seed) for seed in (3, 5)]
        assert sorted(trials.index) == ids
        assert trials.loc[ids, "seed"].tolist() == [3, 5]
        assert trials.loc[ids, "val_worst"].tolist() == pytest.approx([0.3, 0.5])
        assert loaded.scores.groupby("trial", observed=True).size().to_dict() == {
            trial: 24 for trial in ids
        }
        traces = loaded.traces.groupby("trial", observed=True)["loss_seg"].first()
        assert traces.to_dict() == pytest.approx({ids[0]: 1 / 4, ids[1]: 1 / 6})
        epochs = loaded.epochs.set_index(["trial", "epoch"])
        assert epochs.loc[(ids[0], 2), "worst"] == pytest.approx(3.3)  # the seed's own
        assert epochs.loc[(ids[1], 2), "val_bias"] == pytest.approx(0.6)
        assert len(epochs) == 4
