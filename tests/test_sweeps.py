"""The sweep system: grid, Optuna, logical-GPU packing, crash recovery, resume, flag checks.

In-process sweeps share the session's local Ray (2 CPUs, 2 logical GPUs); only the kill-and-
resume test and the local-GPU check run the sweep driver as a subprocess, because the driver
itself is under test there.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray
import torch
from ray import tune

from relif_ray import analysis
from relif_ray.audit import fixed_delta_audit
from relif_ray.cli.sweep import NYUV2, build_parser, main
from relif_ray.cli.sweep import base_config as sweep_base_config
from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.experiment.outputs import read_trial_info
from relif_ray.squash import squash
from relif_ray.sweep.exit_status import SweepStopped
from relif_ray.sweep.labels import grid_variants, split_label, uses_controller, variant
from relif_ray.sweep.plan import controller_variants
from relif_ray.sweep.request import SweepRequest
from relif_ray.sweep.trial_config import (
    TrialSpec,
    TuneKeys,
    experiment_config,
    tune_constants,
    tune_trial,
)
from relif_ray.tuning.trainable import STATE_FILE, readable_state
from tests.conftest import HANG_GUARD_S, tiny_config
from tests.local_cluster import LOCALHOST, listening_addresses

REPO = Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH = 2
VAL_SIZE = 6


def base_config(root: Path, **train) -> ExperimentConfig:
    config = tiny_config(root, **train)
    config["relif"] = {"warmup_steps": 2}
    return ExperimentConfig.from_dict(config)


def trial_params(outputs: Path) -> dict:
    """The Tune config of the trial that wrote `outputs` (trial/checkpoint_N/outputs)."""
    return json.loads((Path(outputs).parents[1] / "params.json").read_text())


def last_result(outputs: Path) -> dict:
    lines = (Path(outputs).parents[1] / "result.json").read_text().splitlines()
    return json.loads(lines[-1])


def trial_states(experiment: Path) -> dict[str, tuple[str, int]]:
    """trial id -> (status, num_failures) from Tune's latest experiment state."""
    from ray.tune import ExperimentAnalysis

    return {
        trial.trial_id: (trial.status, trial.run_metadata.num_failures)
        for trial in ExperimentAnalysis(str(experiment)).trials
    }


# --- without Ray -------------------------------------------------------------------------


def _checkpointed_epochs(
    cadence, seconds_per_epoch: float, epochs: int, monkeypatch, checkpoint_s: float = math.nan
) -> list:
    """The epochs after which `cadence` asks Tune for a checkpoint, epochs taking this long
    and each checkpoint `checkpoint_s` (reported with the next result, as the Trainable does;
    NaN before the first)."""
    from types import SimpleNamespace

    import relif_ray.tuning.launch as launch
    from relif_ray.experiment.record import CHECKPOINT_SECONDS

    clock = [100.0]
    monkeypatch.setattr(launch.time, "monotonic", lambda: clock[0])
    trial = SimpleNamespace(trial_id="t", last_result={})
    cadence.on_trial_start(0, [], trial)
    asked, last_save = [], math.nan
    for epoch in range(1, epochs + 1):
        clock[0] += seconds_per_epoch
        result = {"training_iteration": epoch, CHECKPOINT_SECONDS: last_save}
        cadence.on_trial_result(0, [], trial, result)
        if result.get("should_checkpoint"):
            asked.append(epoch)
            clock[0] += checkpoint_s if math.isfinite(checkpoint_s) else 0.0
            last_save = checkpoint_s
    return asked


@pytest.mark.parametrize(
    ("every", "interval", "rungs", "seconds", "expected"),
    [
        (1, 0.0, (), 1.0, [1, 2, 3, 4, 5, 6, 7, 8]),  # every epoch
        (1, 10.0, (), 1.0, []),  # 8 s of 1-s epochs: none before the final (Tune's own)
        (1, 10.0, (), 4.0, [3, 6]),  # at least 10 s apart
        (1, 10.0, (), 30.0, [1, 2, 3, 4, 5, 6, 7, 8]),  # long epochs: every epoch
        (2, 0.0, (), 1.0, [2, 4, 6, 8]),
        (0, 0.0, (), 1.0, []),  # only the final one
        (1, 10.0, (1, 4), 1.0, [1, 4]),  # ASHA rungs always (outputs are written there)
    ],
)
def test_checkpoints_follow_epochs_at_most_once_per_interval(
    every, interval, rungs, seconds, expected, monkeypatch
):
    from relif_ray.tuning.launch import CheckpointCadence

    cadence = CheckpointCadence(every, interval, rungs)
    assert _checkpointed_epochs(cadence, seconds, 8, monkeypatch) == expected


@pytest.mark.parametrize(
    ("epoch_s", "checkpoint_s", "expected"),
    [
        (3.0, 1.5, [4, 14, 24, 34]),  # 1.5-s checkpoints at least 30 s apart
        (3.0, 0.1, [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]),  # cheap ones: the 10-s floor
        (60.0, 1.5, list(range(1, 41))),  # long epochs: every epoch
    ],
)
def test_checkpoints_take_at_most_their_share_of_a_trials_time(
    epoch_s, checkpoint_s, expected, monkeypatch
):
    """After a checkpoint of c seconds the next waits c / CHECKPOINT_SHARE seconds, so the
    trial spends at most that share of its time on them (here 5%)."""
    from relif_ray.tuning.launch import CHECKPOINT_SHARE, CheckpointCadence

    cadence = CheckpointCadence(1, 10.0)
    asked = _checkpointed_epochs(cadence, epoch_s, 40, monkeypatch, checkpoint_s)
    assert asked == expected
    spent = len(asked) * checkpoint_s
    assert spent <= CHECKPOINT_SHARE * (40 * epoch_s + spent)
    assert CHECKPOINT_SHARE == 0.05


def test_controller_labels_are_crossed_with_the_controller_grid_and_others_are_not():
    labels = ["erm", "relif", "pcgrad+relif-noalign", "relif-static", "gradnorm+relif-nolip"]
    variants = grid_variants(labels, [0.2, 0.3], [1e-3])
    assert [v["label"] for v in variants] == [
        "erm", "relif", "relif", "pcgrad+relif-noalign", "pcgrad+relif-noalign", "relif-static",
        "gradnorm+relif-nolip",
    ]  # fmt: skip
    assert variants[0]["overrides"] == {"method.name": "erm", "relif.enabled": False}
    assert variants[4]["overrides"] == {
        "method.name": "pcgrad",
        "relif.enabled": True,
        "relif.quantile_alignment": False,
        "relif.r_star": 0.3,
        "relif.eta": 1e-3,
    }
    assert variants[6]["overrides"] == {
        "method.name": "gradnorm",
        "relif.enabled": True,
        "relif.lipschitz_branch": False,
    }
    assert split_label("relif-static") == ("erm", "relif-static")
    with pytest.raises(UserError, match="cannot parse 'erm\\+foo'"):
        split_label("erm+foo")


