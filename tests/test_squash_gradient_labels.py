"""`relif.squash_gradient: straight_through` through the sweep vocabulary: the `relif-st` and
`METHOD+relif-st` labels in grids, Optuna, `--select-from`, the controller checks and trial
names, and the driver's refusal on data sets without squashed scores (no Ray starts here)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from relif_ray.cli.sweep import CLINICAL, main, run
from relif_ray.reference import waits_for_reference
from relif_ray.sweep.labels import (
    display_name,
    grid_variants,
    split_label,
    trial_name,
    uses_controller,
)
from relif_ray.sweep.plan import selected_trials
from relif_ray.sweep.trial_config import (
    TrialSpec,
    experiment_config,
    tune_constants,
    tune_trial,
)
from tests.test_sweeps import base_config


def test_straight_through_labels_parse_adapt_and_name_their_trials(tmp_path: Path) -> None:
    assert split_label("relif-st") == ("erm", "relif-st")
    assert split_label("pcgrad+relif-st") == ("pcgrad", "relif-st")
    assert uses_controller("relif-st") and uses_controller("pcgrad+relif-st")
    assert display_name("pcgrad+relif-st") == "PCGrad+ReLiF-ST"
    variants = grid_variants(["relif-st", "pcgrad+relif-st"], [0.2, 0.3], [1e-3])
    assert [v["label"] for v in variants] == ["relif-st"] * 2 + ["pcgrad+relif-st"] * 2
    own = tune_trial(TrialSpec.of(variants[3], 1))
    trial = {**tune_constants(base_config(tmp_path), 0.2), **own}
    relif = experiment_config(trial).relif
    assert experiment_config(trial).method.name == "pcgrad"
    assert relif.enabled and relif.squash == "erm" and relif.squash_gradient == "straight_through"
    assert relif.r_star == 0.3 and relif.eta == 1e-3
    assert waits_for_reference(experiment_config(trial))  # same forward value: same ERM squash
    assert trial_name(trial) == "pcgrad_relif-st_r0.3_eta0.001_seed1"
    chosen = selected_trials(["relif-st"], [4], {("relif-st", 4): (0.26, 2e-3)}, "search")
    assert [tune_trial(trial) for trial in chosen] == [
        {
            "label": "relif-st",
            "seed": 4,
            "method.name": "erm",
            "relif.enabled": True,
            "relif.squash_gradient": "straight_through",
            "relif.r_star": 0.26,
            "relif.eta": 2e-3,
        }
    ]


@pytest.fixture
def sweep_request(monkeypatch: pytest.MonkeyPatch) -> list:
    """What the driver hands to Ray Tune (space, search), recorded instead of run."""
    import relif_ray.tuning.launch

    requests: list = []

    def record(request, **_):
        requests.append((request.space, request.search))
        return "experiment"

    monkeypatch.setattr(relif_ray.tuning.launch, "run_sweep", record)
    return requests


@pytest.mark.parametrize(
    ("runner", "flags", "expected"),
    [
        (run, ["--methods", "erm,relif-st,pcgrad+relif-st"], {"relif-st", "pcgrad+relif-st"}),
        (run, ["--search", "optuna", "--methods", "relif-st,pcgrad+relif-st"], None),
        (
            partial(run, controller_checks=True),
            ["--label", "pcgrad+relif-st"],
            {"pcgrad+relif-st"},
        ),
    ],
)
def test_grids_optuna_and_controller_checks_run_straight_through_labels(
    runner, flags, expected, nyuv2_dir, tmp_path, sweep_request
) -> None:
    argv = ["--data-dir", str(nyuv2_dir), "--storage", str(tmp_path), *flags]
    assert runner(argv) == "experiment"
    ((space, search),) = sweep_request
    if search is not None:
        assert search.labels == ["relif-st", "pcgrad+relif-st"]
        return
    trials = [trial.config(space.base) for trial in space.trials]
    straight = {
        trial.label
        for trial, config in zip(space.trials, trials, strict=True)
        if config.relif.squash_gradient == "straight_through"
    }
    assert straight == expected
    assert {trial.label for trial in space.trials} - straight <= {"erm", "relif-static"}


@pytest.mark.parametrize("dataset", ["mimic3", "eicu"])
@pytest.mark.parametrize(
    ("label", "field"),
    [
        ("relif-st", "relif.squash_gradient: straight_through"),
        ("pcgrad+relif-st", "relif.squash_gradient: straight_through"),
        ("relif-logistic", "relif.surrogate_score: logistic"),
        ("pcgrad+relif-clipshare", "relif.clip_share_penalty: true"),
    ],
)
def test_a_squash_label_without_squashed_scores_is_refused_before_ray(
    dataset, label, field, tmp_path, capsys, no_sweep
) -> None:
    """The labels that change only how squashed scores train (`relif-st` and our variants
    `relif-logistic`, `relif-clipshare`), alone or composed, are one-line errors before Ray
    starts on a data set whose audit scores are all probabilities."""
    argv = ["--dataset", dataset, "--data-dir", str(tmp_path), "--methods", f"erm,{label}"]
    status = main([*argv, "--storage", "/nonexistent/x"], datasets=tuple(CLINICAL))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    name = label.partition("+")[2] or label
    assert (
        f"config field {field} (label {name}) changes nothing "
        f"on {dataset}, whose audit scores are all probabilities"
    ) in err[0]


@pytest.mark.parametrize(
    ("label", "fragment"),
    [
        ("relif-static", "--label: expected one ReLiF label that adapts lambda"),
        ("relif,relif-st", "--label: expected one ReLiF label"),
        ("erm+relif-foo", "--label: cannot parse 'erm+relif-foo'"),
    ],
)
def test_the_controller_checks_take_one_adaptive_label(
    label, fragment, nyuv2_dir, capsys, no_sweep
) -> None:
    argv = ["--data-dir", str(nyuv2_dir), "--label", label, "--storage", "/nonexistent/x"]
    status = main(argv, controller_checks=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and fragment in err[0], err
