"""Fail before any trial starts, never retry a user's mistake, and exit honestly.

Through the real sweep scripts as subprocesses: a mistake the driver can see (a data file of
the wrong shape, a label value out of range, an unknown backbone, a garbage listfile row, an
empty data folder, storage that cannot be written) is one line on stderr, exit status 2, no Ray
started and no experiment folder. A mistake only a trial can see (a NaN pixel in an image: the
driver reads image headers, not pixels) ends that trial at once: ERROR after one failure
despite --max-failures 2, exit status 1, and a summary naming the trial, its error, its error
file and the retry command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relif_ray import analysis
from relif_ray.cli.sweep import CLINICAL, main
from relif_ray.config import ExperimentConfig
from relif_ray.data.eicu import check_eicu
from relif_ray.data.mimic3 import check_mimic3
from relif_ray.data.nyuv2 import check_nyuv2
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.errors import UserError
from relif_ray.sweep.preflight import check_storage, check_trial_configs
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.conftest import HANG_GUARD_S, in_code, tiny_config

REPO = Path(__file__).resolve().parents[1]
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # local Ray binds to 127.0.0.1 only
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def run_sweep(
    script: str, *args: str, timeout: int = HANG_GUARD_S, ray_env: dict[str, str] = RAY_ENV
) -> subprocess.CompletedProcess:
    """The script as a process; `ray_env`: the settings of a local Ray it would start."""
    return subprocess.run(
        [sys.executable, script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **ray_env},
    )


def assert_refused(result: subprocess.CompletedProcess, fragment: str, storage: Path) -> None:
    """Exit 2, one line naming what is wrong, no traceback, nothing written to storage."""
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert fragment in lines[0], lines[0]
    assert not storage.exists()


@pytest.fixture
def run_main(monkeypatch, capsys):
    """The sweep script's `main` in this process (what the scripts call), as a finished
    process; a refused sweep never reaches Ray, so this is the script without its start-up."""
    import relif_ray.tuning.launch

    def refuse(*_, **__):
        raise AssertionError("the driver accepted the flags and started a sweep")

    monkeypatch.setattr(relif_ray.tuning.launch, "run_sweep", refuse)

    def run(entry, *args: str) -> subprocess.CompletedProcess:
        code = entry(list(args))
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    return run


@pytest.fixture
def nyuv2_copy(nyuv2_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(nyuv2_dir, tmp_path / "data"))


def nyuv2_main(argv: list[str]) -> int:
    return main(argv, datasets=("nyuv2",))


def clinical_main(argv: list[str]) -> int:
    return main(argv, datasets=tuple(CLINICAL))


def nyuv2_flags(data: Path, storage: Path) -> list[str]:
    return [
        *("--data-dir", str(data), "--methods", "erm", "--seeds", "1", "--epochs", "1"),
        *("--backbone", "resnet18", "--batch-size", "6", "--num-cpus", "2"),
        *("--storage", str(storage)),
    ]


@pytest.mark.slow
def test_a_label_file_of_the_wrong_shape_stops_the_nyuv2_sweep(nyuv2_copy, tmp_path):
    bad = nyuv2_copy / "val" / "label" / "3.npy"
    np.save(bad, np.load(bad)[..., None])
    storage = tmp_path / "results"
    result = run_sweep("sweeps/nyuv2.py", *nyuv2_flags(nyuv2_copy, storage))
    assert_refused(result, f"{bad}: label must have shape HxW, got 32x40x1", storage)


def test_a_label_value_out_of_range_stops_the_nyuv2_sweep(nyuv2_copy, tmp_path, run_main):
    bad = nyuv2_copy / "train" / "label" / "4.npy"
    label = np.load(bad)
    label[3, 5] = 13
    np.save(bad, label)
    storage = tmp_path / "results"
    result = run_main(nyuv2_main, *nyuv2_flags(nyuv2_copy, storage))
    assert_refused(result, f"{bad}: label values must be in -1..12 (-1 = ignore)", storage)


def test_an_unknown_backbone_stops_the_sweep(nyuv2_dir, tmp_path, run_main):
    storage = tmp_path / "results"
    flags = nyuv2_flags(nyuv2_dir, storage)
    flags[flags.index("resnet18")] = "resnet999"
    result = run_main(nyuv2_main, *flags)
    assert_refused(result, "config field model.backbone: unknown backbone 'resnet999'", storage)


CTRL_C_AT = """
import os, runpy, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as started from a terminal
import {module} as patched