def test_one_rule_says_which_labels_adapt_lambda(tmp_path):
    """relif-nolip keeps lambda at 0 and relif-static at lambda0: neither adapts, so neither is
    crossed with (r*, eta), nor reports them, and the regularizer's controller holds lambda."""
    from relif_ray.relif.regularizer import ReLiFRegularizer
    from relif_ray.sweep.labels import setting_values

    adapting = {"relif", "relif-noalign", "pcgrad+relif", "pcgrad+relif-noalign"}
    labels = [*adapting, "erm", "pcgrad", "relif-nolip", "relif-static", "pcgrad+relif-nolip"]
    for label in labels:
        trial = tune_config(base_config(tmp_path), variant(label, 0.2, 0.5), 0)
        relif = experiment_config(trial).relif
        adapts = label in adapting
        assert uses_controller(label) == relif.controller_adapts() == adapts, label
        reported = setting_values(relif)
        expected = [0.2, 0.5] if adapts else [np.nan, np.nan]
        np.testing.assert_array_equal([reported["r_star"], reported["eta"]], expected)
        if relif.enabled:
            assert ReLiFRegularizer(relif, ["seg", "depth"]).controller.adaptive == adapts


def tune_config(base: ExperimentConfig, item: dict, seed: int) -> dict:
    """A trial's Tune config as Tune merges it: the sweep's constants, then the trial's part."""
    return {**tune_constants(base, 0.2), **tune_trial(TrialSpec.of(item, seed))}


def test_trial_config_is_base_then_overrides_then_seed(tmp_path):
    base = base_config(tmp_path)
    trial = tune_config(base, variant("relif-static", extra={"relif.lambda0": 0.3}), 4)
    config = experiment_config(trial)
    assert config.seed == 4 and config.relif.enabled and config.relif.controller == "static"
    assert config.relif.lambda0 == 0.3 and config.relif.warmup_steps == 2
    assert base == base_config(tmp_path)  # the shared base is not mutated


def test_tune_config_is_the_resolved_config_as_flat_keys(tmp_path):
    """What Tune stores, and ExperimentAnalysis, W&B and MLflow show, is what runs: every
    ExperimentConfig field as a flat dotted key, the label and delta; nothing nested."""
    from relif_ray.config import flat_config

    trial = tune_config(base_config(tmp_path), variant("pcgrad+relif", 0.2, 1e-2), 3)
    config = experiment_config(trial)
    assert trial["seed"] == 3 and trial["relif.enabled"] is True
    assert trial["method.name"] == "pcgrad" and trial["relif.r_star"] == 0.2
    assert trial["label"] == "pcgrad+relif" and trial["delta"] == 0.2
    assert {key: trial[key] for key in flat_config(config.to_dict())} == flat_config(
        config.to_dict()
    )
    assert set(trial) == {*flat_config(config.to_dict()), "label", "delta"}
    assert not any(isinstance(value, dict) and value for value in trial.values())


def test_a_trial_is_typed_until_tune_and_its_tune_form_round_trips(tmp_path):
    """The plan holds a typed base config and TrialSpecs; Tune's flat form is made and read in
    `relif_ray.sweep.trial_config` alone (overrides.py flattens --config files, not trials),
    and reading it back gives exactly the config the plan resolved."""
    base = base_config(tmp_path)
    items = [variant("erm"), variant("relif-static", extra={"relif.lambda0": 0.3})]
    items += [variant("pcgrad+relif", 0.2, 1e-2, {"model.architecture": "mtan"})]
    for item in items:
        trial = TrialSpec.of(item, 5, fault_injection_step=3)
        shared = TuneKeys(experiment_dir="/x", outputs_at_iterations=(1, 3))
        tune_config = {**tune_constants(base, 0.2, shared), **tune_trial(trial)}
        assert experiment_config(tune_config) == trial.config(base)
        assert TuneKeys.of(tune_config) == TuneKeys(
            label=item["label"],
            seed=5,
            delta=0.2,
            fault_injection_step=3,
            outputs_at_iterations=(1, 3),
            experiment_dir="/x",
        )
    flattening = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "relif_ray").rglob("*.py")
        if re.search(r"\b(flat_config|nested_config)\(", path.read_text())
    }
    assert flattening == {
        "relif_ray/config.py", "relif_ray/sweep/trial_config.py", "relif_ray/sweep/overrides.py"
    }  # fmt: skip


def test_controller_sensitivity_grid_matches_the_paper():
    variants = controller_variants(
        0.16,
        [1e-4, 1e-3, 1e-2],
        [0.16 + 0.02 * i for i in range(7)],
        1e-3,
        [0.01, 0.03, 0.1, 0.3, 1.0],
    )
    relif = [v["overrides"] for v in variants if v["label"] == "relif"]
    static = [v["overrides"]["relif.lambda0"] for v in variants if v["label"] == "relif-static"]
    assert [v["label"] for v in variants].count("erm") == 1
    assert sorted(o["relif.eta"] for o in relif if o["relif.r_star"] == 0.16) == [1e-4, 1e-3, 1e-2]
    r_stars = sorted(o["relif.r_star"] for o in relif if o["relif.eta"] == 1e-3)
    np.testing.assert_allclose(r_stars, np.arange(0.16, 0.2801, 0.02))
    assert len(relif) == 3 + 7 - 1  # (0.16, 1e-3) is in both checks and trained once
    assert static == [0.01, 0.03, 0.1, 0.3, 1.0]


def test_gpu_packing_concurrency():
    from relif_ray.sweep.plan import Resources

    assert Resources(gpus_per_trial=0.5, num_gpus=8).max_concurrent_trials == 16
    assert Resources(gpus_per_trial=0.3, num_gpus=1).max_concurrent_trials == 3
    assert Resources(gpus_per_trial=0, num_gpus=0).max_concurrent_trials is None


def _score_frame(seg: np.ndarray, depth: np.ndarray) -> pd.DataFrame:
    n = depth.size
    return pd.DataFrame(
        {
            "task": ["seg"] * n + ["depth"] * n,
            "example_id": np.tile(np.arange(n), 2),
            "score": np.concatenate([seg, depth]),
            "valid": True,
        }
    )


