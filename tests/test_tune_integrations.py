"""Ray Tune's own tools through the real sweep entry point: the resolved config Tune stores,
trial names, ASHA (never stopping ERM reference trials; a stopped trial's outputs and status),
the controller's state in every epoch's result, TensorBoard, and the W&B (offline) and MLflow
(file store) logger callbacks read back run by run."""

from __future__ import annotations

import json
import struct
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from relif_ray import analysis
from relif_ray.cli.sweep import main
from relif_ray.sweep.plan import TuneOptions

EPOCHS = 2
SEEDS = 3


def test_asha_never_ranks_or_stops_erm_reference_trials():
    from ray.tune.schedulers import TrialScheduler

    from relif_ray.tuning.integrations import scheduler

    asha = scheduler(TuneOptions(scheduler="asha", scheduler_metric="worst", asha_max_epochs=9))
    trials = [
        SimpleNamespace(trial_id=f"{label}{seed}", config={"method.name": "erm", **relif})
        for seed in range(3)
        for label, relif in (("erm", {"relif.enabled": False}), ("relif", {"relif.enabled": True}))
    ]
    decisions = {}
    for rank, trial in enumerate(trials):  # each trial worse than every one before
        asha.on_trial_add(None, trial)
        result = {"training_iteration": 1, "worst": 1.0 - 0.1 * rank}
        decisions[trial.trial_id] = asha.on_trial_result(None, trial, result)
    assert {decisions[f"erm{seed}"] for seed in range(3)} == {TrialScheduler.CONTINUE}
    # ERM's results never enter the rungs: relif0 is the first one ranked, relif1 and relif2
    # are worse than it and stopped
    assert [decisions[f"relif{seed}"] for seed in range(3)] == [
        TrialScheduler.CONTINUE,
        TrialScheduler.STOP,
        TrialScheduler.STOP,
    ]
    for trial in trials:
        asha.on_trial_complete(None, trial, {"training_iteration": 1, "worst": 0.0})


def test_outputs_are_written_at_every_epoch_asha_may_stop_a_trial_at():
    from relif_ray.tuning.integrations import asha_rung_epochs

    options = TuneOptions(scheduler="asha", asha_max_epochs=10)
    assert asha_rung_epochs(options) == [1, 3, 9, 10]  # handed to every trial: test_tune_form


def read_tensorboard_scalars(trial_dir: Path) -> dict[str, list[float]]:
    """Tag -> values of the scalar summaries in a trial's TensorBoard event file (TFRecord:
    length, crc, Event protobuf, crc)."""
    from tensorboardX.proto.event_pb2 import Event

    values: dict[str, list[float]] = {}
    for path in trial_dir.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                values.setdefault(value.tag, []).append(value.simple_value)
    return values


def wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B run file: a 7-byte header, then 32 KiB blocks of chunks, each with
    a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) as in LevelDB's
    log format, which W&B's datastore uses."""
    data = path.read_bytes()
    block, position, records, pending = 32768, 7, [], b""
    while position + 7 <= len(data):
        left = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            position += left
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            records.append(pending)
            pending = b""
    return records


