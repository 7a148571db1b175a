"""analysis.load, the shared audit interface (squash), experiment audits and delta_ref.

Experiments are GENERATED trial output folders (`relif_ray.testing.synthetic_experiment`,
written with `relif_ray.experiment.outputs.write_trial_outputs`). The helpers at the top recompute
everything directly from those files with numpy and `relif_ray.audit` only; the tests compare
`analysis` to them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from relif_ray import analysis
from relif_ray.analysis import delta as delta_options
from relif_ray.analysis.audit_scores import audit_scores, squash_quantiles, squashed_tasks
from relif_ray.analysis.experiment_audit import AuditSettings, ExperimentAudit
from relif_ray.audit import audit_gaps, sample_pairs, validate_scores
from relif_ray.audit_thresholds import conformal_delta, induced_thresholds, pair_distances
from relif_ray.errors import UserError
from relif_ray.testing.synthetic_experiment import rewrite_output, write_synthetic_experiment

SETTINGS = AuditSettings(pool_size=16, pairs=256, pair_seed=42, eval_seed=0)
"""Pools smaller than the 30 examples per task, so the pool draw is exercised."""


@dataclass
class StoredTrial:
    info: dict
    scores: pd.DataFrame
    folder: Path

    @property
    def seed(self) -> int:
        return self.info["seed"]

    @property
    def is_erm(self) -> bool:
        return self.info["method"] == "erm" and not self.info["relif"]

    def representations(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        table = pq.read_table(self.folder / "representations.parquet").to_pandas()
        table = table[table["split"] == split]
        return table["example_id"].to_numpy(), np.stack(table["embedding"].to_numpy())

    def trace(self) -> pd.DataFrame:
        return pd.read_parquet(self.folder / "trace.parquet")


def stored_trials(*roots: Path) -> dict[str, StoredTrial]:
    """trial id -> its stored outputs, for every finished trial under the roots."""
    trials = {}
    for root in roots:
        for trial_file in sorted(Path(root).glob("*/checkpoint_*/outputs/trial.json")):
            info = json.loads(trial_file.read_text())
            scores = pd.read_parquet(trial_file.parent / "scores.parquet")
            trials[info["trial_id"]] = StoredTrial(info, scores, trial_file.parent)
    return trials


def squashed_scores(trials: dict[str, StoredTrial], trial: str, split: str) -> pd.DataFrame:
    """The trial's scores of `split` with NYUv2 depth/normal squashed by the q10/q90 of the
    same-seed ERM trial's valid validation scores (paper appendix A)."""
    stored = trials[trial]
    scores = stored.scores[stored.scores["split"] == split].copy()
    scores["score"] = scores["score"].astype(np.float64)
    if stored.info["config"]["data"]["dataset"] != "nyuv2":
        return scores
    (erm,) = [t for t in trials.values() if t.is_erm and t.seed == stored.seed]
    reference = erm.scores[(erm.scores["split"] == "val") & erm.scores["valid"]]
    for task in ("depth", "normal"):
        raw = reference.loc[reference["task"] == task, "score"].to_numpy(np.float64)
        q10, q90 = np.quantile(raw, [0.1, 0.9])
        rows = scores["task"] == task
        values = scores.loc[rows, "score"].to_numpy()
        scores.loc[rows, "score"] = np.clip((values - q10) / (q90 - q10 + 1e-6), 0.0, 1.0)
    return scores


def reference_distances(
    trials: dict[str, StoredTrial], trial: str, settings: AuditSettings
) -> np.ndarray:
    """(1 - cos) / 2 of the trial's validation representations over the audit's sampled
    validation pairs, all task pairs concatenated (sorted task-pair order)."""
    frame = validate_scores(squashed_scores(trials, trial, "val"))
    sampled = sample_pairs(frame, settings=settings)
    ids, matrix = trials[trial].representations("val")
    lookup = {example: row for row, example in enumerate(ids)}
    matrix = matrix.astype(np.float64)
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    rows = np.array([lookup[e] for e in frame["example_id"]])
    parts = []
    for key in sorted(sampled):
        x, y = sampled[key]
        cosine = np.sum(unit[rows[x]] * unit[rows[y]], axis=1)
        parts.append((1 - np.clip(cosine, -1, 1)) / 2)
    return np.concatenate(parts)


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("experiment") / "exp"
    return write_synthetic_experiment(
        root,
        labels=("erm", "pcgrad", "relif"),
        seeds=3,
        n_examples=30,
        splits=("val", "test"),
        errored=1,
        incomplete=1,
    )