def test_live_audit_squashes_raw_scores_with_their_own_quantiles():
    from relif_ray.live_audit import LiveValidationAudit

    rng = np.random.default_rng(0)
    seg, depth = rng.uniform(0, 1, 40), rng.gamma(2.0, 3.0, 40)
    frame = _score_frame(seg, depth)
    result = LiveValidationAudit({"seg"}, delta=0.1)(frame)
    low, high = np.quantile(depth, [0.1, 0.9])
    squashed = frame.assign(score=frame["score"].astype(float))
    squashed.loc[squashed["task"] == "depth", "score"] = np.clip(
        (depth - low) / (high - low + 1e-6), 0, 1
    )
    assert result.bias == pytest.approx(fixed_delta_audit(squashed, 0.1).bias, abs=1e-12)
    # An affine change of the raw depth scale barely moves the self-squashed audit
    rescaled = _score_frame(seg, 7.0 * depth + 3.0)
    again = LiveValidationAudit({"seg"}, delta=0.1)(rescaled)
    assert again.bias == pytest.approx(result.bias, abs=1e-6)


def test_live_audit_drops_invalid_and_non_finite_rows():
    from relif_ray.live_audit import LiveValidationAudit

    rng = np.random.default_rng(1)
    frame = _score_frame(rng.uniform(0, 1, 20), rng.uniform(0, 5, 20))
    clean = LiveValidationAudit({"seg"}, delta=0.2)(frame)
    noisy = pd.concat(
        [
            frame,
            pd.DataFrame(
                {
                    "task": ["depth", "depth"],
                    "example_id": [98, 99],
                    "score": [np.nan, 1e9],
                    "valid": [True, False],
                }
            ),
        ],
        ignore_index=True,
    )
    assert LiveValidationAudit({"seg"}, delta=0.2)(noisy).bias == clean.bias
    assert LiveValidationAudit({"seg"}, delta=0.2)(frame[frame["task"] == "seg"]) is None


def test_a_trials_live_audit_samples_its_pairs_once_and_gives_fixed_delta_audit_numbers(
    monkeypatch: pytest.MonkeyPatch,
):
    """Epoch after epoch on the same rows, the live audit gives the exact numbers of
    fixed_delta_audit on the squashed frame, drawing Algorithm 1's pairs once; when the rows
    change (a score turns NaN) it draws them again, for the new rows."""
    from relif_ray import live_audit

    draws = []
    sample_pairs = live_audit.sample_pairs
    monkeypatch.setattr(
        live_audit, "sample_pairs", lambda frame: draws.append(len(frame)) or sample_pairs(frame)
    )
    constants = {"depth": [1.0, 9.0]}
    audit = live_audit.LiveValidationAudit({"seg"}, 0.1, constants)
    rng = np.random.default_rng(3)
    for epoch in range(4):
        frame = _score_frame(rng.uniform(0, 1, 300), rng.gamma(2.0, 3.0, 300))
        if epoch == 3:
            frame.loc[5, "score"] = np.nan
        squashed = frame[np.isfinite(frame["score"])].copy()
        depth = squashed["task"] == "depth"
        squashed.loc[depth, "score"] = np.clip(
            squash(squashed.loc[depth, "score"].to_numpy(), 1.0, 9.0), 0, 1
        )
        expected = fixed_delta_audit(squashed, 0.1)
        result = audit(frame)
        assert (result.bias, result.vr) == (expected.bias, expected.vr)
        assert result.pairs == expected.pairs
    assert draws == [600, 599]


def test_pareto_front_keeps_the_non_dominated_rows_of_each_study():
    from relif_ray.sweep.selection import pareto_front

    rows = pd.DataFrame(
        {
            "study": ["a", "a", "a", "a", "b"],
            "val_bias": [0.1, 0.2, 0.05, 0.2, 0.9],
            "val_worst": [0.5, 0.6, 0.4, 0.5, 0.1],
        }
    )
    front = pareto_front(rows)
    assert front[["study", "val_bias", "val_worst"]].values.tolist() == [
        ["a", 0.05, 0.4],
        ["a", 0.1, 0.5],
        ["a", 0.2, 0.6],
        ["b", 0.9, 0.1],
    ]
    # each study's hypervolume against (Bias 1, Worst 0), by hand: a: 0.05 x 0.4 + 0.1 x 0.5
    # + 0.8 x 0.6 (its dominated points add nothing); b: 0.1 x 0.1
    assert front["val_hypervolume"].tolist() == pytest.approx([0.55] * 3 + [0.01], abs=1e-15)


def test_study_groups_give_each_label_and_seed_its_budget_in_range():
    from ray.tune.search import Searcher

    from relif_ray.sweep.plan import OptunaPlan
    from relif_ray.tuning.search import StudyGroups

    plan = OptunaPlan(["relif", "relif-noalign"], [0, 1], 2, (0.1, 0.4), (1e-4, 1e-2))
    searcher = StudyGroups(plan)
    suggestions = [searcher.suggest(f"t{i}") for i in range(8)]
    assert searcher.suggest("t8") == Searcher.FINISHED
    studies = [s["study"] for s in suggestions]
    assert sorted(set(studies)) == [
        "relif-noalign/seed0",
        "relif-noalign/seed1",
        "relif/seed0",
        "relif/seed1",
    ]
    assert all(studies.count(name) == 2 for name in set(studies))
    for s in suggestions:  # Optuna's suggestions land in the resolved config's fields
        assert 0.1 <= s["relif.r_star"] <= 0.4 and 1e-4 <= s["relif.eta"] <= 1e-2
        assert s["seed"] == int(s["study"][-1]) and s["label"] == s["study"][:-6]
        assert s["relif.enabled"] is True and s["method.name"] == "erm"
    replay = [StudyGroups(plan).suggest(f"t{i}") for i in range(1)]
    assert replay[0] == suggestions[0]  # seeded samplers: the same plan suggests the same