def read_wandb_offline_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(config, history rows) of one offline W&B run, read from its run file. The config
    passed to `wandb.init` is in the run record; later changes come as config records (which a
    run stopped early may never write)."""
    from wandb.proto import wandb_internal_pb2

    config, history = {}, []
    for data in wandb_records(next(run_dir.glob("*.wandb"))):
        record = wandb_internal_pb2.Record.FromString(data)
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
        elif kind == "history":
            items = record.history.item
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in items
                }
            )
    return config, history


WANDB_KEY = uuid.uuid4().hex + uuid.uuid4().hex[:8]
"""A W&B API key (40 characters) of this run."""


@pytest.fixture(scope="module")
def asha_sweep(ray_session, nyuv2_dir, sweep_folder: Path, monkeypatch_module) -> Path:
    """erm and relif x 3 seeds, 2 epochs (ASHA's rungs: 1 and the last), one trial at a time,
    ASHA on validation Worst, with W&B (offline) and MLflow (file store) logging, through the
    sweep entry point; SGD, so that a checkpoint holds no Adam moments. (Not on the live Bias:
    squashed with the ERM run's final q10/q90, an early ReLiF epoch's depth and normal scores all
    clip to one end, so its live Bias is 0 and ASHA sees ties.)"""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch_module.setenv("WANDB_MODE", "offline")
    monkeypatch_module.setenv("WANDB_DIR", str(sweep_folder))
    monkeypatch_module.setenv("WANDB_SILENT", "true")
    monkeypatch_module.setenv("WANDB_API_KEY", WANDB_KEY)  # offline: unused, and never written
    monkeypatch_module.setenv("MLFLOW_TRACKING_URI", (sweep_folder / "mlruns").as_uri())
    monkeypatch_module.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: opt in
    status = main(
        datasets=("nyuv2",),
        argv=[
            "--data-dir", str(nyuv2_dir), "--storage", str(sweep_folder), "--name", "asha",
            "--methods", "erm,relif", "--seeds", str(SEEDS), "--epochs", str(EPOCHS),
            "--backbone", "resnet18", "--batch-size", "12", "--warmup-steps", "1",
            "--set", "model.head_channels=16", "--set", "train.eval_batch_size=12",
            "--set", "train.optimizer=sgd", "--scheduler", "asha", "--scheduler-metric", "worst",
            "--max-concurrent-trials", "1", "--callbacks", "wandb,mlflow",
        ],
    )  # fmt: skip
    assert status == 0
    return sweep_folder


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.slow
def test_tune_stores_the_resolved_config_and_names_trials_by_label_and_seed(asha_sweep, nyuv2_dir):
    from ray.tune import ExperimentAnalysis

    from relif_ray.data.nyuv2 import train_count
    from relif_ray.relif.controller import scale_to_budget

    trials = ExperimentAnalysis(str(asha_sweep / "asha")).trials
    assert len(trials) == 2 * SEEDS
    names = sorted(str(trial) for trial in trials)
    eta, _ = scale_to_budget(EPOCHS * (train_count(nyuv2_dir) // 12))  # the budget rule's
    expected = [f"erm_seed{s}" for s in range(SEEDS)]
    expected += [f"relif_r0.24_eta{eta:g}_seed{s}" for s in range(SEEDS)]
    assert names == sorted(expected)
    for trial in trials:
        config = trial.config
        assert config["seed"] == int(str(trial)[-1])
        assert config["relif.enabled"] == (config["label"] == "relif")
        assert config["method.name"] == "erm" and config["model.head_channels"] == 16
        assert Path(trial.path).name.startswith(str(trial) + "_")


@pytest.mark.slow
def test_asha_stops_only_relif_trials_and_stopped_trials_have_outputs(asha_sweep, tmp_path):
    experiment = analysis.load(asha_sweep / "asha")
    trials = experiment.trials
    assert experiment.problems.empty and len(trials) == 2 * SEEDS  # every trial has outputs
    erm = trials[trials["label"] == "erm"]
    assert set(erm["status"]) == {"completed"} and set(erm["steps"]) == {2 * EPOCHS}
    stopped = trials[trials["status"] == "stopped"]
    assert len(stopped) >= 1 and set(stopped["label"]) == {"relif"}
    before_the_last = {2 * epoch for epoch in range(1, EPOCHS)}  # 2 steps an epoch
    assert set(stopped["steps"]) <= before_the_last  # stopped at a rung before the last epoch
    report = tmp_path / "report"
    from relif_ray.cli import main as relif_main

    report_flags = ["--out", str(report), "--no-figures", "--n-boot", "0"]  # reads only the text
    assert relif_main(["report", str(asha_sweep / "asha"), *report_flags]) == 0
    text = (report / "report.md").read_text()
    heading = "Stopped early by the Tune scheduler (ASHA), outputs at the epoch they stopped"
    assert f"{heading}: {len(stopped)}" in text


@pytest.mark.slow
def test_each_epoch_reports_the_controller_and_tensorboard_has_it(asha_sweep):
    experiment = analysis.load(asha_sweep / "asha")
    epochs = experiment.epochs
    traces = experiment.traces
    relif = experiment.trials[experiment.trials["label"] == "relif"]
    for trial, steps in zip(relif["trial"], relif["steps"], strict=True):
        rows = epochs[epochs["trial"] == trial]
        assert len(rows) == steps // 2
        trace = traces[traces["trial"] == trial]
        last = trace[trace["step"] % 2 == 1].reset_index(drop=True)  # each epoch's last step
        for key in ("lambda", "r_ema", "tau", "kappa", "loss_lip"):
            assert rows[key].tolist() == pytest.approx(last[key].tolist(), nan_ok=True), key
        trial_dir = Path(experiment.outputs[trial]).parents[1]
        scalars = read_tensorboard_scalars(trial_dir)
        assert scalars["ray/tune/lambda"] == pytest.approx(last["lambda"].tolist())


@pytest.mark.slow
def test_mlflow_and_wandb_have_one_run_per_trial_with_its_config_and_lambda(asha_sweep):
    import mlflow

    experiment = analysis.load(asha_sweep / "asha")
    epochs = experiment.epochs.set_index("trial")
    client = mlflow.MlflowClient((asha_sweep / "mlruns").as_uri())
    mlflow_experiment = client.get_experiment_by_name("asha")
    runs = client.search_runs([mlflow_experiment.experiment_id])
    assert len(runs) == 2 * SEEDS
    wandb_runs = sorted((asha_sweep / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 * SEEDS
    wandb_by_trial = {}
    for run_dir in wandb_runs:
        config, history = read_wandb_offline_run(run_dir)
        wandb_by_trial[config["trial_id"]] = (config, history)
    for run in runs:
        params = run.data.params
        trial = run.data.tags["trial_name"]
        row = experiment.trials[
            (experiment.trials["label"] == params["label"])
            & (experiment.trials["seed"] == int(params["seed"]))
        ].iloc[0]
        assert trial == run.info.run_name
        assert params["relif.enabled"] == str(row["relif"])
        lambdas = [m.value for m in client.get_metric_history(run.info.run_id, "lambda")]
        expected = epochs.loc[[row["trial"]], "lambda"].tolist()
        assert lambdas == pytest.approx(expected, nan_ok=True)
        config, history = wandb_by_trial[row["trial"]]
        assert config["relif.enabled"] == row["relif"] and config["seed"] == row["seed"]
        assert [h["lambda"] for h in history] == pytest.approx(expected, nan_ok=True)


@pytest.mark.slow
def test_the_wandb_key_is_in_no_file_of_the_ray_session_or_the_sweep(asha_sweep, ray_session):
    """Ray would hand the key to its logging actors in their runtime_env, which its runtime-env
    agent logs in the session folder (`relif_ray.tuning.integrations.wandb_callback`)."""
    session = Path(ray_session._private.worker._global_node.get_session_dir_path())
    files = [path for folder in (session, asha_sweep) for path in folder.rglob("*")]
    assert len([path for path in files if path.is_file()]) > 10
    holding = [
        str(path)
        for path in files
        if path.is_file() and not path.is_symlink() and WANDB_KEY.encode() in path.read_bytes()
    ]
    assert holding == []