@pytest.fixture(scope="module")
def loaded(experiment_dir) -> analysis.Experiment:
    return analysis.load(experiment_dir)


@pytest.fixture(scope="module")
def stored(experiment_dir) -> dict[str, StoredTrial]:
    return stored_trials(experiment_dir)


@pytest.fixture(scope="module")
def experiment_audit(loaded) -> ExperimentAudit:
    return ExperimentAudit(loaded, SETTINGS)


# --- load -------------------------------------------------------------------------------


def test_load_reads_every_finished_trial_and_lists_the_others(loaded, stored):
    trials = loaded.trials.set_index("trial")
    assert set(trials.index) == set(stored)
    for trial, record in stored.items():
        assert trials.loc[trial, "label"] == record.info["label"]
        assert trials.loc[trial, "seed"] == record.seed
        assert trials.loc[trial, "val_worst"] == record.info["metrics"]["val"]["worst"]
        assert trials.loc[trial, "test_macro"] == record.info["metrics"]["test"]["macro"]
    assert sorted(loaded.problems["status"]) == ["errored", "incomplete"]
    errored = loaded.problems[loaded.problems["status"] == "errored"]
    assert errored["error"].iloc[0] == "RuntimeError: synthetic 0"


def test_loaded_scores_and_traces_equal_the_files(loaded, stored):
    for trial, record in stored.items():
        mine = loaded.scores[loaded.scores["trial"] == trial].drop(columns="trial")
        mine = mine.astype({"split": str, "task": str}).reset_index(drop=True)
        expected = record.scores.astype({"split": str, "task": str}).reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, expected, check_dtype=False)
        trace = loaded.traces[loaded.traces["trial"] == trial].drop(columns="trial")
        trace = trace.dropna(axis=1, how="all").reset_index(drop=True)
        pd.testing.assert_frame_equal(trace, record.trace(), check_dtype=False)
    ids, matrix = loaded.representations(trial, "test")
    expected_ids, expected = record.representations("test")
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(matrix, expected)


def test_variants_split_a_label_run_at_several_controller_settings(tmp_path):
    root = write_synthetic_experiment(
        tmp_path / "grid",
        labels=("erm", "relif"),
        seeds=1,
        controller_grid=((0.16, 1e-3), (0.24, 1e-2)),
    )
    variants = sorted(analysis.load(root).trials["variant"])
    assert variants == ["erm", "relif (r*=0.16, eta=0.001)", "relif (r*=0.24, eta=0.01)"]


def test_several_directories_are_combined(experiment_dir, tmp_path):
    other = write_synthetic_experiment(tmp_path / "other", labels=("erm",), seeds=1, seed=5)
    combined = analysis.load(experiment_dir, other)
    assert len(combined.trials) == 9 + 1
    assert combined.paths == [experiment_dir, other]


def test_loading_the_same_directory_twice_is_an_error(experiment_dir):
    with pytest.raises(UserError, match="appears twice"):
        analysis.load(experiment_dir, experiment_dir)


@pytest.mark.parametrize("make", ["missing", "empty", "no_args"])
def test_bad_paths_and_empty_experiments_are_one_line_errors(tmp_path, make):
    if make == "no_args":
        args, fragment = (), "no experiment directory given"
    elif make == "missing":
        args, fragment = (tmp_path / "nope",), "experiment directory not found"
    else:
        (tmp_path / "empty").mkdir()
        args, fragment = (tmp_path / "empty",), "no trials found"
    with pytest.raises(UserError, match=fragment) as error:
        analysis.load(*args)
    assert "\n" not in str(error.value)


# --- the shared audit interface ----------------------------------------------------------