def test_study_groups_resume_from_json_and_draw_what_an_uninterrupted_run_draws(tmp_path):
    """What Tune does to the searcher when a killed Optuna sweep is resumed: the snapshot is
    plain JSON (each study's trials), the studies are rebuilt from it, and every later
    suggestion is the one the sweep would have made without the interruption."""
    from relif_ray.sweep.plan import OptunaPlan
    from relif_ray.tuning.search import StudyGroups

    plan = OptunaPlan(["relif"], [0, 1], 6, (0.1, 0.4), (1e-4, 1e-2))

    def suggestions(cut: int | None) -> list[dict]:
        searcher, made = StudyGroups(plan), []
        for i in range(12):
            if i == cut:
                searcher.save(str(tmp_path / "state.pkl"))
                searcher = StudyGroups(OptunaPlan(["other"], [9], 5, (0.2, 0.3), (1e-3, 2e-3)))
                searcher.restore(str(tmp_path / "state.pkl"))
            made.append(searcher.suggest(f"t{i}"))
            r_star = made[-1]["relif.r_star"]
            outcome = {"val_bias": abs(r_star - 0.25), "worst": 1 - r_star} if i % 4 else None
            searcher.on_trial_complete(f"t{i}", outcome, error=outcome is None)
        assert searcher.suggest("t12") == "FINISHED"
        return made

    uninterrupted = suggestions(None)
    assert suggestions(7) == uninterrupted and suggestions(1) == uninterrupted
    state = json.loads((tmp_path / "state.pkl").read_text())  # the snapshot made before t1
    assert state["trials"]["relif/seed0"] == [
        {
            "trial_id": "t0",
            "params": {
                "r_star": uninterrupted[0]["relif.r_star"],
                "eta": uninterrupted[0]["relif.eta"],
            },
            "state": "fail",
        }
    ]
    assert len({(s["relif.r_star"], s["relif.eta"]) for s in uninterrupted}) == 12


def test_an_unreachable_cluster_address_is_reported_at_once():
    from relif_ray.tuning.cluster import check_reachable

    with pytest.raises(UserError, match="--address 127.0.0.1:1: no Ray cluster answers there"):
        check_reachable("127.0.0.1:1")
    check_reachable("auto")  # left to ray.init, which fails fast for it


def test_storage_probe_reports_what_is_wrong(tmp_path):
    from relif_ray.experiment.storage import storage_problem

    probe = tmp_path / "probe"
    assert storage_problem(str(probe), "token") == "the directory is not visible there"
    probe.write_text("other")
    assert "different directory" in storage_problem(str(probe), "token")
    probe.write_text("token")
    assert storage_problem(str(probe), "token") is None


def test_the_storage_probe_task_imports_neither_torch_nor_ray_tune():
    """The probe runs as a Ray task on every node of a cluster (`check_storage_visible`); Ray
    imports the function's module in a fresh worker for it. Its module used to be the Tune
    layer's launch module, which loads torch and Ray Tune: 3.5 s of CPU on each node."""
    from relif_ray.experiment.storage import storage_problem

    modules = modules_loaded_by(storage_problem.__module__)
    assert {"relif_ray.experiment.storage", "pyarrow"} <= modules
    assert not {"torch", "ray", "ray.tune"} & modules


def test_the_sweep_command_loads_no_library_that_only_some_trials_use():
    """Every sweep driver and `relif` command loads the problem and method registries. SciPy
    (0.4 s: the clinical AUROC's ranks, FairGrad's solver) and torchvision (1 s with
    `torch._dynamo`: the ResNet of the dense problems) are imported where they are used; Ray
    only once the sweep runs, after the driver kept a local Ray on 127.0.0.1 (which must come
    before Ray is imported: `relif_ray.tuning.keep_local_ray_on_loopback`)."""
    modules = modules_loaded_by("relif_ray.cli.sweep")
    assert {"relif_ray.problems.mimic3", "relif_ray.methods.fairgrad", "torch"} <= modules
    assert not {"scipy", "torchvision", "torch._dynamo", "ray"} & modules


