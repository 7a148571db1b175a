"""ERM-first sweeps: ReLiF trains on its same-seed ERM run's squash constants (paper section 3,
appendix A.3), so its trials wait for that run; the audit uses the same constants."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from relif_ray import analysis
from relif_ray.analysis.audit_scores import squash_quantiles
from relif_ray.errors import UserError
from relif_ray.experiment.layout import SQUASH_CONSTANTS_FILE
from relif_ray.experiment.outputs import read_trial_info
from relif_ray.reference import read_squash_constants
from relif_ray.sweep.exit_status import TrialsErrored
from relif_ray.sweep.labels import variant
from relif_ray.sweep.plan import SweepSpace, param_space, trial_order
from relif_ray.sweep.trial_config import TuneKeys, tune_trial
from tests.conftest import in_code
from tests.test_sweeps import base_config, trial_states


def _space(root: Path, labels: list[str], seeds: list[int], **train) -> SweepSpace:
    return param_space(base_config(root, **train), [variant(x) for x in labels], seeds, 0.2)


def _order(order) -> list[tuple[str, int, int | None, int | None]]:
    return [
        (
            item["config"].label,
            item["config"].seed,
            item["needs"],
            item["provides"],
        )
        for item in order.items
    ]


def test_references_first_then_independent_trials_then_waiting_ones(small_data: Path) -> None:
    order = trial_order(_space(small_data, ["pcgrad+relif", "pcgrad", "erm"], [1, 0]), None, set())
    assert _order(order) == [
        ("erm", 0, None, "0"),
        ("erm", 1, None, "1"),
        ("pcgrad", 0, None, None),
        ("pcgrad", 1, None, None),
        ("pcgrad+relif", 0, "0", None),
        ("pcgrad+relif", 1, "1", None),
    ]
    assert order.added_references == ()


def test_a_missing_reference_is_added_and_lent_seeds_wait_for_nothing(small_data: Path) -> None:
    order = trial_order(_space(small_data, ["relif", "relif-static"], [0, 1]), None, {"1"})
    assert _order(order) == [
        ("erm", 0, None, "0"),
        ("relif", 1, None, None),
        ("relif-static", 1, None, None),
        ("relif", 0, "0", None),
        ("relif-static", 0, "0", None),
    ]
    assert order.added_references == ("0",)


def test_each_architecture_waits_for_its_own_erm_reference(small_data: Path) -> None:
    """An axis over architectures (`--architectures`): the ReLiF trials of MTAN wait for MTAN's
    ERM trial of their seed (its feature norms are its own), which the sweep adds; those of
    hard sharing for the plain one (key: the seed alone, as before architectures)."""
    space = _space(small_data, ["erm", "relif"], [0])
    space.trials = [
        replace(trial, overrides={**trial.overrides, "model.architecture": architecture})
        for trial in space.trials
        for architecture in ("hps", "mtan")
        if not (architecture == "mtan" and trial.label == "erm")
    ]
    order = trial_order(space, None, set())
    assert [
        (i["config"].overrides.get("model.architecture"), i["needs"], i["provides"])
        for i in order.items
    ] == [
        ("hps", None, "0"),
        ("mtan", None, "mtan:0"),
        ("hps", "0", None),
        ("mtan", "mtan:0", None),
    ]
    assert order.added_references == ("mtan:0",)
    assert tune_trial(order.items[1]["config"]) == {
        "label": "erm",
        "seed": 0,
        "method.name": "erm",
        "relif.enabled": False,
        "model.architecture": "mtan",
    }


def test_running_squash_and_clinical_data_need_no_reference(small_data: Path) -> None:
    space = _space(small_data, ["erm", "relif"], [0])
    space.base = replace(space.base, relif=replace(space.base.relif, squash="running"))
    assert [item["needs"] for item in trial_order(space, None, set()).items] == [None, None]


def _tune_state(experiment: Path, trials: dict[str, dict]) -> None:
    """The experiment state Tune resumes from, as Tune writes it: the trial list with each
    trial's id and config (its newest `experiment_state-*.json`)."""
    trial_data = [[json.dumps({"trial_id": t, "config": c}), "{}"] for t, c in trials.items()]
    (experiment / "experiment_state-2026-01-01_00-00-00.json").write_text(
        json.dumps({"trial_data": trial_data})
    )


def _snapshot(order, path: Path):
    from relif_ray.tuning.order import ReferenceOrder

    order.save(str(path))
    restored = ReferenceOrder([], order._experiment_dir)
    return lambda: (restored.restore(str(path)), restored)[1]


CONSTANTS = {"squash_constants/depth": [1.0, 2.0], "squash_constants/normal": [3.0, 4.0]}