def test_squashed_tasks_are_the_tasks_without_probability_scores():
    from relif_ray.tasks.nyuv2 import nyuv2_tasks

    raw = {task.name for task in nyuv2_tasks() if not task.score_is_probability}
    assert squashed_tasks("nyuv2") == raw == {"depth", "normal"}
    assert "depth" in squashed_tasks("nyuv2") and "seg" not in squashed_tasks("nyuv2")
    assert "mortality" not in squashed_tasks("mimic3")


def test_squash_uses_the_same_seed_erm_validation_quantiles(loaded, stored):
    scores = audit_scores(loaded)
    for trial in stored:
        for split in ("val", "test"):
            mine = scores[(scores["trial"] == trial) & (scores["split"] == split)]
            expected = squashed_scores(stored, trial, split)
            np.testing.assert_allclose(
                mine["score"].to_numpy(), expected["score"].to_numpy(), rtol=0, atol=1e-12
            )
    quantiles = squash_quantiles(loaded).set_index(["trial", "task"])
    for trial, record in stored.items():
        (erm,) = [t for t, r in stored.items() if r.is_erm and r.seed == record.seed]
        assert quantiles.loc[(trial, "depth"), "reference"] == erm
    seg = scores[scores["task"] == "seg"]
    np.testing.assert_array_equal(seg["score"].to_numpy(), seg["raw_score"].to_numpy())


def test_squash_differs_per_seed(loaded):
    quantiles = squash_quantiles(loaded)
    per_seed = quantiles.merge(loaded.trials[["trial", "seed"]], on="trial")
    depth = per_seed[per_seed["task"] == "depth"].groupby("seed")["q10"].nunique()
    assert (depth == 1).all()
    assert per_seed[per_seed["task"] == "depth"]["q10"].nunique() == 3


def test_missing_same_seed_erm_names_the_seed(tmp_path):
    root = write_synthetic_experiment(tmp_path / "e", labels=("erm",), seeds=[0])
    write_synthetic_experiment(tmp_path / "r", labels=("relif",), seeds=[0, 4])
    for trial_dir in (tmp_path / "r").iterdir():
        trial_dir.rename(root / (trial_dir.name + "_r"))
    with pytest.raises(UserError, match="no ERM trial with seed 4"):
        audit_scores(analysis.load(root))


def test_clinical_scores_pass_unchanged_and_need_no_erm(tmp_path):
    root = write_synthetic_experiment(tmp_path / "m", labels=("relif",), seeds=1, dataset="mimic3")
    loaded = analysis.load(root)
    scores = audit_scores(loaded)
    np.testing.assert_array_equal(scores["score"], scores["raw_score"].astype(np.float64))
    assert squash_quantiles(loaded).empty


# --- experiment audits ------------------------------------------------------------------


def test_gaps_equal_the_library_audit_of_each_trial(experiment_audit, stored):
    for split in ("val", "test"):
        gaps = experiment_audit.gaps(split)
        for trial in stored:
            expected = audit_gaps(squashed_scores(stored, trial, split), settings=SETTINGS)
            assert gaps[trial].gaps.keys() == expected.gaps.keys()
            for key, values in expected.gaps.items():
                np.testing.assert_array_equal(gaps[trial].gaps[key], values)


def test_fixed_bias_and_vr_equal_the_definition(experiment_audit, stored):
    fixed = experiment_audit.fixed([0.1, 0.3], "test").set_index(["trial", "delta"])
    for trial in stored:
        expected = audit_gaps(squashed_scores(stored, trial, "test"), settings=SETTINGS)
        for delta in (0.1, 0.3):
            bias = np.mean([np.maximum(g - delta, 0).mean() for g in expected.gaps.values()])
            vr = np.mean([(g > delta).mean() for g in expected.gaps.values()])
            assert fixed.loc[(trial, delta), "bias"] == pytest.approx(bias, abs=1e-12)
            assert fixed.loc[(trial, delta), "vr"] == pytest.approx(vr, abs=1e-12)