def modules_loaded_by(module: str) -> set[str]:
    """Every module that importing `module` loads, in a fresh interpreter."""
    code = f"import sys, {module}; print(sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    return set(ast.literal_eval(loaded.stdout))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--seeds", "0,0"], "--seeds: a list needs distinct"),
        (["--methods", "erm,nosuch"], "unknown method 'nosuch'"),
        (["--methods", "erm+relif-foo"], "cannot parse 'erm+relif-foo'"),
        (["--search", "optuna", "--methods", "erm,relif"], "'erm' does not use them"),
        (["--search", "optuna", "--methods", "relif-static"], "'relif-static' does not use"),
        (["--search", "optuna", "--r-star-range", "0.3,0.1"], "--r-star-range"),
        (["--search", "optuna", "--eta-range", "0,1e-2"], "--eta-range"),
        (["--search", "bayes"], "argument --search: invalid choice"),
        (["--epochs", "x"], "argument --epochs: invalid int value"),
        (["--gpus-per-trial", "1"], "--gpus-per-trial 1: trials ask for GPUs but --num-gpus"),
        (["--num-gpus", "2", "--gpus-per-trial", "1.5"], "whole number of GPUs"),
        (["--num-gpus", "1", "--gpus-per-trial", "2"], "exceeds --num-gpus 1"),
        (["--cpus-per-trial", "0"], "--cpus-per-trial: must be > 0"),
        (["--delta", "2"], "--delta: must be in [0, 1]"),
        (["--epochs", "0"], "train.epochs"),
        (["--methods", "erm,relif", "--eta", "-1"], "relif.eta"),
        (["--methods", "relif-static", "--warmup-steps", "-1"], "relif.warmup_steps"),
        (["--name", "../x"], "--name: must be a plain folder name"),
        (["--set", "train.lr=fast"], "--set: config field train.lr: expected float, got 'fast'"),
        (["--set", "train.speed=1"], "--set train.speed: unknown config field"),
        (["--set", "train=1"], "--set train: a section, not a field"),
        (["--set", "train.lr"], "--set: expected section.field=value, got 'train.lr'"),
        (["--set", "method.name=pcgrad"], "--set method.name: set by --methods"),
        (["--set", "relif.enabled=true"], "--set relif.enabled: set by --methods"),
        (["--set", "seed=3"], "--set seed: set by --seeds"),
        (["--set", "data.root=/x"], "--set data.root: set by --dataset and --data-dir"),
        (["--set", "train.precision=fp16"], "config field train.precision: must be one of"),
        (["--config", "/nonexistent/c.yaml"], "--config: no such file: /nonexistent/c.yaml"),
        (["--pretrained", "/nonexistent/w.pt"], "model.pretrained: no such state_dict file"),
        (["--precision", "fp16"], "argument --precision: invalid choice"),
        (["--scheduler", "pbt"], "argument --scheduler: invalid choice"),
        (["--max-concurrent-trials", "0"], "--max-concurrent-trials: must be > 0"),
        (["--checkpoint-interval", "-1"], "--checkpoint-interval: must be >= 0 seconds, got -1"),
        (["--callbacks", "comet"], "--callbacks: unknown logger 'comet'"),
    ],
)
def test_bad_flags_are_one_line_errors_before_ray_starts(
    args, fragment, nyuv2_dir, capsys, no_sweep
):
    status = main(
        datasets=("nyuv2",),
        argv=["--data-dir", str(nyuv2_dir), *args, "--storage", "/nonexistent/x"],
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert fragment in err[0] and err[0].split(": error: ")[1]


@pytest.mark.parametrize(
    ("budget", "fragment"),
    [
        (["--steps", "-5"], "config field train.max_steps: must be > 0, got -5"),
        (["--steps", "0", "--epochs", "2"], "config field train.max_steps: must be > 0, got 0"),
        (["--epochs", "-1"], "config field train.epochs: must be > 0, got -1"),
    ],
)
def test_a_bad_budget_is_the_same_one_line_error_with_and_without_demo(
    budget, fragment, nyuv2_dir, tmp_path, capsys, no_sweep
):
    """--demo scales its controller to --steps (scale_to_budget): a budget that is not
    positive is refused by the config check first, as with --data-dir."""
    errors = []
    for data in (["--demo"], ["--data-dir", str(nyuv2_dir)]):
        status = main(datasets=("nyuv2",), argv=[*data, *budget, "--storage", str(tmp_path)])
        errors.append(capsys.readouterr().err.strip().splitlines())
        assert status == 2 and len(errors[-1]) == 1, errors[-1]
    assert errors[0] == errors[1] and errors[0][0].endswith(fragment), errors
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--static-lambdas", "0.001"], "relif.lambda0: need 0 <= lambda_min <= lambda0"),
        (["--etas", "1e-3,x"], "--etas value must be a number, got 'x'"),
        (["--dataset", "nosuch"], "argument --dataset: invalid choice"),
        (["--methods", "erm"], "unrecognized arguments: --methods erm"),
    ],
)
def test_controller_sensitivity_rejects_bad_flags(args, fragment, nyuv2_dir, capsys, no_sweep):
    argv = ["--data-dir", str(nyuv2_dir), *args, "--storage", "/nonexistent/x"]
    status = main(argv, controller_checks=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and fragment in err[0], err


def test_help_says_what_steps_and_epochs_each_do():
    text = " ".join(build_parser(NYUV2).format_help().split())
    assert "alone, exactly N steps" in text and "the smaller of the two budgets wins" in text


@pytest.mark.parametrize(
    ("flags", "budget"),
    [
        ([], (None, 240)),  # the demo's own budget is a step count
        (["--steps", "7"], (None, 7)),
        (["--steps", "160", "--epochs", "2"], (2, 160)),
        (["--epochs", "3"], (3, None)),
    ],
)
def test_steps_without_epochs_set_the_length_and_with_epochs_the_smaller_wins(
    flags, budget, tmp_path
):
    args = build_parser(NYUV2).parse_args(["--demo", *flags])
    train = sweep_base_config(args, NYUV2, str(tmp_path)).train
    assert (train.epochs, train.max_steps) == budget


@pytest.mark.parametrize(
    ("flags", "eta", "warmup"),
    [
        ([], 19.8 / 240, 1),  # eta x steps = 19.8 and warmup / steps as in the paper's run
        (["--steps", "4000"], 19.8 / 4000, 20),
        (["--eta", "0.01", "--warmup-steps", "7"], 0.01, 7),  # given values win
        (["--epochs", "3"], 1e-3, 100),  # an epoch budget before the demo's data exists
    ],
)
def test_the_demo_scales_the_controller_to_its_step_budget(flags, eta, warmup, tmp_path):
    from relif_ray.cli.sweep import controller_grid

    args = build_parser(NYUV2).parse_args(["--demo", *flags])
    base = sweep_base_config(args, NYUV2, str(tmp_path))
    assert base.relif.warmup_steps == warmup
    r_stars, etas = controller_grid(args, NYUV2, base)
    assert r_stars == [0.24] and etas == [pytest.approx(eta, rel=1e-5)]


def test_scale_to_budget_keeps_the_papers_eta_steps_product_and_warmup_share():
    from relif_ray.relif.controller import PAPER_NYUV2_STEPS, scale_to_budget

    assert PAPER_NYUV2_STEPS == 200 * 99  # 795 images in full batches of 8, 200 epochs
    assert scale_to_budget(PAPER_NYUV2_STEPS) == (1e-3, 100)
    for steps in (24, 240, 1500, 40_000):
        eta, warmup = scale_to_budget(steps)
        assert eta * steps == pytest.approx(19.8)
        assert warmup == max(1, round(100 * steps / 19_800))
    with pytest.raises(ValueError):
        scale_to_budget(0)


@pytest.fixture
def own_stop_signals():
    """The handlers of the stop signals as they were, put back after the test (which sends
    them to this process: only its main thread can handle them)."""
    from relif_ray.tuning.stop import STOP_SIGNALS

    assert threading.current_thread() is threading.main_thread()
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    yield STOP_SIGNALS
    for number, handler in before.items():
        signal.signal(number, handler)


def test_the_first_stop_signal_is_tunes_graceful_stop_and_a_second_its_hard_stop(
    own_stop_signals,
):
    """Real signals to this process: while Tune's loop runs (its SIGINT handler, which the
    sweep's Tune callback takes as the graceful stop) SIGTERM starts the graceful stop and a
    second signal of any kind raises KeyboardInterrupt; after a stop the handlers before the
    sweep are back (the process may go on: a notebook), and a command that ends then ignores
    stop signals (Ray's shutdown at exit must finish)."""
    from relif_ray.tuning.stop import GracefulStop, ignore_stop_signals, stop_signals

    graceful = []
    for number in own_stop_signals:
        signal.signal(number, signal.SIG_DFL)
    with stop_signals() as stop:
        signal.signal(signal.SIGINT, lambda number, frame: graceful.append(number))  # Tune's
        GracefulStop().setup()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == ["SIGTERM"] and graceful == [signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == ["SIGTERM", "SIGUSR1"] and len(graceful) == 1
    assert all(signal.getsignal(number) is signal.SIG_DFL for number in own_stop_signals)
    ignore_stop_signals()
    assert all(signal.getsignal(number) is signal.SIG_IGN for number in own_stop_signals)


def test_a_stop_signal_before_tunes_loop_stops_at_once_and_no_signal_changes_nothing(
    own_stop_signals,
):
    from relif_ray.tuning.stop import stop_signals

    with pytest.raises(KeyboardInterrupt), stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.received == ["SIGUSR1"]
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with stop_signals():
        pass
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_a_stopped_sweep_says_why_and_how_the_same_command_continues_it(tmp_path):
    from relif_ray.sweep.exit_status import retry_command, stopped_line
    from relif_ray.tuning.launch import stopping
    from relif_ray.tuning.stop import StopSignals

    stop = StopSignals()
    stop.received = ["SIGTERM", "SIGUSR1"]
    with pytest.raises(SweepStopped) as hard, stopping(stop, str(tmp_path / "exp")):
        raise KeyboardInterrupt
    with pytest.raises(SweepStopped) as store, stopping(StopSignals(), str(tmp_path / "exp")):
        raise OSError("When listing objects: Could not connect to server")
    program = ["relif", "sweep"]
    again = retry_command(program, ["--name", "x", "--resume-if-present"])
    assert again == "relif sweep --name x --resume-if-present"  # the same command resumes
    assert retry_command(program, ["--name", "x"]) == "relif sweep --name x --resume"
    with_key = ["--storage", "s3://KEY:SECRET@bucket/runs?scheme=http", "--name", "x"]
    assert retry_command(program, with_key) == (  # the key is taken again from the user
        "relif sweep --storage 's3://bucket/runs?scheme=http' --name x --resume"
    )
    assert not hard.value.resumable  # nothing of the sweep was saved there
    assert stopped_line(hard.value, "R", "S") == (
        "sweep stopped at once by a second signal (SIGTERM, then SIGUSR1): the state Ray Tune "
        "saved last is kept; Ray Tune had not saved it yet: start it again with: S"
    )
    store.value.resumable = True
    assert stopped_line(store.value, "R", "S") == (
        "sweep stopped because its storage failed (When listing objects: Could not connect to "
        "server): the state Ray Tune saved there last is kept; resume with: R"
    )


# --- in-process sweeps on the session's Ray -------------------------------------------------


class LowestFreeGpus(tune.Callback):
    """Records the lowest number of unreserved GPUs seen while the sweep runs."""

    def __init__(self) -> None:
        self.lowest = float("inf")

    def on_step_begin(self, iteration, trials, **info):
        self.lowest = min(self.lowest, ray.available_resources().get("GPU", 0.0))


def own_handler(number: int, frame: object) -> None:
    """A handler of this process's own, set before an in-process sweep."""


@pytest.fixture(scope="module")
def packed_sweep(
    ray_session, small_data, sweep_folder
) -> tuple[Path, LowestFreeGpus, dict[int, object]]:
    """erm and relif (r* = 0.2), seed 0, 2 epochs of 2 steps, each twice: once plain and once
    crashing at step 3 (after the epoch-1 checkpoint) and retried. Each trial asks for half a
    logical GPU and half a CPU, so all 4 fit on the session's 2 logical GPUs at once. Run in
    this process with `own_handler` for each stop signal; also returns the handlers after it."""
    from relif_ray.sweep.plan import Resources, param_space
    from relif_ray.tuning.launch import run_sweep
    from relif_ray.tuning.stop import STOP_SIGNALS

    before = {number: signal.signal(number, own_handler) for number in STOP_SIGNALS}

    base = replace(base_config(small_data), device="auto")  # as the CLI sets for GPU trials
    variants = grid_variants(["erm", "relif"], [0.2], [1e-3])
    space = param_space(base, variants, [0], 0.2)
    space.trials = [
        replace(t, fault_injection_step=step) for t in space.trials for step in (None, 3)
    ]
    callback = LowestFreeGpus()
    request = SweepRequest(
        name="grid",
        storage=str(sweep_folder / "grid"),
        resources=Resources(cpus_per_trial=0.5, gpus_per_trial=0.5, num_gpus=2),
        space=space,
        checkpoint_interval_s=0.0,
    )
    experiment = run_sweep(request, callbacks=[callback], verbose=0)
    after = {number: signal.signal(number, before[number]) for number in STOP_SIGNALS}
    return Path(experiment), callback, after


@pytest.fixture(scope="module")
def grid_sweep(packed_sweep) -> Path:
    return packed_sweep[0]


@pytest.mark.slow
def test_an_in_process_sweep_puts_back_every_stop_signals_handler(packed_sweep):
    """A notebook that ran a sweep is interrupted as before it (Ray's `ray.init` sets a SIGTERM
    handler of its own, Tune one for SIGINT and SIGUSR1, the sweep its own for all three)."""
    handlers = packed_sweep[2]
    assert list(handlers.values()) == [own_handler] * 3, handlers


@pytest.mark.slow
def test_grid_sweep_terminates_every_trial_with_readable_outputs(grid_sweep):
    states = trial_states(grid_sweep)
    assert len(states) == 4 and {status for status, _ in states.values()} == {"TERMINATED"}
    loaded = analysis.load(grid_sweep)
    assert loaded.problems.empty and len(loaded.trials) == 4
    assert sorted(loaded.trials["label"]) == ["erm", "erm", "relif", "relif"]
    assert set(loaded.trials.loc[loaded.trials["relif"], "r_star"]) == {0.2}
    assert set(loaded.scores["split"]) == {"val", "test"}
    assert len(loaded.scores) == 4 * 2 * 3 * VAL_SIZE
    for trial, outputs in loaded.outputs.items():
        info = read_trial_info(outputs)
        assert info["steps"] == 2 * STEPS_PER_EPOCH
        trace = loaded.traces[loaded.traces["trial"] == trial]
        assert sorted(trace["step"]) == list(range(2 * STEPS_PER_EPOCH))
        for split in ("val", "test"):
            ids, matrix = loaded.representations(trial, split)
            assert sorted(ids.tolist()) == list(range(VAL_SIZE)) and matrix.shape[1] == 512


@pytest.mark.slow
def test_half_gpu_trials_pack_four_to_two_logical_gpus_and_run_on_cpu(packed_sweep):
    experiment, callback, _ = packed_sweep
    assert callback.lowest == pytest.approx(0.0)  # 4 x 0.5 GPU reserved at the same time
    loaded = analysis.load(experiment)
    assert {read_trial_info(p)["device"] for p in loaded.outputs.values()} == {"cpu"}


@pytest.mark.slow
def test_live_val_bias_is_the_audit_of_the_trials_val_scores(grid_sweep):
    from relif_ray.live_audit import LiveValidationAudit

    loaded = analysis.load(grid_sweep)
    for trial, outputs in loaded.outputs.items():
        scores = loaded.scores[
            (loaded.scores["trial"] == trial) & (loaded.scores["split"] == "val")
        ]
        relif = read_trial_info(outputs)["config"]["relif"]
        constants = relif["squash_constants"] if relif["enabled"] else None
        if relif["enabled"]:  # ReLiF trials squash with their same-seed ERM constants
            assert set(constants) == {"depth", "normal"}
        expected = LiveValidationAudit({"seg"}, 0.2, constants)(scores)
        result = last_result(outputs)
        assert result["val_bias"] == pytest.approx(expected.bias, abs=1e-12)
        assert result["worst"] == loaded.trials.set_index("trial").loc[trial, "val_worst"]
        parts = [result[f"time_{part}_s"] for part in ("train", "evaluate", "audit")]
        assert all(seconds > 0 for seconds in parts)  # where the epoch's time went
        assert sum(parts) <= result["time_this_iter_s"]


@pytest.mark.slow
def test_a_trial_crashing_once_recovers_with_the_uninterrupted_numbers(grid_sweep):
    loaded = analysis.load(grid_sweep)
    states = trial_states(grid_sweep)
    runs = {}
    for trial, outputs in loaded.outputs.items():
        faulted = trial_params(outputs).get("fault_injection_step") is not None
        info = read_trial_info(outputs)
        assert info["restored_from_checkpoint"] == faulted
        assert states[trial][1] == (1 if faulted else 0)  # one failure, then a retry
        runs[(info["label"], faulted)] = (info, loaded.traces[loaded.traces["trial"] == trial])
    for label in ("erm", "relif"):
        (plain, plain_trace), (retried, retried_trace) = runs[(label, False)], runs[(label, True)]
        assert retried["metrics"] == plain["metrics"]
        columns = [c for c in plain_trace.columns if c != "trial"]
        pd.testing.assert_frame_equal(
            retried_trace[columns].reset_index(drop=True),
            plain_trace[columns].reset_index(drop=True),
        )


def test_the_tests_local_ray_listens_on_loopback_only(ray_session):
    """The session's local Ray (conftest.py) has its node, its GCS and every listening socket
    of its processes on 127.0.0.1, not on the network address Ray picks on Linux."""
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {LOCALHOST}
    assert ray.get_runtime_context().gcs_address.startswith(f"{LOCALHOST}:")
    assert listening_addresses() == [LOCALHOST]


@pytest.mark.slow
def test_optuna_search_writes_each_studys_pareto_set(ray_session, small_data, tmp_path):
    from relif_ray.experiment import storage
    from relif_ray.sweep.plan import OptunaPlan, TuneOptions
    from relif_ray.sweep.selection import hypervolume
    from relif_ray.tuning.launch import run_sweep

    plan = OptunaPlan(["relif"], [0], 2, (0.1, 0.4), (1e-4, 1e-2))
    request = SweepRequest(
        name="optuna",
        storage=str(tmp_path),
        space=plan.space(base_config(small_data, epochs=1), 0.2),
        search=plan,
        options=TuneOptions(max_concurrent_trials=1),  # as tests.conftest.ONE_TRIAL_AT_A_TIME
        checkpoint_interval_s=0.0,
    )
    experiment = run_sweep(request, verbose=0)
    states = trial_states(Path(experiment))
    # 2 study trials + the same-seed ERM reference the sweep adds for ReLiF's squash constants
    assert len(states) == 3 and {status for status, _ in states.values()} == {"TERMINATED"}
    trials = analysis.load(experiment).trials
    assert sorted(trials["label"]) == ["erm", "relif", "relif"]
    front = storage.read_csv(Path(experiment) / "pareto.csv")  # floats exactly as written
    assert set(front["study"]) == {"relif/seed0"} and 1 <= len(front) <= 2
    assert set(front["trial_id"]) <= set(trials["trial"])
    by_trial = trials.set_index("trial")
    for row in front.itertuples():
        assert row.val_worst == by_trial.loc[row.trial_id, "val_worst"]
        assert row.r_star == by_trial.loc[row.trial_id, "r_star"]
        assert 0.1 <= row.r_star <= 0.4 and 1e-4 <= row.eta <= 1e-2
    assert front["val_hypervolume"].tolist() == [
        hypervolume(front.val_bias, front.val_worst)
    ] * len(front)
    for row in front.itertuples():  # no front member is dominated by another one
        others = front.drop(index=row.Index)
        no_worse = (others.val_bias <= row.val_bias) & (others.val_worst >= row.val_worst)
        better = (others.val_bias < row.val_bias) | (others.val_worst > row.val_worst)
        assert not (no_worse & better).any()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--num-gpus", "4", "--gpus-per-trial", "1"], "--num-gpus 4: local Ray has 2 GPU(s)"),
        (["--cpus-per-trial", "3"], "--cpus-per-trial 3: the largest node of local Ray has 2"),
    ],
)
def test_impossible_requests_fail_before_any_trial(
    args, fragment, ray_session, nyuv2_dir, tmp_path, capsys
):
    status = main(
        datasets=("nyuv2",), argv=["--data-dir", str(nyuv2_dir), "--storage", str(tmp_path), *args]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and fragment in err[0], err
    assert not any(tmp_path.iterdir())  # no experiment was started


@pytest.mark.slow
def test_a_demo_no_trial_could_run_keeps_the_earlier_demo_and_writes_no_data(
    ray_session, tmp_path, capsys
):
    """The resources are checked before the demo replaces its earlier experiment or writes its
    data: asking for more GPUs than Ray has leaves the storage as it was."""
    earlier = tmp_path / "nyuv2-demo" / "marker.txt"
    earlier.parent.mkdir()
    earlier.write_text("the earlier demo")
    argv = ["--demo", "--storage", str(tmp_path), "--num-gpus", "4", "--gpus-per-trial", "1"]
    status = main(datasets=("nyuv2",), argv=argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--num-gpus 4: local Ray has 2 GPU(s)" in err[0]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "nyuv2-demo", "nyuv2-demo/marker.txt"
    ]  # fmt: skip


# --- the driver as a subprocess -------------------------------------------------------------


EPOCHS_KILLED = 3


def sweep_command(data: Path, storage: Path, address: str, *extra: str) -> list[str]:
    """An erm and a relif trial of 3 one-step epochs, one after the other (2 CPUs each; relif
    waits for its ERM reference anyway), on the Ray cluster at `address` (the test session's),
    as on a cluster where drivers come and go."""
    flags = {
        "--data-dir": data, "--methods": "erm,relif", "--seeds": 1, "--epochs": EPOCHS_KILLED,
        "--backbone": "resnet18", "--batch-size": 12, "--lr": 1e-3, "--storage": storage,
        "--name": "killed", "--address": address, "--cpus-per-trial": 2,
        "--checkpoint-interval": 0,  # a checkpoint every epoch: the kill lands between them
        "--keep-checkpoints": 1,
    }  # fmt: skip
    pairs = [str(item) for flag, value in flags.items() for item in (flag, value)]
    return [sys.executable, "sweeps/nyuv2.py", *pairs, *extra]


def driver_env() -> dict[str, str]:
    """Tune saves its experiment state on every loop step, so the test can wait for it."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TUNE_GLOBAL_CHECKPOINT_S": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def trial_records(experiment: Path) -> list[tuple[dict, dict]]:
    """(trial state, runtime metadata) of every trial in Tune's latest experiment state, read
    without unpickling. [] while none is readable."""
    states = sorted(experiment.glob("experiment_state-*.json"))
    try:
        records = json.loads(states[-1].read_text())["trial_data"]
    except (IndexError, json.JSONDecodeError, KeyError):
        return []
    return [(json.loads(state), json.loads(meta)) for state, meta in records]


def statuses(experiment: Path) -> dict[str, str]:
    """trial id -> status in Tune's latest experiment state ({} while none is readable)."""
    return {state["trial_id"]: state["status"] for state, _ in trial_records(experiment)}


def mid_sweep(experiment: Path) -> tuple[set[str], set[str]]:
    """(finished trials, unfinished trials whose first checkpoint the experiment state already
    records), read from the state without unpickling: the checkpoint manager is a pickled blob
    in hex, and a checkpoint's folder name appears in it as text."""
    finished, checkpointed = set(), set()
    marker = b"checkpoint_000000".hex()
    for state, meta in trial_records(experiment):
        if state["status"] == "TERMINATED":
            finished.add(state["trial_id"])
        elif marker in meta["checkpoint_manager"]["value"]:
            checkpointed.add(state["trial_id"])
    return finished, checkpointed


@pytest.mark.slow
def test_killed_driver_resumes_across_the_reference_phase(ray_session, small_data, tmp_path):
    """The driver is killed while the ReLiF trial runs after its ERM reference, and resumed.
    The kill is also made to land in Tune's checkpoint race (ray-project/ray#27790): the
    checkpoint that the experiment state names for the interrupted trial is gone, a newer one
    beside it (`lose_the_named_checkpoint`). The trial restores from that one
    (`surviving_checkpoint`) and ends with the numbers of an uninterrupted run."""
    experiment = tmp_path / "killed"
    address = ray_session.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        sweep_command(small_data, tmp_path, address),
        cwd=REPO,
        env=driver_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + HANG_GUARD_S
    finished, interrupted = set(), set()
    while not (finished and interrupted) and time.monotonic() < deadline:
        if driver.poll() is not None:
            break
        time.sleep(0.2)
        finished, interrupted = mid_sweep(experiment)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    # The kill lands after the ERM phase, while the ReLiF trial that waited for it runs.
    assert finished and interrupted, "the kill must land while a second trial is running"
    results_before = {
        trial: next(experiment.glob(f"*_{trial}/result.json")).read_bytes() for trial in finished
    }
    (trial,) = interrupted
    trial_dir = next(experiment.glob(f"*_{trial}"))
    lose_the_named_checkpoint(trial_dir, named_checkpoint(experiment, trial))

    resumed = subprocess.run(
        sweep_command(small_data, tmp_path, address, "--resume"),
        cwd=REPO,
        env=driver_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Error handling checkpoint" not in resumed.stderr  # Tune's driver, in this output
    # the empty stand-in for the named folder went with Tune's next deletion (num_to_keep 1)
    assert len(list(trial_dir.glob("checkpoint_*"))) == 1
    assert list(statuses(experiment).values()) == ["TERMINATED"] * 2
    for trial, before in results_before.items():  # finished trials are not run again
        assert next(experiment.glob(f"*_{trial}/result.json")).read_bytes() == before
    loaded = analysis.load(experiment)
    assert sorted(loaded.trials["label"]) == ["erm", "relif"] and loaded.problems.empty
    by_label = loaded.trials.set_index("label")
    assert by_label.loc["erm", "trial"] in finished
    assert by_label.loc["relif", "trial"] in interrupted  # resumed across the phase boundary
    for trial, outputs in loaded.outputs.items():
        steps = loaded.traces[loaded.traces["trial"] == trial]["step"].tolist()
        assert steps == list(range(EPOCHS_KILLED))
        assert read_trial_info(outputs)["restored_from_checkpoint"] == (trial in interrupted)
    _assert_matches_an_uninterrupted_run(loaded, interrupted.pop())


def named_checkpoint(experiment: Path, trial: str) -> int:
    """The index of the newest checkpoint folder that Tune's latest experiment state names for
    `trial` (its pickled checkpoint manager holds the folder names as text)."""
    for state, meta in trial_records(experiment):
        if state["trial_id"] == trial:
            blob = bytes.fromhex(meta["checkpoint_manager"]["value"])
            return max(int(index) for index in re.findall(rb"checkpoint_(\d{6})", blob))
    raise AssertionError(f"trial {trial} is not in the experiment state")


def lose_the_named_checkpoint(trial_dir: Path, named: int) -> None:
    """Leave `trial_dir` as Tune's race does (ray-project/ray#27790): the named checkpoint gone
    and a complete newer one beside it. Where the trial had written that newer one, the named
    one is deleted; otherwise (or where the kill cut the newer one off) the named one becomes
    the newer one, holding the same state."""
    folder, newer = (trial_dir / f"checkpoint_{index:06d}" for index in (named, named + 1))
    if readable_state(newer / STATE_FILE) is not None:
        shutil.rmtree(folder, ignore_errors=True)  # the race itself may have deleted it
    else:
        shutil.rmtree(newer, ignore_errors=True)
        folder.rename(newer)


def _assert_matches_an_uninterrupted_run(loaded, trial: str) -> None:
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    row = loaded.trials.set_index("trial").loc[trial]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the trial's: float reductions depend on the thread count
    try:
        run = TrainingRun(ExperimentConfig.from_dict(row["config"]))
        while not run.finished:
            run.train_epoch()
        metrics = run.evaluate("val").metrics
    finally:
        torch.set_num_threads(threads)
    for name, value in metrics.items():
        assert row[f"val_{name}"] == value, name
