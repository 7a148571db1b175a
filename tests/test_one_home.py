"""Decisions that have one home, checked where they are used.

- What identifies a trial's setting (`relif_ray.sweep.labels.identifying_settings`): trial
  names, the values a trial reports to Tune, analysis's variants and the controller table agree,
  so a controller-sensitivity report shows each static lambda0 as its own row, while the
  ablation table's static-lambda row is the paper's aggregate over the lambda0 grid.
- The same-seed ERM reference (`relif_ray.reference`): the plain-ERM predicate and the squash
  quantiles of the sweep, the live audit and analysis are the same function.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.analysis.audit_scores import is_erm, squash_quantiles
from relif_ray.config import ExperimentConfig, ReLiFConfig
from relif_ray.reference import is_plain_erm, is_reference, waits_for_reference
from relif_ray.squash import squash_bounds
from relif_ray.sweep.labels import (
    identifying_settings,
    setting_values,
    trial_name,
    variant,
    variant_name,
)
from relif_ray.sweep.trial_config import TrialSpec, experiment_config, tune_constants, tune_trial
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.conftest import ONE_TRIAL_AT_A_TIME

STATIC_LAMBDAS = (0.03, 0.3, 1.0)


@pytest.fixture(scope="module")
def controller_experiment(tmp_path_factory) -> Path:
    """A controller-sensitivity experiment: ERM, ReLiF at two (r*, eta) and a static-lambda
    grid of three lambda0, two seeds each."""
    return write_synthetic_experiment(
        tmp_path_factory.mktemp("controller") / "exp",
        labels=("erm", "relif", "relif-static", "relif-nolip"),
        seeds=2,
        n_examples=24,
        controller_grid=((0.16, 1e-3), (0.2, 1e-3)),
        static_lambdas=STATIC_LAMBDAS,
    )


@pytest.fixture(scope="module")
def report_dir(controller_experiment, tmp_path_factory) -> Path:
    from relif_ray.analysis.report import ReportOptions

    out = tmp_path_factory.mktemp("controller-report")
    settings = analysis.AuditSettings(pool_size=16, pairs=128)
    options = ReportOptions(settings=settings, figures=False)
    analysis.write_report(analysis.load(controller_experiment), out, options)
    return out


@pytest.mark.parametrize(
    ("label", "extra", "identifying", "name", "row"),
    [
        ("erm", {}, {}, "erm_seed3", "erm"),
        (
            "pcgrad+relif-noalign",
            {},
            {"r_star": 0.2, "eta": 0.5},
            "pcgrad_relif-noalign_r0.2_eta0.5_seed3",
            "pcgrad+relif-noalign (r*=0.2, eta=0.5)",
        ),
        (
            "relif-static",
            {"relif.lambda0": 0.3},
            {"lambda0": 0.3},
            "relif-static_lam0.3_seed3",
            "relif-static (lambda0=0.3)",
        ),
        ("relif-nolip", {"relif.lambda0": 0.3}, {}, "relif-nolip_seed3", "relif-nolip"),
    ],
)
def test_one_rule_identifies_a_trials_setting_for_names_tune_and_rows(
    label, extra, identifying, name, row, tmp_path
):
    base = ExperimentConfig.from_dict({"data": {"dataset": "nyuv2", "root": str(tmp_path)}})
    tune_config = {
        **tune_constants(base, 0.2),
        **tune_trial(TrialSpec.of(variant(label, 0.2, 0.5, extra), 3)),
    }
    relif = experiment_config(tune_config).relif
    assert identifying_settings(relif) == identifying
    reported = setting_values(relif)
    assert set(reported) == {"r_star", "eta", "lambda0"}
    assert {k: v for k, v in reported.items() if not math.isnan(v)} == identifying
    assert trial_name(tune_config) == name
    assert variant_name(label, reported) == row


def test_a_static_lambda_grid_is_one_variant_per_lambda0_in_analysis(controller_experiment):
    trials = analysis.load(controller_experiment).trials
    static = trials[trials["label"] == "relif-static"]
    assert sorted(set(static["variant"])) == [
        f"relif-static (lambda0={value:g})" for value in STATIC_LAMBDAS
    ]
    assert static.groupby("variant").size().tolist() == [2, 2, 2]
    for row in trials.itertuples():  # analysis's columns are the trial's reported values
        expected = setting_values(ReLiFConfig(**row.config["relif"]))
        got = {field: getattr(row, field) for field in expected}
        np.testing.assert_array_equal(list(got.values()), list(expected.values()))
    assert set(trials.loc[trials["label"] == "relif-nolip", "variant"]) == {"relif-nolip"}


def test_the_controller_table_shows_each_static_lambda_as_its_own_row(report_dir):
    table = pd.read_csv(report_dir / "tables" / "controller.csv", dtype={"lambda0": str})
    static = table[table["variant"].str.startswith("relif-static")]
    assert static["lambda0"].tolist() == [f"{value:g}" for value in STATIC_LAMBDAS]
    assert (static["n_seeds"] == 2).all()
    assert set(static["r_star"].astype(str)) == {"-"} and set(static["eta"].astype(str)) == {"-"}
    adaptive = table[table["variant"].str.startswith("relif (")]
    assert adaptive["r_star"].astype(float).tolist() == [0.16, 0.2]
    assert set(adaptive["lambda0"]) == {"-"}
    report = (report_dir / "report.md").read_text()
    assert "per fixed λ0 (static λ, each λ0 its own row)" in report
    lam1 = static[static["lambda0"] == "1"]
    assert lam1["at_upper_mean"].iloc[0] == 1.0  # lambda fixed at lambda_max = 1
    assert "- ReLiF-static (lambda0=0.03): seeds 0, 1" in report


def test_the_ablation_row_of_static_lambda_aggregates_its_lambda0_grid(report_dir):
    table = pd.read_csv(report_dir / "tables" / "ablation.csv")
    static = table[table["variant"] == "relif-static"]
    assert len(static) == 1 and static["n_seeds"].iloc[0] == 2 * len(STATIC_LAMBDAS)
    per_trial = pd.read_csv(report_dir / "per_trial.csv")
    grid = per_trial[per_trial["label"] == "relif-static"]
    assert static["worst_mean"].iloc[0] == pytest.approx(grid["worst"].mean())
    assert static["worst_std"].iloc[0] == pytest.approx(grid["worst"].std(ddof=1))
    assert not table["variant"].str.contains("lambda0").any()
    note = "ReLiF-static: mean ± std over all 6 trials of its λ0 grid (0.03, 0.3, 1) and seeds"
    assert note in (report_dir / "report.md").read_text()


def test_the_plain_erm_predicate_is_the_reference_of_sweeps_and_analysis(
    controller_experiment, tmp_path
):
    trials = analysis.load(controller_experiment).trials
    expected = [is_plain_erm(m, r) for m, r in zip(trials["method"], trials["relif"], strict=True)]
    assert is_erm(trials).tolist() == expected and sum(expected) == 2
    base = ExperimentConfig.from_dict({"data": {"dataset": "nyuv2", "root": str(tmp_path)}})
    for label, reference, waits in [("erm", True, False), ("relif", False, True)]:
        tune_config = {**tune_constants(base, 0.2), **tune_trial(TrialSpec.of(variant(label), 0))}
        config = experiment_config(tune_config)
        assert (is_reference(config), waits_for_reference(config)) == (reference, waits)
    clinical = ExperimentConfig.from_dict({"data": {"dataset": "mimic3", "root": "/x"}})
    assert not is_reference(clinical)  # clinical scores are probabilities: no squash


def test_analysis_squashes_with_the_references_squash_bounds(controller_experiment):
    experiment = analysis.load(controller_experiment)
    quantiles = squash_quantiles(experiment)
    scores = experiment.scores
    for row in quantiles.itertuples():
        rows = scores[
            (scores["trial"] == row.reference)
            & (scores["task"] == row.task)
            & (scores["split"] == "val")
            & scores["valid"]
        ]
        assert [row.q10, row.q90] == squash_bounds(rows["score"].to_numpy(np.float64))


@pytest.mark.slow
def test_a_controller_sweep_through_relif_sweep_reports_each_static_lambda(
    ray_session, nyuv2_dir, tmp_path, capsys
):
    """End to end: `relif sweep --controller-checks` (the front door), then `relif report`:
    each static lambda0 is its own controller-table row, and the ablation row aggregates."""
    from relif_ray.cli import main as relif_main

    sweep = [
        *("sweep", "--controller-checks", "--dataset", "nyuv2", "--data-dir", str(nyuv2_dir)),
        *("--seeds", "1", "--epochs", "1", "--steps", "2", "--backbone", "resnet18"),
        *("--batch-size", "12", "--set", "model.head_channels=16"),
        *("--set", "train.eval_batch_size=12", "--etas", "1e-3", "--r-stars", "0.2"),
        *("--static-lambdas", "0.03,0.3", "--storage", str(tmp_path), "--name", "checks"),
        *ONE_TRIAL_AT_A_TIME,
    ]
    assert relif_main(sweep) == 0, capsys.readouterr().err[-2000:]
    experiment = tmp_path / "checks"
    assert f"experiment directory: {experiment}" in capsys.readouterr().out
    trials = analysis.load(experiment).trials
    assert sorted(trials["variant"]) == [
        "erm",
        "relif (r*=0.16, eta=0.001)",
        "relif (r*=0.2, eta=0.001)",
        "relif-static (lambda0=0.03)",
        "relif-static (lambda0=0.3)",
    ]
    out = tmp_path / "report"
    report = ["report", str(experiment), "--out", str(out), "--no-figures", "--n-boot", "0"]
    assert relif_main([*report, "--pool-size", "16", "--pairs", "128"]) == 0
    controller = pd.read_csv(out / "tables" / "controller.csv", dtype={"lambda0": str})
    assert dict(zip(controller["variant"], controller["lambda0"], strict=True)) == {
        "relif (r*=0.16, eta=0.001)": "-",
        "relif (r*=0.2, eta=0.001)": "-",
        "relif-static (lambda0=0.03)": "0.03",
        "relif-static (lambda0=0.3)": "0.3",
    }
    ablation = pd.read_csv(out / "tables" / "ablation.csv")
    assert ablation.loc[ablation["variant"] == "relif-static", "n_seeds"].tolist() == [2]
    assert "of its λ0 grid (0.03, 0.3) and seeds" in (out / "report.md").read_text()