def test_induced_thresholds_equal_the_library(experiment_audit, stored):
    induced = experiment_audit.induced().set_index(["trial", "pair"])["induced"]
    for trial, record in stored.items():
        ids, matrix = record.representations("val")
        expected = induced_thresholds(
            squashed_scores(stored, trial, "val"), ids, matrix, settings=SETTINGS
        )
        for key, value in expected.items():
            assert induced[trial, key] == pytest.approx(value, abs=1e-12)
        assert induced[trial, "mean"] == pytest.approx(np.mean(list(expected.values())))
        distances = pair_distances(
            squashed_scores(stored, trial, "val"), ids, matrix, settings=SETTINGS
        )
        for key, values in experiment_audit.distances(trial).items():
            np.testing.assert_allclose(values, distances[key], rtol=0, atol=1e-12)


def test_scores_outside_unit_interval_name_the_trial(tmp_path):
    root = write_synthetic_experiment(tmp_path / "m", labels=("erm",), seeds=1, dataset="eicu")
    scores = root / "ReLiFTrainable_00000/checkpoint_000000/outputs/scores.parquet"
    frame = pd.read_parquet(scores)
    frame.loc[3, "score"] = 1.5
    rewrite_output(scores, frame)
    with pytest.raises(UserError, match=r"trial m_00000 \(val\).*\[0, 1\]"):
        ExperimentAudit(analysis.load(root)).gaps("val")


# --- delta_ref --------------------------------------------------------------------------


def test_delta_from_quantile_of_pooled_erm_distances(experiment_audit, stored):
    erm = [t for t, r in stored.items() if r.is_erm]
    pooled = np.concatenate([reference_distances(stored, t, SETTINGS) for t in erm])
    chosen = delta_options.resolve(delta_options.quantile("erm:p75"), experiment_audit)
    assert chosen.value == pytest.approx(np.quantile(pooled, 0.75), abs=1e-12)
    assert chosen.n == pooled.size == 3 * 3 * 256
    assert "erm:p75" in chosen.source and "seeds 0, 1, 2" in chosen.source
    conformal = delta_options.resolve(delta_options.conformal("erm:0.1"), experiment_audit)
    assert conformal.value == pytest.approx(conformal_delta(pooled, 0.1), abs=1e-12)


def test_delta_from_quantile_of_pooled_erm_gaps(experiment_audit, stored):
    erm = [t for t, r in stored.items() if r.is_erm]
    pooled = np.concatenate(
        [
            values
            for t in erm
            for values in audit_gaps(
                squashed_scores(stored, t, "val"), settings=SETTINGS
            ).gaps.values()
        ]
    )
    chosen = delta_options.resolve(delta_options.quantile("erm:p50"), experiment_audit, "gaps")
    assert chosen.value == pytest.approx(np.quantile(pooled, 0.5), abs=1e-12)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (delta_options.fixed("1.5"), "must be in [0, 1]"),
        (delta_options.fixed("x"), "must be a number"),
        (delta_options.quantile("erm:75"), "look like p75"),
        (delta_options.quantile("nosuch:p75"), "no finished trials with label 'nosuch'"),
        (delta_options.conformal("erm:2"), "alpha must be in (0, 1)"),
        (delta_options.conformal("erm"), "expected LABEL:ALPHA"),
    ],
)
def test_bad_delta_options_are_one_line_errors(experiment_audit, spec, fragment):
    with pytest.raises(UserError) as error:
        delta_options.resolve(spec, experiment_audit)
    assert fragment in str(error.value)


def test_default_deltas_per_data_set():
    nyuv2 = delta_options.default_specs(["nyuv2"], ["erm", "relif"])
    assert [s.text for s in nyuv2] == ["erm:p75", "erm:p50"]
    assert [s.text for s in delta_options.default_specs(["mimic3"], ["relif"])] == ["0.275"]
    assert [s.text for s in delta_options.default_specs(["eicu"], ["relif"])] == ["0.06"]
    with pytest.raises(UserError, match="no ERM trials"):
        delta_options.default_specs(["nyuv2"], ["relif"])
    with pytest.raises(UserError, match="several data sets"):
        delta_options.default_specs(["nyuv2", "eicu"], ["erm"])


def test_python_delta_values():
    assert delta_options.as_spec(0.3) == delta_options.fixed("0.3")
    assert delta_options.as_spec("erm:p75").kind == "quantile"
    assert delta_options.as_spec("erm:0.1").kind == "conformal"
