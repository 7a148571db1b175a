"""Validation on a cadence (`train.eval_every`): which epochs a trial validates (every k-th,
the last one and ASHA's rungs), what an epoch without validation reports (NaN, never the last
validation's numbers, and ASHA never ranks it), the config check, and a tiny sweep end to end:
validating every second epoch changes no trained number, and a trial that crashes and is
retried from its checkpoint ends with the numbers of one that did not."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.cli.sweep import main
from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.experiment.outputs import read_trial_info
from relif_ray.experiment.record import UNEVALUATED_METRICS
from relif_ray.sweep.labels import grid_variants
from relif_ray.sweep.plan import TuneOptions
from relif_ray.tuning.integrations import asha_rung_epochs
from relif_ray.tuning.trainable import evaluates_after
from tests.conftest import in_code, tiny_config

EPOCHS = 3


def evaluated_epochs(epochs: int, eval_every: int, rungs: list[int]) -> list[int]:
    return [e for e in range(1, epochs + 1) if evaluates_after(e, eval_every, e == epochs, rungs)]


@pytest.mark.parametrize(
    ("epochs", "eval_every", "asha", "expected"),
    [
        (5, 1, None, [1, 2, 3, 4, 5]),  # the default: every epoch, as before the cadence
        (5, 2, None, [2, 4, 5]),  # the last epoch always
        (6, 3, None, [3, 6]),
        (4, 10, None, [4]),  # a cadence longer than the run: the last epoch only
        (10, 4, {"asha_max_epochs": 10}, [1, 3, 4, 8, 9, 10]),  # rungs 1, 3, 9, 10
        (
            7,
            3,
            {"asha_max_epochs": 7, "asha_grace_epochs": 2, "asha_reduction_factor": 2},
            [2, 3, 4, 6, 7],
        ),  # rungs 2, 4, 7  # fmt: skip
    ],
)
def test_a_trial_validates_every_kth_epoch_its_last_and_at_every_asha_rung(
    epochs, eval_every, asha, expected
):
    rungs = asha_rung_epochs(TuneOptions(scheduler="asha", **asha)) if asha else []
    assert evaluated_epochs(epochs, eval_every, rungs) == expected
    assert set(rungs) & set(range(1, epochs + 1)) <= set(expected)


@pytest.mark.parametrize("value", [0, -2])
def test_eval_every_below_one_is_a_one_line_error_naming_the_field(
    value, nyuv2_dir, capsys, no_sweep
):
    with pytest.raises(
        UserError, match=rf"^config field train.eval_every: must be > 0, got {value}$"
    ):
        ExperimentConfig.from_dict({"train": {"eval_every": value}})
    argv = ["--data-dir", str(nyuv2_dir), "--set", f"train.eval_every={value}"]
    assert main(datasets=("nyuv2",), argv=[*argv, "--storage", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        f"config field train.eval_every: must be > 0, got {value}"
    )


def test_asha_never_ranks_an_epoch_without_validation():
    """An epoch that did not validate reports NaN (never the last validation's numbers) and
    `evaluated: false`; ASHA passes over it, so the trial's first rung is ranked on its first
    validated result."""
    from ray.tune.schedulers import TrialScheduler

    from relif_ray.tuning.integrations import scheduler

    asha = scheduler(TuneOptions(scheduler="asha", scheduler_metric="worst", asha_max_epochs=9))
    config = {"method.name": "erm", "relif.enabled": True}
    trials = [SimpleNamespace(trial_id=f"t{i}", config=config) for i in range(2)]
    for trial in trials:
        asha.on_trial_add(None, trial)
    best = {"training_iteration": 1, "worst": 0.9, "evaluated": True}
    assert asha.on_trial_result(None, trials[0], best) == TrialScheduler.CONTINUE
    stale = {"training_iteration": 1, **dict.fromkeys(UNEVALUATED_METRICS, math.nan)}
    skipped = {**stale, "evaluated": False}
    assert asha.on_trial_result(None, trials[1], skipped) == TrialScheduler.CONTINUE
    worse = {"training_iteration": 1, "worst": 0.1, "evaluated": True}
    assert asha.on_trial_result(None, trials[1], worse) == TrialScheduler.STOP


def epoch_records(outputs: Path) -> list[dict]:
    lines = (Path(outputs).parents[1] / "result.json").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def cadence_sweep(ray_session, small_data, sweep_folder) -> Path:
    """ERM, seed 0, 3 epochs of 2 steps, three times: validating every second epoch, the same
    crashing at step 3 (inside epoch 2, after the epoch-1 checkpoint) and retried, and
    validating every epoch. One trial at a time (one trial worker to start, not two) and SGD
    (a checkpoint with one momentum buffer, not Adam's two moments)."""
    from relif_ray.sweep.plan import Resources, param_space
    from relif_ray.tuning.launch import run_sweep

    train = {"epochs": EPOCHS, "eval_every": 2, "optimizer": "sgd"}
    base = ExperimentConfig.from_dict(tiny_config(small_data, **train))
    space = param_space(base, grid_variants(["erm"], [], []), [0], 0.2)
    (trial,) = space.trials
    space.trials = [
        trial,
        replace(trial, fault_injection_step=3),
        replace(trial, overrides={**trial.overrides, "train.eval_every": 1}),
    ]
    resources = Resources(cpus_per_trial=1, num_cpus=2)
    options = TuneOptions(max_concurrent_trials=1)
    request = in_code(space, "cadence", sweep_folder, resources=resources, options=options)
    return Path(run_sweep(request, verbose=0))


@pytest.mark.slow
def test_validating_every_second_epoch_changes_no_number_also_after_a_retry(cadence_sweep):
    loaded = analysis.load(cadence_sweep)
    assert loaded.problems.empty and len(loaded.trials) == 3
    runs = {}
    for trial, outputs in loaded.outputs.items():
        info = read_trial_info(outputs)
        key = (info["config"]["train"]["eval_every"], info["restored_from_checkpoint"])
        runs[key] = (trial, epoch_records(outputs))
    assert set(runs) == {(2, False), (2, True), (1, False)}
    for (every, _), (_, records) in runs.items():
        assert [r["training_iteration"] for r in records] == [1, 2, 3]
        validated = [r["training_iteration"] for r in records if r["evaluated"]]
        assert validated == ([2, 3] if every == 2 else [1, 2, 3])
    skipped = runs[(2, False)][1][0]
    assert all(math.isnan(skipped[key]) for key in UNEVALUATED_METRICS)
    assert not any(key.startswith("val_") and key not in UNEVALUATED_METRICS for key in skipped)
    assert "time_evaluate_s" not in skipped
    reference_trial, reference = runs[(1, False)]
    for trial, records in (runs[(2, False)], runs[(2, True)]):
        for epoch in (1, 2):  # epochs 2 and 3: the same validation as every-epoch validation
            for key in ("worst", "macro", "val_bias", "val_vr"):
                assert records[epoch][key] == reference[epoch][key], (trial, epoch, key)
        for frame in (loaded.traces, loaded.scores):  # every step's numbers, val and test scores
            pd.testing.assert_frame_equal(rows_of(frame, trial), rows_of(frame, reference_trial))


def rows_of(frame: pd.DataFrame, trial: str) -> pd.DataFrame:
    return frame[frame["trial"] == trial].drop(columns=["trial"]).reset_index(drop=True)