@pytest.mark.parametrize("when", ["before any trial", "with the reference running"])
def test_a_snapshot_older_than_the_resumed_trials_hands_out_nothing_twice(
    small_data: Path, tmp_path: Path, when: str
) -> None:
    """Tune copies its trial list and the searcher's snapshot to storage one after the other:
    a driver killed in between resumes trials that the snapshot still calls pending."""
    from relif_ray.tuning.order import ReferenceOrder

    items = trial_order(_space(small_data, ["erm", "relif"], [0]), None, set()).tune_items()
    order = ReferenceOrder(items, str(tmp_path))
    order.set_search_properties("worst", "max", {"delta": 0.2})  # as Tune starts a new run
    restore = _snapshot(order, tmp_path / "old.pkl")
    erm = order.suggest("t-erm")
    if when == "before any trial":
        order.on_trial_complete("t-erm", {**erm, **CONSTANTS})
        relif = order.suggest("t-relif")
        _tune_state(tmp_path, {"t-erm": erm, "t-relif": relif})
        assert restore().suggest("t-new") == ReferenceOrder.FINISHED
        return
    _tune_state(tmp_path, {"t-erm": erm})  # killed while the reference trains
    resumed = restore()
    assert resumed.suggest("t-new") is None  # the relif trial waits for the resumed reference
    resumed.on_trial_complete("t-erm", {**erm, **CONSTANTS})
    assert resumed.suggest("t-relif")["label"] == "relif"
    assert read_squash_constants(str(tmp_path))["0"] == {"depth": [1.0, 2.0], "normal": [3.0, 4.0]}
    assert resumed.suggest("t-more") == ReferenceOrder.FINISHED


def test_a_snapshot_newer_than_the_resumed_trials_loses_no_trial(small_data, tmp_path):
    """The snapshot saw a trial handed out that Tune's trial list never recorded."""
    from relif_ray.tuning.order import ReferenceOrder

    items = trial_order(_space(small_data, ["erm", "pcgrad"], [0]), None, set()).tune_items()
    order = ReferenceOrder(items, str(tmp_path))
    order.set_search_properties("worst", "max", {"delta": 0.2})  # as Tune starts a new run
    erm = order.suggest("t-erm")
    order.suggest("t-pcgrad")
    restore = _snapshot(order, tmp_path / "new.pkl")
    _tune_state(tmp_path, {"t-erm": erm})
    resumed = restore()
    assert resumed.suggest("t-again")["label"] == "pcgrad"
    assert resumed.suggest("t-more") == ReferenceOrder.FINISHED


@pytest.fixture(scope="module")
def phased(ray_session, small_data: Path, sweep_folder: Path) -> Path:
    """erm, pcgrad and relif for one seed on 2 one-CPU slots; each trial's final checkpoint
    only, with SGD (a third less to write than with Adam's two moments): the tests read the
    trials' final outputs and the driver's state."""
    from relif_ray.tuning.launch import run_sweep

    space = _space(small_data, ["erm", "pcgrad", "relif"], [0], epochs=3, optimizer="sgd")
    storage = sweep_folder / "phased"
    return Path(run_sweep(in_code(space, "phased", storage, checkpoint_every=0), verbose=0))


@pytest.mark.slow
def test_a_resume_that_tune_cannot_restore_is_not_started_over(phased: Path, tmp_path) -> None:
    """Tune fails to read this trial list and would start the sweep again without its
    parameter space (every new trial failing on a missing setting); the resume stops first
    (`relif_ray.tuning.resume`)."""
    from relif_ray.tuning.launch import run_sweep

    copy = tmp_path / "phased"
    copy.mkdir()
    for state in phased.iterdir():  # the driver state only: Tune fails before the trials
        if state.is_file():
            shutil.copy(state, copy / state.name)
    state = next(copy.glob("experiment_state-*.json"))
    record = json.loads(state.read_text())
    record["trial_data"] = [["{}", "{}"]]
    state.write_text(json.dumps(record))
    with pytest.raises(UserError, match="could not restore the sweep .* nothing was started"):
        run_sweep(in_code(None, copy.name, tmp_path), verbose=0)
    assert not [path for path in copy.iterdir() if path.is_dir()]  # no trial was created


