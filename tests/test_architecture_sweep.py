"""A sweep over architectures, end to end: `relif sweep --architectures hps,mtan` on local Ray,
each architecture's ReLiF trials on their own architecture's same-seed ERM reference, then
`relif report`, whose rows name the architecture; and the flags that choose architectures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.cli import main as relif_main
from relif_ray.cli.sweep import NYUV2, base_config, build_parser
from relif_ray.sweep.trial_config import tune_constants
from tests.conftest import ONE_TRIAL_AT_A_TIME


@pytest.mark.slow
def test_a_sweep_over_architectures_names_each_in_its_trials_and_rows(
    ray_session, nyuv2_dir, tmp_path, capsys
):
    sweep = [
        *("sweep", "--dataset", "nyuv2", "--data-dir", str(nyuv2_dir), "--methods", "relif"),
        *("--architectures", "hps,mtan", "--seeds", "1", "--epochs", "1", "--steps", "2"),
        *("--backbone", "resnet18", "--batch-size", "12", "--set", "model.head_channels=16"),
        *("--set", "train.eval_batch_size=12", "--storage", str(tmp_path), "--name", "archs"),
        *ONE_TRIAL_AT_A_TIME,
    ]
    assert relif_main(sweep) == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out
    assert "added ERM reference trials for seed(s) 0, mtan:0" in out
    experiment = tmp_path / "archs"
    constants = json.loads((experiment / "squash_constants.json").read_text())["seeds"]
    assert sorted(constants) == ["0", "mtan:0"] and constants["0"] != constants["mtan:0"]
    trials = analysis.load(experiment).trials
    assert sorted(trials["variant"]) == ["erm [hps]", "erm [mtan]", "relif [hps]", "relif [mtan]"]
    eta = 19.8 / 2  # 2 steps: the controller-budget rule's eta
    assert any(
        path.name.startswith(f"relif_r0.24_eta{eta:g}_mtan_seed0") for path in experiment.iterdir()
    )
    report = tmp_path / "report"
    command = ["report", str(experiment), "--out", str(report), "--no-figures", "--n-boot", "0"]
    assert relif_main([*command, "--pool-size", "16", "--pairs", "128"]) == 0
    utility = pd.read_csv(report / "tables" / "utility.csv")
    assert set(utility.iloc[:, 0]) == {"erm [hps]", "erm [mtan]", "relif [hps]", "relif [mtan]"}


def resolved(tmp_path, *argv: str) -> dict:
    args = build_parser(NYUV2).parse_args(list(argv))
    return tune_constants(base_config(args, NYUV2, str(tmp_path)), NYUV2.delta)


def test_set_model_architecture_reaches_every_trials_config(tmp_path):
    constants = resolved(tmp_path, "--set", "model.architecture=mtan", "--set", "model.head=aspp")
    assert (constants["model.architecture"], constants["model.head"]) == ("mtan", "aspp")
    options = resolved(
        tmp_path,
        "--set",
        "model.architecture=cgc",
        "--set",
        "model.architecture_options.task_experts=2",
    )
    assert options["model.architecture_options"] == {"task_experts": 2}


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--architectures", "hps,ltb"], "--architectures: unknown architecture 'ltb' (choices: "),
        (["--architectures", "hps,hps"], "--architectures: expected distinct names"),
        (["--architectures", "hps,mtan", "--search", "optuna"], "--architectures: crosses a grid"),
        (["--set", "model.architecture=mtan", "--dataset", "eicu"],
         "config field model.architecture: mtan does not apply to the clinical LSTM"),
    ],
)  # fmt: skip
def test_architecture_flags_are_checked_before_ray_starts(
    flags, fragment, nyuv2_dir, tmp_path, capsys, no_sweep
):
    argv = ["sweep", "--data-dir", str(nyuv2_dir), "--storage", str(tmp_path / "out"), *flags]
    if "eicu" in flags:
        argv = ["sweep", "--demo", "--storage", str(tmp_path / "out"), *flags]
    status = relif_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "out").exists()