def ctrl_c(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)

patched.{function} = ctrl_c
sys.argv = {argv!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""A script run as its command runs from a terminal, with a real Ctrl+C (SIGINT) at one of its
steps. Python keeps SIGINT ignored where it started ignored, as a shell's background job (`&`
without job control) does, and passes that on: so the script sets Python's handler first,
whatever the process that runs the tests inherited."""


@pytest.mark.parametrize("command", ["sweep", "report"])
@pytest.mark.slow
def test_ctrl_c_before_a_sweep_or_in_a_report_is_one_line_and_writes_nothing(
    command, nyuv2_dir, tmp_path
):
    """Outside a running sweep's own stop handling (which says how to resume), Ctrl+C ends a
    command with one line and exit status 130 (128 + SIGINT), not Python's traceback: a sweep
    while it checks its data, a report while it audits (its folder is made afterwards)."""
    out = tmp_path / "out"
    if command == "sweep":
        module, function = "relif_ray.tuning.driver", "check_data"
        argv = ["sweeps/nyuv2.py", *nyuv2_flags(nyuv2_dir, out)]
    else:
        experiment = write_synthetic_experiment(tmp_path / "exp", seeds=2, n_examples=12)
        module, function = "relif_ray.analysis.report", "audit"
        relif = Path(sys.executable).with_name("relif")
        argv = [str(relif), "report", str(experiment), "--out", str(out)]
    code = CTRL_C_AT.format(module=module, function=function, argv=argv)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stderr.splitlines() == [f"{Path(argv[0]).name}: interrupted"], result.stderr
    assert not out.exists()


def test_storage_that_cannot_be_created_stops_the_sweep(nyuv2_dir, tmp_path, run_main):
    result = run_main(nyuv2_main, *nyuv2_flags(nyuv2_dir, Path("/dev/null/x")))
    assert_refused(result, "--storage /dev/null/x: /dev/null is not a directory", tmp_path / "x")


def test_a_garbage_listfile_row_stops_the_clinical_sweep(tmp_path, run_main):
    data = write_synthetic_mimic3(tmp_path / "data", patients=12, seed=0)
    listfile = data / "val_listfile.csv"
    lines = listfile.read_text().splitlines()
    listfile.write_text("\n".join([*lines[:2], "garbage,row", *lines[2:]]) + "\n")
    storage = tmp_path / "results"
    result = run_main(
        clinical_main,
        *("--dataset", "mimic3", "--data-dir", str(data), "--storage", str(storage)),
    )
    assert_refused(result, f"{listfile}: line 3: expected 6 comma-separated fields", storage)


@pytest.mark.slow
def test_an_empty_data_dir_stops_the_clinical_sweep(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    storage = tmp_path / "results"
    result = run_sweep(
        "sweeps/clinical.py",
        *("--dataset", "mimic3", "--data-dir", str(empty), "--storage", str(storage)),
    )
    assert_refused(result, f"{empty / 'train_listfile.csv'}: not found", storage)


def test_an_empty_data_dir_stops_the_eicu_sweep(tmp_path, run_main):
    empty = tmp_path / "empty"
    empty.mkdir()
    storage = tmp_path / "results"
    result = run_main(
        clinical_main,
        *("--dataset", "eicu", "--data-dir", str(empty), "--storage", str(storage)),
    )
    assert_refused(result, f"{empty / 'all_data.csv'}: not found", storage)


# ---------------------------------------------------------------------------------------
# The driver's checks, one rule each


def trial_config(root: Path, **sections: dict) -> ExperimentConfig:
    config = tiny_config(root)
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    return ExperimentConfig.from_dict(config)


@pytest.mark.parametrize(
    ("sections", "fragment"),
    [
        ({"method": {"name": "gradnorm", "options": {"alpha": -1.0}}}, "method.options.alpha"),
        (
            {"method": {"name": "fairgrad", "options": {"beta": 1.0}}},
            "method.options: fairgrad takes no option 'beta'",
        ),
        ({"method": {"name": "erm", "gradient_source": "representation"}}, "has no 'repr"),
        ({"model": {"backbone": "resnet999"}}, "model.backbone: unknown backbone"),
        (
            {"method": {"gradient_source": "representation"}, "train": {"compile": True}},
            "needs train.compile false",
        ),
        ({"model": {"pretrained": "/no/such/weights.pt"}}, "model.pretrained: no such file"),
    ],
)
def test_each_trials_method_and_model_are_built_before_ray(sections, fragment, tmp_path):
    good = trial_config(tmp_path)
    with pytest.raises(UserError, match=fragment.replace(".", r"\.")):
        check_trial_configs([good, trial_config(tmp_path, **sections)])
    check_trial_configs([good])


def test_pretrained_weights_are_loaded_onto_the_meta_model(tmp_path):
    import torch
    import torchvision

    path = tmp_path / "resnet18.pt"
    state = torchvision.models.resnet18(weights=None).state_dict()
    torch.save(state, path)
    check_trial_configs([trial_config(tmp_path, model={"pretrained": str(path)})])
    torch.save({**state, "conv1.weight": torch.zeros(1)}, path)
    with pytest.raises(UserError, match="model.pretrained: .*'conv1.weight' has shape"):
        check_trial_configs([trial_config(tmp_path, model={"pretrained": str(path)})])


@pytest.mark.parametrize(
    ("modality", "value", "fragment"),
    [
        ("label", 13, r"label values must be in -1\.\.12 \(-1 = ignore\), found range -?\d+\.\.13"),
        ("label", -2, r"label values must be in -1\.\.12 \(-1 = ignore\), found range -2\.\."),
        ("label", 2.5, "label contains non-integral values"),
        ("depth", np.nan, "depth contains NaN or infinite values"),
        ("depth", -1, "depth contains negative values"),
        ("normal", np.inf, "normal contains NaN or infinite values"),
        ("normal", 2.0, r"normal at pixel \(0, 0\) has length"),
    ],
)
def test_the_nyuv2_check_scans_label_depth_and_normal_values(nyuv2_copy, modality, value, fragment):
    path = nyuv2_copy / "val" / modality / "2.npy"
    array = np.load(path)
    array[0, 0] = value
    np.save(path, array)
    with pytest.raises(UserError, match=f"^{re.escape(str(path))}: {fragment}"):
        check_nyuv2(nyuv2_copy)


def test_the_nyuv2_check_reads_image_headers_only_and_finds_a_truncated_image(nyuv2_copy):
    check_nyuv2(nyuv2_copy)
    image = nyuv2_copy / "train" / "image" / "7.npy"
    pixels = np.load(image)
    pixels[0, 0, 0] = np.nan  # image values: only a trial's reader finds them
    np.save(image, pixels)
    check_nyuv2(nyuv2_copy)
    image.write_bytes(image.read_bytes()[:-100])
    with pytest.raises(UserError, match=f"{image}: unreadable .npy file"):
        check_nyuv2(nyuv2_copy)
    normal = nyuv2_copy / "val" / "normal" / "2.npy"
    np.save(normal, np.zeros((32, 41, 3), np.float32))
    image.unlink()
    shutil.copy(nyuv2_copy / "train" / "image" / "0.npy", image)
    with pytest.raises(UserError, match=f"{normal}: size 32x41 differs"):
        check_nyuv2(nyuv2_copy)


def test_the_mimic3_check_finds_a_missing_episode_and_a_bad_header(tmp_path):
    data = write_synthetic_mimic3(tmp_path / "data", patients=12, seed=0)
    check_mimic3(data)
    episode = sorted((data / "test").glob("*_timeseries.csv"))[0]
    text = episode.read_text()
    episode.write_text(text.replace("Hours", "Time", 1))
    with pytest.raises(UserError, match=f"{episode}: line 1: header must start with 'Hours'"):
        check_mimic3(data)
    episode.unlink()
    with pytest.raises(UserError, match=f"episode file {episode} not found"):
        check_mimic3(data)


def test_the_eicu_check_parses_all_data_whole(tmp_path):
    from relif_ray.data.synthetic_eicu import write_synthetic_eicu

    data = write_synthetic_eicu(tmp_path / "data", patients=12, seed=0)
    check_eicu(data)
    table = data / "all_data.csv"
    lines = table.read_text().splitlines()
    column = lines[0].split(",").index("patientunitstayid")
    stays = sorted({int(float(line.split(",")[column])) for line in lines[1:]})
    (data / "splits.csv").write_text(
        "patientunitstayid,split\n"
        + "".join(f"{stay},{'train' if i % 2 else 'test'}\n" for i, stay in enumerate(stays))
    )
    with pytest.raises(UserError, match=f"{table}: no usable stay in the val split"):
        check_eicu(data)
    (data / "splits.csv").unlink()
    header = lines[0].split(",")
    row = lines[3].split(",")
    row[header.index("hospitaldischargestatus")] = "7"
    table.write_text("\n".join([*lines[:3], ",".join(row), *lines[4:]]) + "\n")
    with pytest.raises(UserError, match=f"{table}: line 4: hospitaldischargestatus"):
        check_eicu(data)


def test_storage_is_checked_without_creating_it(tmp_path):
    target = tmp_path / "a" / "b"
    check_storage(str(target))
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not a directory"):
        check_storage(str(tmp_path / "file" / "x"))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root may write anywhere
        pytest.skip("running as root")
    with pytest.raises(UserError, match=f"{locked} is not writable"):
        check_storage(str(locked / "results"))


def test_a_file_uri_storage_is_checked_like_its_path(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=f"{tmp_path / 'file'} is not a directory"):
        check_storage((tmp_path / "file" / "x").as_uri())
    check_storage((tmp_path / "a" / "b").as_uri())
    assert not (tmp_path / "a").exists()


# ---------------------------------------------------------------------------------------
# A user error only a trial can find


@pytest.mark.slow
def test_a_user_error_in_a_trial_errors_it_once_and_the_sweep_exits_non_zero(
    ray_session, nyuv2_copy, tmp_path
):
    """The script joins the tests' Ray (`--address`) instead of starting one of its own: the
    error handling checked here is the driver's and the trial's, the same on any Ray."""
    bad = nyuv2_copy / "val" / "image" / "1.npy"
    image = np.load(bad)
    image[0, 0, 0] = np.nan  # the header is fine; only reading the pixels finds it
    np.save(bad, image)
    storage = tmp_path / "results"
    address = ray_session.get_runtime_context().gcs_address
    flags = [*nyuv2_flags(nyuv2_copy, storage), "--name", "bad", "--max-failures", "2"]
    flags += ["--address", address]
    result = run_sweep("sweeps/nyuv2.py", *flags, timeout=HANG_GUARD_S, ray_env={})  # no local Ray
    assert result.returncode == 1, result.stderr[-3000:]
    experiment = storage / "bad"
    trial_dir = next(path for path in experiment.iterdir() if path.name.startswith("erm_seed0"))
    error_file = trial_dir / "error.txt"
    message = f"{bad}: image contains NaN or infinite values"
    last = result.stderr.strip().splitlines()[-3:]
    assert last[0] == f"1 trial(s) errored in {experiment}:"
    assert last[1] == (
        f"  erm seed 0: relif_ray.errors.UserError: {message} (error file: {error_file})"
    )
    assert last[2].endswith(f"sweeps/nyuv2.py {' '.join(flags)} --resume")
    assert error_file.read_text().count("Failure #") == 1  # ended at once, never retried
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(experiment)).trials
    assert [(t.status, t.run_metadata.num_failures) for t in trials] == [("ERROR", 1)]
    problems = analysis.load(experiment).problems
    assert list(problems["status"]) == ["errored"]
    assert message in problems["error"].iloc[0]


@pytest.mark.slow
def test_a_user_error_ends_an_optuna_trial_without_stopping_the_study(
    ray_session, nyuv2_copy, tmp_path
):
    """The Optuna searcher reads val_bias and worst from every result: the one result of a
    trial that hit a user error must carry them (NaN), or Tune would stop the whole run."""
    from ray.tune import ExperimentAnalysis

    from relif_ray.sweep.exit_status import TrialsErrored
    from relif_ray.sweep.plan import OptunaPlan
    from relif_ray.tuning.launch import run_sweep

    bad = nyuv2_copy / "train" / "depth" / "2.npy"
    np.save(bad, -np.ones((32, 40, 1), np.float32))
    plan = OptunaPlan(["relif"], [0], 1, (0.1, 0.4), (1e-4, 1e-2))
    base = tiny_config(nyuv2_copy, epochs=1)  # its ERM squash constants: no reference trial
    base["relif"] = {**base["relif"], "warmup_steps": 1}
    space = plan.space(ExperimentConfig.from_dict(base), 0.2)
    with pytest.raises(TrialsErrored) as raised:
        run_sweep(in_code(space, "optuna", tmp_path, search=plan), verbose=0)
    [trial] = raised.value.trials
    assert (trial.label, trial.seed) == ("relif", 0)
    assert trial.error.endswith(f"{bad}: depth contains negative values (min -1)")
    states = ExperimentAnalysis(str(tmp_path / "optuna")).trials
    assert [(t.status, t.run_metadata.num_failures) for t in states] == [("ERROR", 1)]
