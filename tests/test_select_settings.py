"""Choosing (r*, eta) per label and seed from an Optuna search's pareto.csv, on validation
numbers only, and running the sweep at the chosen settings (`--select-from`; end to end through
sweeps/clinical.py in test_clinical_sweep_e2e.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from relif_ray.cli.sweep import CLINICAL, main
from relif_ray.config import ExperimentConfig
from relif_ray.errors import UserError
from relif_ray.sweep.plan import selected_trials, trial_order, trial_space
from relif_ray.sweep.selection import PARETO_COLUMNS, read_pareto, select_settings
from relif_ray.sweep.trial_config import experiment_config, tune_constants, tune_trial


def front(*points: tuple) -> pd.DataFrame:
    """A pareto.csv table of (label, seed, r*, eta, val_bias, val_worst) points."""
    rows = [
        {
            "study": f"{label}-seed{seed}", "label": label, "seed": seed,
            "trial_id": f"t{number}", "r_star": r_star, "eta": eta,
            "val_bias": bias, "val_worst": worst, "val_macro": worst + 0.1,
        }
        for number, (label, seed, r_star, eta, bias, worst) in enumerate(points)
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=list(PARETO_COLUMNS))


def chosen_ids(table: pd.DataFrame, tolerance: float = 0.02) -> list[str]:
    return list(select_settings(table, tolerance)["trial_id"])


def test_lowest_bias_within_the_tolerance_of_the_best_worst_per_seed_and_label():
    table = front(
        ("relif", 0, 0.20, 1e-3, 0.10, 0.80),  # t0 best Worst
        ("relif", 0, 0.25, 1e-3, 0.05, 0.79),  # t1 within 0.02, lower Bias: chosen
        ("relif", 0, 0.30, 1e-2, 0.01, 0.70),  # t2 lowest Bias, but Worst too far below
        ("relif", 1, 0.16, 1e-4, 0.20, 0.60),  # t3 the only point of seed 1
        ("relif-noalign", 0, 0.2, 1e-3, 0.03, 0.75),  # t4 its own study
    )
    chosen = select_settings(table, 0.02)
    assert list(chosen["trial_id"]) == ["t1", "t3", "t4"]
    assert list(zip(chosen["label"], chosen["seed"], strict=True)) == [
        ("relif", 0), ("relif", 1), ("relif-noalign", 0)
    ]  # fmt: skip
    assert (chosen.loc[0, "r_star"], chosen.loc[0, "eta"]) == (0.25, 1e-3)
    # a tolerance of 0.1 admits t2, which has the lowest Bias; 0 keeps the best Worst only
    assert chosen_ids(table, 0.1)[0] == "t2"
    assert chosen_ids(table, 0.0)[0] == "t0"


def test_ties_go_to_higher_worst_then_smaller_r_star_then_smaller_eta():
    assert chosen_ids(
        front(("relif", 0, 0.2, 1e-3, 0.1, 0.79), ("relif", 0, 0.3, 1e-3, 0.1, 0.80))
    ) == ["t1"]
    assert chosen_ids(
        front(("relif", 0, 0.3, 1e-3, 0.1, 0.8), ("relif", 0, 0.2, 1e-2, 0.1, 0.8))
    ) == ["t1"]
    assert chosen_ids(
        front(("relif", 0, 0.2, 1e-2, 0.1, 0.8), ("relif", 0, 0.2, 1e-3, 0.1, 0.8))
    ) == ["t1"]


def test_the_tolerance_edge_is_inside_and_just_beyond_is_outside():
    table = front(("relif", 0, 0.2, 1e-3, 0.3, 0.8), ("relif", 0, 0.3, 1e-3, 0.1, 0.78))
    assert chosen_ids(table, 0.02) == ["t1"]  # 0.78 is exactly 0.02 below 0.80
    assert chosen_ids(table, 0.0199) == ["t0"]


def test_points_without_validation_numbers_are_never_chosen_and_bad_tolerance_is_refused():
    table = front(("relif", 0, 0.2, 1e-3, float("nan"), 0.9), ("relif", 0, 0.3, 1e-3, 0.2, 0.7))
    assert chosen_ids(table, 0.0) == ["t1"]
    with pytest.raises(UserError, match="--select-worst-tolerance: must be >= 0"):
        select_settings(table, -0.01)


def test_each_seed_runs_at_its_own_setting_and_other_labels_at_every_seed(tmp_path):
    settings = {("relif", 0): (0.2, 1e-3), ("relif", 1): (0.3, 1e-2)}
    trials = selected_trials(["erm", "relif"], [0, 1], settings, "search")
    described = [(t.label, t.seed, t.overrides.get("relif.r_star")) for t in trials]
    assert described == [("erm", 0, None), ("erm", 1, None), ("relif", 0, 0.2), ("relif", 1, 0.3)]
    base = ExperimentConfig.from_dict({"data": {"dataset": "nyuv2", "root": str(tmp_path)}})
    space = trial_space(base, trials, 0.2)
    # the sweep's trial order hands Tune exactly these trials (ERM references first)
    order = trial_order(space, None, set())
    configs = [
        {**tune_constants(space.base, space.delta), **tune_trial(item["config"])}
        for item in order.items
    ]
    resolved = [experiment_config(config) for config in configs]
    assert [(c.seed, c.relif.enabled, c.relif.r_star, c.relif.eta) for c in resolved[2:]] == [
        (0, True, 0.2, 1e-3), (1, True, 0.3, 1e-2)
    ]  # fmt: skip
    assert [c["label"] for c in configs] == ["erm", "erm", "relif", "relif"]


@pytest.mark.parametrize(
    ("labels", "seeds", "fragment"),
    [
        (["relif-noalign"], [0], "no study of 'relif-noalign' (studied: relif)"),
        (["relif"], [0, 2], "no study of 'relif' for seed 2"),
    ],
)
def test_a_label_or_seed_without_a_study_is_refused(labels, seeds, fragment):
    settings = {("relif", 0): (0.2, 1e-3), ("relif", 1): (0.3, 1e-2)}
    with pytest.raises(UserError, match=f"--select-from search: {re.escape(fragment)}"):
        selected_trials(labels, seeds, settings, "search")


@pytest.fixture
def search_dir(tmp_path: Path) -> Path:
    experiment = tmp_path / "search"
    experiment.mkdir()
    table = front(("relif", 0, 0.2, 1e-3, 0.1, 0.8), ("relif", 0, 0.3, 1e-3, 0.05, 0.79))
    table.to_csv(experiment / "pareto.csv", index=False)
    return experiment


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--select-from", "{tmp}/nosuch"], "--select-from: experiment directory not found"),
        (["--select-from", "{tmp}"], "no pareto.csv in {tmp}"),
        (["--select-from", "{search}", "--r-star", "0.2"], "conflicts with --r-star"),
        (["--select-from", "{search}", "--eta", "1e-3"], "conflicts with --eta"),
        (["--select-from", "{search}", "--search", "optuna"], "conflicts with --search optuna"),
        (["--select-from", "{search}", "--seeds", "2"], "no study of 'relif' for seed 1"),
        (
            ["--select-from", "{search}", "--methods", "relif-noalign"],
            "no study of 'relif-noalign'",
        ),
    ],
)
def test_select_from_mistakes_are_one_line_errors(flags, fragment, search_dir, capsys, no_sweep):
    where = {"tmp": str(search_dir.parent), "search": str(search_dir)}
    argv = [flag.format(**where) for flag in flags]
    base = ["--dataset", "mimic3", "--data-dir", str(search_dir), "--seeds", "1"]
    status = main([*base, *argv, "--storage", "/nonexistent/x"], datasets=tuple(CLINICAL))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert fragment.format(**where) in err[0]


def test_read_pareto_names_a_missing_column(search_dir):
    table = pd.read_csv(search_dir / "pareto.csv").drop(columns=["val_worst"])
    table.to_csv(search_dir / "pareto.csv", index=False)
    with pytest.raises(
        UserError, match=r"--select-from: .*pareto.csv: damaged file \(missing column.s. val_worst"
    ):
        read_pareto(str(search_dir))


def test_the_report_keeps_one_row_for_a_label_selected_per_seed():
    from relif_ray.analysis.experiment import variant_names

    trials = pd.DataFrame(
        {"label": ["relif", "relif"], "r_star": [0.2, 0.3], "eta": [1e-3, 1e-2], "seed": [0, 1]}
    )
    assert list(variant_names(trials)) == ["relif (r*=0.2, eta=0.001)", "relif (r*=0.3, eta=0.01)"]
    assert list(variant_names(trials.assign(selected=True))) == ["relif", "relif"]


def test_the_controller_table_lists_each_seeds_selected_setting():
    from relif_ray.analysis.relif_tables import setting_text

    assert setting_text(pd.Series([0.2, 0.2])) == "0.2"
    assert setting_text(pd.Series([0.2, 0.3, 0.2])) == "0.2 / 0.3 / 0.2"
