"""The experiment directory: one sweep at a time (an OS lock held by the driver), `relif report`
on an experiment that is still running, `relif export` (only what analysis reads), and the
documented size of a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.cli import main as relif_main
from relif_ray.cli.sweep import main
from relif_ray.errors import UserError
from relif_ray.experiment.export import export_experiment
from relif_ray.experiment.lock import (
    LOCK_FILE,
    exclusive_experiment,
    prepare_new_experiment,
    running_sweep,
)
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.conftest import BUCKET

REPO = Path(__file__).resolve().parents[1]

HOLD_LOCK = """
import sys, time
from relif_ray.experiment.lock import exclusive_experiment
with exclusive_experiment(sys.argv[1], sys.argv[2]):
    print("locked", flush=True)
    time.sleep(600)
"""


def hold_lock(storage: Path, name: str) -> subprocess.Popen:
    """Another process holding the experiment's lock, as a running sweep driver does."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(storage), name],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.fixture
def locked(tmp_path) -> Iterator[tuple[Path, subprocess.Popen]]:
    """An experiment `exp` with Tune's trial list and one finished-looking file in it, locked
    by another process."""
    experiment = tmp_path / "exp"
    (experiment / "ReLiFTrainable_00000").mkdir(parents=True)
    (experiment / "ReLiFTrainable_00000" / "params.json").write_text("{}")
    (experiment / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": []}')
    holder = hold_lock(tmp_path, "exp")
    yield experiment, holder
    holder.kill()
    holder.wait()


@pytest.mark.parametrize("mode", [[], ["--demo"], ["--resume"]], ids=["new", "demo", "resume"])
def test_a_second_sweep_on_a_running_experiment_is_refused_in_one_line(
    mode, locked, nyuv2_dir, capsys, monkeypatch
):
    import relif_ray.tuning.launch

    def refuse(*args, **kwargs):
        raise AssertionError("a second sweep would start")

    monkeypatch.setattr(relif_ray.tuning.launch, "run_sweep", refuse)
    experiment, holder = locked
    data = [] if mode == ["--demo"] else ["--data-dir", str(nyuv2_dir)]
    argv = [*data, *mode, "--storage", str(experiment.parent), "--name", "exp"]
    assert main(datasets=("nyuv2",), argv=["--methods", "erm", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (
        err[0]
        .split(": error: ", 1)[1]
        .startswith(
            f"--name: experiment {experiment} is in use by a running sweep "
            f"(pid {holder.pid} on {socket.gethostname()}, started "
        )
    ), err[0]
    assert err[0].endswith("); wait for it to end or use another --name")
    assert (experiment / "ReLiFTrainable_00000" / "params.json").exists()  # nothing deleted
    assert not (experiment.parent / "data").exists()  # --demo wrote no data either
    assert running_sweep(experiment).pid == holder.pid


@pytest.mark.parametrize("mode", [[], ["--resume"]], ids=["new", "resume"])
def test_a_file_uri_storage_is_locked_exactly_like_its_path(
    mode, locked, nyuv2_dir, capsys, monkeypatch
):
    """`--storage file:///...` names the same local directory as the plain path: a sweep
    there takes the same lock, so a second sweep or a `--resume` is refused in one line."""
    import relif_ray.tuning.launch

    def refuse(*args, **kwargs):
        raise AssertionError("a second sweep would start")

    monkeypatch.setattr(relif_ray.tuning.launch, "run_sweep", refuse)
    experiment, holder = locked
    uri = experiment.parent.as_uri()
    argv = ["--data-dir", str(nyuv2_dir), *mode, "--storage", uri, "--name", "exp"]
    assert main(datasets=("nyuv2",), argv=["--methods", "erm", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (
        f"--name: experiment {experiment} is in use by a running sweep (pid {holder.pid} "
        in (err[0])
    )
    assert running_sweep(experiment.as_uri()).pid == holder.pid


def test_the_lock_of_a_killed_driver_is_taken_over_at_once(tmp_path):
    holder = hold_lock(tmp_path, "exp")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    lock = tmp_path / "exp" / LOCK_FILE
    assert json.loads(lock.read_text())["pid"] == holder.pid  # left behind by the dead driver
    assert running_sweep(tmp_path / "exp") is None
    with exclusive_experiment(str(tmp_path), "exp"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        (tmp_path / "exp" / "trial").mkdir()
    assert not lock.exists() and (tmp_path / "exp" / "trial").is_dir()


def test_a_lock_that_guarded_nothing_leaves_no_directory(tmp_path):
    with exclusive_experiment(str(tmp_path), "exp"):
        assert (tmp_path / "exp" / LOCK_FILE).is_file()
    assert not any(tmp_path.iterdir())


def test_demo_replaces_only_its_own_unlocked_experiment(tmp_path):

    old = tmp_path / "exp" / "ReLiFTrainable_00000"
    old.mkdir(parents=True)
    with exclusive_experiment(str(tmp_path), "exp"):
        with pytest.raises(UserError, match="already exists"):
            prepare_new_experiment(str(tmp_path), "exp", replace=False)
        prepare_new_experiment(str(tmp_path), "exp", replace=True)
        assert [p.name for p in (tmp_path / "exp").iterdir()] == [LOCK_FILE]


@pytest.fixture
def synthetic_experiment(tmp_path) -> Path:
    return write_synthetic_experiment(
        tmp_path / "exp", labels=("erm", "relif"), seeds=2, n_examples=24, errored=1, incomplete=1
    )


def report(experiment: Path | str, out: Path, capsys) -> tuple[str, str]:
    flags = ["--out", str(out), "--no-figures", "--n-boot", "0"]  # no claim reads an interval
    status = relif_main(["report", str(experiment), *flags])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return captured.out, captured.err


def test_report_on_a_running_experiment_reads_finished_trials_and_counts_the_running(
    synthetic_experiment, tmp_path, capsys
):
    holder = hold_lock(tmp_path, "exp")
    try:
        out, err = report(synthetic_experiment, tmp_path / "running", capsys)
    finally:
        holder.kill()
        holder.wait()
    # the errored trial counts as running while its sweep may still retry it
    running = "ReLiFTrainable_00004_broken, ReLiFTrainable_00005_broken"
    note = f"2 trial(s) still running ({running}), not in this report; it covers the 4 finished "
    note += "trial(s)"
    assert err.strip() == f"relif: note: A sweep is still running: {note}"
    assert out.strip() == str(tmp_path / "running" / "report.md")
    text = (tmp_path / "running" / "report.md").read_text()
    assert note in text and text.count("- running: `") == 2
    assert "RuntimeError: synthetic 0" in text
    assert len(pd.read_csv(tmp_path / "running" / "per_trial.csv")) == 4

    out, err = report(synthetic_experiment, tmp_path / "stopped", capsys)  # lock released
    assert err == "" and "still running" not in (tmp_path / "stopped" / "report.md").read_text()
    text = (tmp_path / "stopped" / "report.md").read_text()
    assert "- incomplete: `" in text and "- errored: `" in text


def test_report_of_a_file_uri_sees_the_running_sweep_of_its_path(
    synthetic_experiment, tmp_path, capsys
):
    holder = hold_lock(tmp_path, "exp")
    try:
        _, err = report(synthetic_experiment.as_uri(), tmp_path / "running", capsys)
    finally:
        holder.kill()
        holder.wait()
    assert err.startswith("relif: note: A sweep is still running: 2 trial(s) still running")


def test_export_copies_what_analysis_reads_and_nothing_else(synthetic_experiment, tmp_path):
    source = synthetic_experiment
    for trial in source.glob("ReLiFTrainable_*[0-9]"):
        older = trial / "checkpoint_000000"
        newest = trial / "checkpoint_000001"
        older.rename(newest)
        older.mkdir()
        (older / "state.pt").write_bytes(b"\0" * 100_000)  # a kept older checkpoint
        (newest / "state.pt").write_bytes(b"\0" * 100_000)
    (source / "pareto.csv").write_text("study\nrelif/seed0\n")
    (source / "squash_constants.json").write_text('{"quantiles": [0.1, 0.9], "seeds": {}}')
    (source / "experiment_state-2026.json").write_text("{}")
    (source / LOCK_FILE).write_text("{}")

    summary = export_experiment(str(source), tmp_path / "copy")
    copy = tmp_path / "copy"
    assert (summary.trials, summary.finished) == (6, 4)
    files = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
    assert not [name for name in files if name.endswith("state.pt")]
    assert "pareto.csv" in files and "experiment_state-2026.json" not in files
    assert "squash_constants.json" in files
    assert LOCK_FILE not in files
    assert "ReLiFTrainable_00000/checkpoint_000001/outputs/scores.parquet" in files
    assert not (copy / "ReLiFTrainable_00000" / "checkpoint_000000").exists()
    assert summary.copied_bytes * 10 < summary.source_bytes

    original, copied = analysis.load(source), analysis.load(copy)
    columns = [c for c in original.trials.columns if c not in ("experiment", "path")]
    pd.testing.assert_frame_equal(original.trials[columns], copied.trials[columns])
    pd.testing.assert_frame_equal(original.scores, copied.scores)
    pd.testing.assert_frame_equal(original.traces, copied.traces)
    assert sorted(copied.problems["status"]) == ["errored", "incomplete"]


def test_outputs_still_being_copied_are_running_while_the_sweep_runs_and_damaged_after(
    synthetic_experiment, tmp_path, capsys
):
    """Tune copies a finished trial's checkpoint into storage file by file: trial.json can be
    there before a file it lists is whole. Such a trial is running while the sweep runs (report
    and export leave it out and name it) and damaged after (a warning; export stops). So is,
    while the sweep runs, the snapshot an ASHA rung wrote of a trial that Tune runs on."""
    trial = synthetic_experiment / "ReLiFTrainable_00003"  # relif, seed 1
    trace = trial / "checkpoint_000000" / "outputs" / "trace.parquet"  # read by the report last
    whole = trace.read_bytes()
    trace.write_bytes(whole[: len(whole) // 2])  # the copy is half way
    statuses = {"ReLiFTrainable_00002": "RUNNING", "ReLiFTrainable_00001": "TERMINATED"}
    trial_data = []
    for folder, status in statuses.items():  # both wrote their outputs at an ASHA rung
        record = synthetic_experiment / folder / "checkpoint_000000" / "outputs" / "trial.json"
        info = {**json.loads(record.read_text()), "status": "stopped"}
        record.write_text(json.dumps(info))
        trial_data.append([json.dumps({"trial_id": info["trial_id"], "status": status}), "{}"])
    state = synthetic_experiment / "experiment_state-2026-01-01_00-00-00.json"
    state.write_text(json.dumps({"trial_data": trial_data}))
    holder = hold_lock(tmp_path, "exp")
    try:
        _, err = report(synthetic_experiment, tmp_path / "running", capsys)
        assert relif_main(["export", str(synthetic_experiment), str(tmp_path / "copy")]) == 0
        captured = capsys.readouterr()
    finally:
        holder.kill()
        holder.wait()
    running = "ReLiFTrainable_00002, ReLiFTrainable_00003, ReLiFTrainable_00004_broken, "
    running += "ReLiFTrainable_00005_broken"
    note = f"relif: note: A sweep is still running: 4 trial(s) still running ({running})"
    assert err.strip() == f"{note}, not in this report; it covers the 2 finished trial(s)"
    assert len(pd.read_csv(tmp_path / "running" / "per_trial.csv")) == 2
    assert captured.err.strip() == f"{note}, not exported"
    assert captured.out.startswith("exported 2 trial(s) (2 with outputs): ")
    copied = sorted(p.name for p in (tmp_path / "copy").iterdir() if p.is_dir())
    assert copied == ["ReLiFTrainable_00000", "ReLiFTrainable_00001"]

    cut = f"{trace}: damaged file ({len(whole) // 2} of its {len(whole)} bytes)"
    _, err = report(synthetic_experiment, tmp_path / "stopped", capsys)  # the sweep has ended
    assert err.strip() == f"relif: warning: skipped trial ReLiFTrainable_00003: {cut}"
    assert relif_main(["export", str(synthetic_experiment), str(tmp_path / "copy2")]) == 2
    assert capsys.readouterr().err.strip() == f"relif: error: {cut}; nothing was exported"
    assert not (tmp_path / "copy2").exists()


def test_export_refuses_an_existing_destination_in_one_line(synthetic_experiment, tmp_path, capsys):
    (tmp_path / "copy").mkdir()
    assert relif_main(["export", str(synthetic_experiment), str(tmp_path / "copy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = f"DEST {tmp_path / 'copy'}: already exists (export writes a new folder)"
    assert err == [f"relif: error: {expected}"]
    assert relif_main(["export", str(tmp_path / "nope"), str(tmp_path / "c2")]) == 2
    assert "experiment directory not found" in capsys.readouterr().err
    assert not (tmp_path / "c2").exists() and not (tmp_path / "c2.partial").exists()


def test_the_documented_resnet50_checkpoint_size_is_the_models(nyuv2_dir):
    """docs/sweeps.md sizes a full NYUv2 sweep from the default model's parameter count and a
    measured `state.pt`: weights plus Adam's two moment estimates, all float32."""
    import io

    import torch

    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    config = {
        "data": {"dataset": "nyuv2", "root": str(nyuv2_dir)},
        "train": {"batch_size": 2, "max_steps": 1},  # the state, not the step, is measured
    }
    run = TrainingRun(ExperimentConfig.from_dict(config))
    assert run.config.model.backbone == "resnet50" and run.config.model.head_channels == 128
    parameters = sum(p.numel() for p in run.model.parameters())
    buffers = sum(b.numel() for b in run.model.buffers() if b.is_floating_point())
    run.train_steps(1)
    state = io.BytesIO()
    torch.save(run.state_dict(), state)
    size_mb = state.getbuffer().nbytes / 1e6
    assert 3 * parameters * 4 / 1e6 < size_mb < 3 * parameters * 4 / 1e6 + 1.0
    docs = " ".join((REPO / "docs" / "sweeps.md").read_text().split())
    assert f"{parameters:,} parameters and {buffers:,} BatchNorm buffer values" in docs
    assert f"measured at {size_mb:.1f} MB" in docs


def test_export_of_s3_equals_the_local_experiment(s3, tmp_path, capsys):
    """`relif export s3://...` (moto on 127.0.0.1) copies what the local original holds for
    analysis, and both load alike."""
    uri = f"s3://{BUCKET}/results/nyuv2"
    assert relif_main(["export", uri, str(tmp_path / "copy")]) == 0
    assert capsys.readouterr().out.startswith("exported 8 trial(s) (6 with outputs, 2 without): ")
    local = s3["local"] / "nyuv2"
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == sorted(str(p.relative_to(local)) for p in local.rglob("*"))
    original, copy = analysis.load(local), analysis.load(tmp_path / "copy")
    columns = [c for c in original.trials.columns if c not in ("experiment", "path")]
    pd.testing.assert_frame_equal(original.trials[columns], copy.trials[columns])
    pd.testing.assert_frame_equal(original.scores, copy.scores)
    assert copy.problems["error"].tolist() == original.problems["error"].tolist()


def test_a_csv_the_project_wrote_reads_back_float_for_float(tmp_path):
    """pandas writes each float as its shortest repr; its default parser reads some of them one
    unit in the last place off (0.09138622366765443 as 0.0913862236676544): the project's
    reader reads them exactly, so a value compared after the round trip is the one written."""
    from relif_ray.experiment import storage

    values = [0.09138622366765443, 0.1 + 0.2, 1 / 3, 2.0**-30, 123456.789e-300]
    pd.DataFrame({"x": values}).to_csv(tmp_path / "t.csv", index=False)
    assert storage.read_csv(tmp_path / "t.csv")["x"].tolist() == values
