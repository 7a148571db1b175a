"""End to end on real data: `sweeps/tabular.py --preset actg175` (lifelines' ACTG 175 table)
-> `relif report`: a small sweep (erm and relif-st, two seeds, two epochs) on the session's
Ray, then the report with its data spec, native metrics per task and group audit; and the
same, shorter (erm and relif, one seed, a few steps), for the support2 and compas presets."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.cli.console import main as relif
from relif_ray.cli.sweep import main as sweep_main
from relif_ray.cli.tabular import SOURCE
from relif_ray.data import compas, support2
from relif_ray.data.actg175 import POST_BASELINE
from tests.conftest import ONE_TRIAL_AT_A_TIME

METRICS = [
    "event_auroc", "event_auprc", "course_auroc_macro", "course_accuracy",
    "cd4_20_mae", "cd4_20_rmse", "cd4_96_mae", "cd4_96_rmse",
]  # fmt: skip


@pytest.fixture(scope="module")
def actg175(ray_session, sweep_folder: Path) -> Path:
    argv = [
        *("--preset", "actg175", "--methods", "erm,relif-st", "--seeds", "2", "--epochs", "2"),
        *("--storage", str(sweep_folder), "--name", "actg175", *ONE_TRIAL_AT_A_TIME),
    ]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = sweep_main(argv, datasets=("tabular",), controller_checks=False, source=SOURCE)
    assert status == 0, out.getvalue()[-3000:]
    return sweep_folder / "actg175"


@pytest.mark.slow
def test_the_preset_trains_on_the_real_table_and_the_report_says_what_it_read(
    actg175: Path, tmp_path: Path
) -> None:
    experiment = analysis.load(str(actg175))
    assert len(experiment.trials) == 4
    spec = experiment.trials["config"].iloc[0]["data"]["spec"]
    assert not set(spec["features"]) & set(POST_BASELINE)
    assert sum(spec["summary"]["split_sizes"].values()) == 2139
    assert spec["summary"]["labelled"]["cd4_96"]["train"] < spec["summary"]["split_sizes"]["train"]
    steps = 2 * (spec["summary"]["split_sizes"]["train"] // 128)  # 2 epochs of full batches
    relif_trials = experiment.trials[experiment.trials["label"] == "relif-st"]
    for config in relif_trials["config"]:  # the controller-budget rule, recorded per trial
        assert config["relif"]["eta"] == pytest.approx(19.8 / steps, rel=1e-12)
        assert config["relif"]["warmup_steps"] == max(1, round(100 * steps / 19_800))
    traces = experiment.traces[experiment.traces["trial"].isin(relif_trials["trial"])]
    assert len(traces) == 2 * steps
    assert not traces["lambda"].between(0.09, 0.11).all()  # at the defaults, lambda moves

    out = tmp_path / "report"
    no_intervals = ["--no-figures", "--n-boot", "0"]  # the claims read no bootstrap interval
    assert relif(["report", str(actg175), "--out", str(out), *no_intervals]) == 0
    text = (out / "report.md").read_text()
    assert "Data (tabular): " in text and "event=cens:binary, course=course:multiclass" in text
    assert "race (non-white, white); gender (female, male); age (" in text
    trials = pd.read_csv(out / "per_trial.csv")
    assert set(METRICS) <= set(trials.columns)
    for column in ("event_auroc", "course_auroc_macro", "course_accuracy"):
        assert trials[column].between(0, 1).all(), column
    assert (trials[["cd4_20_mae", "cd4_96_rmse"]] > 0).all().all()
    verdicts = pd.read_csv(out / "group_verdicts.csv")
    assert set(verdicts["attribute"]) == {"race", "gender", "age"}
    assert set(verdicts["task"]) == {"event", "course", "cd4_20", "cd4_96"}
    metrics = verdicts.groupby("task")["metric"].unique().map(set)
    assert metrics["event"] == {"demographic_parity_difference", "equalized_odds_difference",
                                "metric_gap"}  # fmt: skip
    for task in ("course", "cd4_20", "cd4_96"):
        assert metrics[task] == {"error_gap", "prediction_gap"}, task
    per_group = pd.read_csv(out / "group_per_group.csv")
    course = per_group[per_group["task"] == "course"]
    assert (course["metric"] == "error").all() and course["value"].between(0, 1).all()
    shares = course[[c for c in course if c.startswith("share_")]].fillna(0).sum(axis=1)
    assert np.allclose(shares, 1.0)  # every row is predicted as one of the classes
    cd4 = per_group[per_group["task"] == "cd4_20"]
    assert (cd4["metric"] == "mae").all() and (cd4["value"] > 0).all()
    assert cd4["mean_prediction"].between(50, 1500).all()  # CD4 cells/mm3


SHORT = {
    "support2": (
        support2.NEVER,
        "mortality=hospdead:binary, disability=sfdm2:multiclass, stay=log_slos:regression",
        ["mortality_auroc", "disability_auroc_macro", "stay_rmse"],
        {"mortality", "disability", "stay"},
    ),
    "compas": (
        compas.NEVER,
        "recid=two_year_recid:binary, violent=is_violent_recid:binary",
        ["recid_auroc", "violent_auprc"],
        {"recid", "violent"},
    ),
}
"""Per preset: its columns that are never features, its tasks as the report prints them, some
of its metrics, and the tasks of its group audit (every task)."""


@pytest.mark.slow
def test_the_support2_and_compas_presets_train_on_their_real_tables_and_report(
    ray_session, sweep_folder: Path, tmp_path: Path
) -> None:
    for name, (never, tasks, metrics, audited) in SHORT.items():
        argv = [
            *("--preset", name, "--methods", "erm,relif", "--seeds", "1", "--steps", "8"),
            *("--storage", str(sweep_folder), "--name", name, *ONE_TRIAL_AT_A_TIME),
        ]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            status = sweep_main(argv, datasets=("tabular",), controller_checks=False, source=SOURCE)
        assert status == 0, out.getvalue()[-3000:]
        spec = analysis.load(str(sweep_folder / name)).trials["config"].iloc[0]["data"]["spec"]
        assert not set(spec["features"]) & set(never)

        report = tmp_path / name
        no_intervals = ["--no-figures", "--n-boot", "0"]
        assert relif(["report", str(sweep_folder / name), "--out", str(report), *no_intervals]) == 0
        assert f"- tasks: {tasks}" in (report / "report.md").read_text()
        trials = pd.read_csv(report / "per_trial.csv")
        assert len(trials) == 2 and set(metrics) <= set(trials.columns)
        verdicts = pd.read_csv(report / "group_verdicts.csv")
        assert set(verdicts["attribute"]) == {group["column"] for group in spec["groups"]}
        assert set(verdicts["task"]) == audited
