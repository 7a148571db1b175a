"""End to end: the clinical sweep (what sweeps/clinical.py runs) on synthetic MIMIC-III and eICU ->
analysis -> relif report.

MIMIC-III runs the paper's selection path: an Optuna search over (r*, eta), then the grid of
erm and relif at the setting chosen on validation per seed (`--select-from`, two seeds), which
the other MIMIC-III tests read too; eICU runs a plain grid at its default seeds."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.analysis.groups import GroupOptions
from relif_ray.cli.sweep import CLINICAL, base_config, build_parser
from relif_ray.cli.sweep import main as sweep_main
from relif_ray.data.synthetic_eicu import write_synthetic_eicu
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.sweep.selection import read_pareto, select_settings
from tests.conftest import ONE_TRIAL_AT_A_TIME

MIMIC3_TASKS = {"mortality", "decompensation", "phenotype", "length_of_stay"}


def sweep(dataset: str, data_dir: Path, storage: Path, name: str, *flags: str) -> tuple[Path, str]:
    """A sweep through what `sweeps/clinical.py` calls, in this process and on the session's
    Ray (the script itself runs in tests/test_fail_fast.py and test_config_overrides.py): its
    experiment directory and what it printed."""
    argv = [
        *("--dataset", dataset, "--data-dir", str(data_dir), "--epochs", "1"),
        *("--batch-size", "8", "--warmup-steps", "1", *ONE_TRIAL_AT_A_TIME),
        *("--storage", str(storage), "--name", name, *flags),
    ]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = sweep_main(argv, datasets=tuple(CLINICAL), controller_checks=False)
    assert status == 0, out.getvalue()[-3000:]
    return storage / name, out.getvalue()


@pytest.fixture(scope="module")
def mimic3_search(ray_session, sweep_folder: Path) -> tuple[Path, Path]:
    """(data, storage) after an Optuna search of relif, one sample per seed 0 and 1."""
    # data seed 0 with 24 patients: both mortality classes occur in val and test
    data = write_synthetic_mimic3(sweep_folder / "m3" / "data", patients=24, seed=0)
    storage = sweep_folder / "m3-results"
    sweep("mimic3", data, storage, "search", "--seeds", "2", "--search", "optuna",
          "--num-samples", "1")  # fmt: skip
    return data, storage


@pytest.fixture(scope="module")
def mimic3_experiment(mimic3_search: tuple[Path, Path]) -> tuple[Path, str]:
    """erm and relif, seeds 0 and 1, relif at the (r*, eta) selected for each seed."""
    data, storage = mimic3_search
    return sweep(
        "mimic3", data, storage, "mimic3", "--seeds", "2", "--methods", "erm,relif",
        "--select-from", str(storage / "search"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def eicu_experiment(ray_session, sweep_folder: Path) -> tuple[Path, str]:
    data = write_synthetic_eicu(sweep_folder / "eicu" / "data", patients=40, seed=0)
    storage = sweep_folder / "eicu-results"
    return sweep(
        "eicu", data, storage, "eicu", "--methods", "erm",  # default seeds: 3
        "--set", "train.epoch_test_metrics=true",
    )  # fmt: skip


def test_paper_settings_are_the_clinical_defaults(tmp_path: Path) -> None:
    for dataset, seeds, delta in (("mimic3", 7, 0.275), ("eicu", 3, 0.06)):
        defaults = CLINICAL[dataset]
        assert (defaults.seeds, defaults.delta_ref) == (seeds, delta)
        args = build_parser(defaults, tuple(CLINICAL)).parse_args(["--dataset", dataset])
        config = base_config(args, defaults, str(tmp_path)).to_dict()
        assert config["data"]["dataset"] == dataset
        model = config["model"]
        assert (model["hidden_size"], model["num_layers"], model["dropout"]) == (256, 2, 0.3)
        train = config["train"]
        assert (train["optimizer"], train["lr"], train["weight_decay"]) == ("adamw", 1e-3, 1e-5)
        assert (train["batch_size"], train["grad_clip"]) == (64, 1.0)
        assert args.r_star is None and defaults.r_star == 0.16  # the grid default


@pytest.mark.slow
def test_mimic3_sweep_of_erm_and_relif(mimic3_experiment: tuple[Path, str]) -> None:
    experiment, stdout = mimic3_experiment
    assert "delta_ref = 0.275" in stdout
    loaded = analysis.load(experiment)
    trials = loaded.trials
    assert sorted(trials["label"]) == ["erm", "erm", "relif", "relif"]
    assert set(trials["seed"]) == {0, 1}
    for split in ("val", "test"):
        for metric in ("worst", "macro", "mortality_auprc", "length_of_stay_kappa"):
            assert all(math.isfinite(v) for v in trials[f"{split}_{metric}"]), (split, metric)
    assert set(loaded.scores["task"]) == MIMIC3_TASKS
    scores = loaded.scores
    assert ((scores["score"] >= 0) & (scores["score"] <= 1)).all()
    relif_trace = loaded.traces[loaded.traces["trial"].isin(trials.loc[trials["relif"], "trial"])]
    assert "lambda" in relif_trace.columns and relif_trace["lambda"].notna().all()


@pytest.mark.slow
def test_search_then_select_from_runs_the_selected_setting(mimic3_search, mimic3_experiment):
    _, storage = mimic3_search
    expected = select_settings(read_pareto(str(storage / "search")), 0.02)
    assert list(expected["seed"]) == [0, 1]
    experiment, stdout = mimic3_experiment
    trials = analysis.load(experiment).trials
    for chosen in expected.itertuples():
        assert f"relif seed {chosen.seed}: r*={chosen.r_star:g} eta={chosen.eta:g}" in stdout
        relif = trials[(trials["label"] == "relif") & (trials["seed"] == chosen.seed)]
        settings = relif["config"].iloc[0]["relif"]
        assert (settings["r_star"], settings["eta"]) == (chosen.r_star, chosen.eta)
    assert trials.loc[trials["label"] == "relif", "selected"].all()
    assert not trials.loc[trials["label"] == "erm", "selected"].any()
    assert not trials.loc[trials["label"] == "erm", "relif"].any()
    recorded = pd.read_csv(experiment / "selection.csv")
    assert list(recorded["trial_id"]) == list(expected["trial_id"])
    assert (recorded["source"] == str(storage / "search")).all()


@pytest.mark.slow
def test_an_exported_selection_sweep_reports_the_same_tables(mimic3_experiment, tmp_path):
    """`relif export` copies every experiment-level file analysis reads: the report of the
    copy merges the per-seed selected settings into one ReLiF row, as the original's does
    (without bootstrap intervals: the same numbers in give the same intervals out)."""
    from relif_ray.cli import main

    experiment, _ = mimic3_experiment
    chosen = pd.read_csv(experiment / "selection.csv")
    assert chosen[["r_star", "eta"]].drop_duplicates().shape[0] == 2  # the seeds differ
    copy = tmp_path / "exported"
    assert main(["export", str(experiment), str(copy)]) == 0
    tables = {}
    for name, source in (("original", experiment), ("export", copy)):
        flags = ["--out", str(tmp_path / name), "--no-figures", "--n-boot", "0"]
        assert main(["report", str(source), *flags]) == 0
        folder = tmp_path / name / "tables"
        tables[name] = {path.name: path.read_text() for path in sorted(folder.glob("*.csv"))}
    assert "relif" in tables["original"]["utility.csv"]
    utility = pd.read_csv(tmp_path / "original" / "tables" / "utility.csv")
    assert list(utility["label"]).count("relif") == 1
    assert tables["export"] == tables["original"]


@pytest.mark.slow
def test_eicu_sweep_uses_three_seeds_by_default(eicu_experiment: tuple[Path, str]) -> None:
    experiment, stdout = eicu_experiment
    assert "delta_ref = 0.06" in stdout
    trials = analysis.load(experiment).trials
    assert sorted(trials["seed"]) == [0, 1, 2]
    assert set(analysis.load(experiment).scores["task"]) == {"mortality", "length_of_stay"}
    config = trials["config"].iloc[0]
    assert config["data"]["dataset"] == "eicu" and config["train"]["optimizer"] == "adamw"


@pytest.mark.slow
def test_per_epoch_test_metrics_feed_the_delta_m_epoch_rules(
    eicu_experiment: tuple[Path, str], tmp_path: Path
) -> None:
    """train.epoch_test_metrics: every epoch's result has the test metrics, and the one
    epoch's equal the final outputs'; so `--delta-m-epochs last:K` and `best` give the final
    checkpoint's Delta-M% (against fixed numbers, where ERM's own is not 0)."""
    from relif_ray.cli import main

    experiment, _ = eicu_experiment
    loaded = analysis.load(experiment)
    epochs = loaded.epochs.set_index("trial")
    for row in loaded.trials.itertuples():
        assert epochs.loc[row.trial, "test_mortality_auroc"] == row.test_mortality_auroc
        assert epochs.loc[row.trial, "test_length_of_stay_mad"] == row.test_length_of_stay_mad
    base = tmp_path / "base.json"
    base.write_text(
        '{"mortality_auroc": 0.7, "mortality_auprc": 0.3, "length_of_stay_kappa": 0.2, '
        '"length_of_stay_mad": 90.0}'
    )
    values = {}
    for rule in ("final", "best", "last:3"):
        out = tmp_path / rule.replace(":", "")
        flags = ["--delta-m-base", str(base), "--delta-m-epochs", rule, "--n-boot", "0"]
        assert main(["report", str(experiment), "--out", str(out), *flags, "--no-figures"]) == 0
        values[rule] = pd.read_csv(out / "per_trial.csv")["delta_m"].tolist()
    assert values["best"] == values["final"] == values["last:3"]
    assert all(math.isfinite(value) and value != 0 for value in values["final"])


@pytest.mark.slow
def test_report_turns_both_sweeps_into_utility_tables(
    mimic3_search: tuple[Path, Path],
    mimic3_experiment: tuple[Path, str],
    eicu_experiment: tuple[Path, str],
    tmp_path: Path,
) -> None:
    """Both reports have their utility tables and a group audit: eICU's attributes from the
    trials' own data folder, MIMIC-III's from the root/ folder given. The group audit
    recomputes each task's metric from the stored outcomes exactly as the trial computed it,
    and the report's group tables are the API's (`relif_ray.analysis.group_tables`, adjusted over
    the report's family by `analysis.report_family`, shown on eICU's)."""
    from relif_ray.cli import main  # `relif report` (its script runs end to end elsewhere)

    root = mimic3_search[0] / "root"
    for (experiment, _), flags in (
        (mimic3_experiment, ["--attributes", str(root), "--min-group-size", "5"]),
        (eicu_experiment, ["--min-group-size", "5"]),
    ):
        out = tmp_path / experiment.name
        assert main(["report", str(experiment), "--out", str(out), *flags]) == 0
        header = (out / "tables" / "utility.csv").read_text().splitlines()[0]
        assert header.startswith("label,n_seeds,worst_mean,worst_std,macro_mean")
        assert "mortality_auroc_mean" in header and "length_of_stay_mad_mean" in header
        loaded = analysis.load(experiment)
        per_trial = pd.read_csv(out / "group_per_trial.csv")
        assert set(per_trial["task"]) == set(loaded.scores["task"])
        trials = loaded.trials.set_index("trial")
        for row in per_trial.itertuples():
            expected = trials.loc[row.trial, f"test_{row.task}_{row.metric}"]
            assert row.overall == pytest.approx(expected, abs=1e-9), (row.trial, row.task)
    assert "## Group fairness: patient groups" in (out / "report.md").read_text()
    groups = analysis.group_audit(loaded, "test", GroupOptions(min_group_size=5))  # eICU's
    adjusted = analysis.report_family(analysis.audit(loaded), groups)  # as the report adjusts
    for table in analysis.group_tables(adjusted.groups, adjusted.family):
        assert (out / "tables" / f"{table.name}.md").read_text() == table.markdown()


def test_unknown_dataset_is_rejected_before_ray_starts(tmp_path: Path, capsys, no_sweep) -> None:
    from relif_ray.cli.sweep import main  # as sweeps/clinical.py calls it

    argv = ["--dataset", "physionet", "--storage", str(tmp_path)]
    assert main(argv, datasets=tuple(CLINICAL), controller_checks=False) == 2
    assert "invalid choice: 'physionet'" in capsys.readouterr().err