def test_a_state_file_cut_by_a_killed_driver_is_put_back_and_the_sweep_resumes(
    phased: Path, tmp_path, capsys
) -> None:
    """The experiment state cut in half, as a driver killed while Tune copied it leaves it:
    `--resume` puts back the complete copy that this node's Ray session kept (the sweep ran on
    the tests' Ray), says so on the command's stdout, and Tune resumes the finished sweep."""
    from relif_ray.messages import show_messages
    from relif_ray.tuning.launch import run_sweep

    show_messages()  # as the sweep's command does (relif_ray.cli.parsing.run_command)

    copy = tmp_path / "phased"  # the same experiment name: the staging copy is found by it
    shutil.copytree(phased, copy, ignore=shutil.ignore_patterns("checkpoint_*"))
    state = next(copy.glob("experiment_state-*.json"))
    whole = state.read_bytes()
    state.write_bytes(whole[: len(whole) // 2])
    run_sweep(in_code(None, copy.name, tmp_path), verbose=0)
    assert f"--resume: {state.name} was cut off" in capsys.readouterr().out
    assert state.read_bytes() == whole
    assert set(trial_states(copy).values()) == {("TERMINATED", 0)}


def _times(experiment: Path) -> dict[str, tuple[float, float]]:
    loaded = analysis.load(experiment)
    return {
        read_trial_info(out)["label"]: (
            read_trial_info(out)["started_at"],
            read_trial_info(out)["finished_at"],
        )
        for out in loaded.outputs.values()
    }


def test_pcgrad_runs_beside_erm_and_relif_starts_after_erm(phased: Path) -> None:
    times = _times(phased)
    erm, pcgrad, relif = times["erm"], times["pcgrad"], times["relif"]
    assert pcgrad[0] < erm[1] and erm[0] < pcgrad[1]  # the two slots run erm and pcgrad
    assert relif[0] >= erm[1]  # relif waits for the ERM reference of its seed


def test_one_score_two_uses(phased: Path) -> None:
    """The constants file holds ERM's validation q10/q90; the ReLiF trial trained on exactly
    those (its trial.json records them) and the audit squashes with the same numbers."""
    constants = read_squash_constants(str(phased))["0"]
    loaded = analysis.load(phased)
    scores = loaded.scores
    erm = loaded.trials.set_index("label").loc["erm", "trial"]
    for task in ("depth", "normal"):
        values = scores[
            (scores["trial"] == erm) & (scores["split"] == "val") & (scores["task"] == task)
        ]["score"]
        assert constants[task] == list(np.quantile(values.to_numpy(np.float64), (0.1, 0.9)))
    relif = loaded.trials.set_index("label").loc["relif"]
    assert relif["config"]["relif"]["squash_constants"] == constants
    audit = squash_quantiles(loaded).set_index(["trial", "task"])
    for task in ("depth", "normal"):
        row = audit.loc[(relif["trial"], task)]
        assert [row["q10"], row["q90"]] == constants[task]


@pytest.mark.slow
def test_reference_lends_its_constants_to_a_new_sweep(
    ray_session, phased: Path, small_data: Path, tmp_path: Path
) -> None:
    from relif_ray.tuning.launch import run_sweep

    experiment = Path(
        run_sweep(
            in_code(
                _space(small_data, ["relif"], [0], epochs=1),
                "lent",
                tmp_path,
                reference=str(phased),
            ),
            verbose=0,
        )
    )
    assert json.loads((experiment / SQUASH_CONSTANTS_FILE).read_text()) == json.loads(
        (phased / SQUASH_CONSTANTS_FILE).read_text()
    )
    loaded = analysis.load(experiment)
    assert list(loaded.trials["label"]) == ["relif"]  # no ERM trial of its own
    expected = read_squash_constants(str(phased))["0"]
    assert loaded.trials["config"].iloc[0]["relif"]["squash_constants"] == expected
    audit = squash_quantiles(loaded).set_index("task")  # the audit reads the lent file too
    assert set(audit["reference"]) == {SQUASH_CONSTANTS_FILE}
    assert {task: [row.q10, row.q90] for task, row in audit.iterrows()} == expected


@pytest.mark.slow
def test_dependents_of_an_errored_reference_error_without_training(
    ray_session, small_data: Path, tmp_path: Path
) -> None:
    from relif_ray.tuning.launch import run_sweep

    space = _space(small_data, ["erm", "relif"], [0], epochs=2)
    space.shared = TuneKeys(fault_injection_step=0)  # every trial fails once before a checkpoint
    with pytest.raises(TrialsErrored):
        run_sweep(in_code(space, "broken", tmp_path, max_failures=0), verbose=0)
    experiment = tmp_path / "broken"
    assert sorted(status for status, _ in trial_states(experiment).values()) == ["ERROR"] * 2
    errors = {
        path.parent.name.split("_")[0]: path.read_text() for path in experiment.glob("*/error.txt")
    }
    assert "InjectedFault" in errors["erm"]
    assert "the ERM reference trial of seed 0 errored" in errors["relif"]
    assert not (experiment / SQUASH_CONSTANTS_FILE).exists()


def test_a_reference_without_constants_is_refused_before_any_sweep(tmp_path, capsys, no_sweep):
    from relif_ray.cli.sweep import main

    argv = ["--demo", "--storage", str(tmp_path), "--reference", str(tmp_path / "nope")]
    assert main(datasets=("nyuv2",), argv=argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--reference {tmp_path / 'nope'}: no {SQUASH_CONSTANTS_FILE} there")
    assert "\n" not in err
