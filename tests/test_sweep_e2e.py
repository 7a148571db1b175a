"""End to end through the real CLIs: sweep on local Ray -> analysis.load -> relif report."""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from relif_ray import analysis
from relif_ray.cli import main as relif  # the `relif` console script, in this process
from relif_ray.tuning import LOOPBACK_SWITCH
from tests.conftest import HANG_GUARD_S
from tests.local_cluster import LOCALHOST, listening_addresses

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def assert_one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert fragment in lines[0]


@dataclass(frozen=True)
class DemoSweep:
    experiment: Path
    listening: set[str]
    """Every address that the driver and the local Ray it started listened on while it ran."""
    output: str
    """What the driver printed (stdout, then stderr)."""
    workers: dict[int, str]
    """The Ray worker processes (Python, started by the raylet) seen while it ran: pid -> the
    last command line seen."""


def ray_workers(driver: psutil.Process) -> dict[int, str]:
    """Ray's Python worker processes among the driver's descendants: idle (`ray::IDLE`), with
    an actor (`ray::<class>...`) or still starting (`default_worker.py`)."""
    workers = {}
    for process in driver.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = process.cmdline()
            command = " ".join(argv).strip()
            actor_or_idle = command.startswith("ray::") and "Agent" not in command
            if actor_or_idle or argv[1:2] and argv[1].endswith("default_worker.py"):
                workers[process.pid] = command
    return workers


@pytest.fixture(scope="module")
def demo_sweep(nyuv2_dir, sweep_folder: Path) -> DemoSweep:
    """A sweep through sweeps/nyuv2.py on the local Ray that the driver starts itself, in an
    environment without the tests' loopback switch (conftest.py): the driver's own default.
    Its learning rate halves after the first of its two epochs (`train.scheduler` by --set).
    Short epochs (4 steps) and one checkpoint kept per trial, as a user's first sweep."""
    storage = sweep_folder / "results"
    command = [
        *("sweeps/nyuv2.py", "--data-dir", str(nyuv2_dir), "--methods", "erm", "--seeds", "2"),
        *("--epochs", "2", "--backbone", "resnet18", "--batch-size", "6", "--lr", "1e-3"),
        *("--storage", str(storage), "--name", "tiny", "--num-cpus", "2"),
        *("--set", "train.scheduler=step", "--set", "train.scheduler_step_size=1"),
        *("--keep-checkpoints", "1"),
    ]
    env = {name: value for name, value in os.environ.items() if name != LOOPBACK_SWITCH}
    listening: set[str] = set()
    workers: dict[int, str] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        driver = subprocess.Popen(
            [sys.executable, *command], cwd=REPO, env=env, stdout=out, stderr=err, text=True
        )
        process = psutil.Process(driver.pid)
        try:
            while driver.poll() is None:
                with contextlib.suppress(psutil.Error):
                    listening |= set(listening_addresses(process))
                    workers |= ray_workers(process)
                time.sleep(0.5)
        finally:
            if driver.poll() is None:
                driver.kill()
            driver.wait(timeout=HANG_GUARD_S)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert driver.returncode == 0, stderr[-3000:]
    assert f"experiment directory: {storage / 'tiny'}" in stdout
    return DemoSweep(storage / "tiny", listening, stdout + stderr, workers)


@pytest.fixture(scope="module")
def experiment(demo_sweep) -> Path:
    return demo_sweep.experiment


@pytest.mark.slow
def test_the_sweep_drivers_local_ray_stays_on_loopback(demo_sweep):
    """The driver starts local Ray bound to 127.0.0.1 (`keep_local_ray_on_loopback`): every
    socket listens there, and Tune records the trials' node as 127.0.0.1."""
    assert demo_sweep.listening == {LOCALHOST}
    for result in demo_sweep.experiment.glob("*/result.json"):
        records = [json.loads(line) for line in result.read_text().splitlines() if line]
        assert {record["node_ip"] for record in records} == {LOCALHOST}


@pytest.mark.slow
def test_the_local_ray_starts_one_worker_per_concurrent_trial(demo_sweep):
    """Its 2 trials run at once, each in a worker of its own, and Ray starts no idle worker
    beside them (it used to prestart one per CPU: `LOCAL_RAY_SYSTEM_CONFIG`)."""
    assert len(demo_sweep.workers) == 2, demo_sweep.workers


@pytest.mark.slow
def test_a_sweep_of_short_epochs_prints_no_snapshot_or_sync_warnings(demo_sweep):
    """With one checkpoint kept, each checkpoint makes Tune snapshot the experiment state;
    epochs of a second used to make it warn about snapshotting and checkpoint syncs."""
    for warning in (
        "Experiment state snapshotting has been triggered multiple times",
        "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S",
        "TUNE_WARN_SLOW_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S",
        "Last sync command failed",
    ):
        assert warning not in demo_sweep.output
    assert "experiment directory:" in demo_sweep.output  # the output was captured


@pytest.mark.slow
def test_sweep_outputs_load_offline(experiment):
    loaded = analysis.load(experiment)
    trials = loaded.trials
    assert sorted(trials["seed"]) == [0, 1] and set(trials["label"]) == {"erm"}
    assert loaded.problems.empty
    assert (trials["steps"] == 2 * (24 // 6)).all()
    assert {"val_worst", "val_macro", "val_seg_miou", "val_depth_rmse"} <= set(trials.columns)
    scores = loaded.scores
    assert set(scores["split"]) == {"val"} and set(scores["task"]) == {"seg", "depth", "normal"}
    assert len(scores) == 2 * 3 * 12
    assert len(loaded.traces) == 2 * 8
    ids, matrix = loaded.representations(trials["trial"].iloc[0])
    assert matrix.shape == (12, 512) and sorted(ids.tolist()) == list(range(12))
    config = trials["config"].iloc[0]
    assert config["model"]["backbone"] == "resnet18" and config["train"]["epochs"] == 2


@pytest.mark.slow
def test_the_schedule_is_in_the_trial_config_tunes_config_and_the_trace(experiment):
    """--set train.scheduler: trial.json's config, Tune's flat config (params.json) and the
    rate of each step (the trace's lr: 1e-3 for the first epoch's 4 steps, then x 0.5)."""
    loaded = analysis.load(experiment)
    for row in loaded.trials.itertuples():
        train = row.config["train"]
        assert (train["scheduler"], train["scheduler_step_size"]) == ("step", 1)
        assert train["scheduler_gamma"] == 0.5  # the default
        params = json.loads((Path(row.path).parents[1] / "params.json").read_text())
        assert params["train.scheduler"] == "step" and params["train.scheduler_step_size"] == 1
        lr = loaded.trace(row.trial)["lr"].tolist()
        assert lr == pytest.approx([1e-3] * 4 + [5e-4] * 4, rel=1e-6)


@pytest.mark.slow
def test_trials_of_the_same_seed_reproduce_a_direct_engine_run(experiment):
    """A trial run by Ray Tune gives exactly the numbers of the same config run in-process
    (with the trial's one CPU thread: float reductions depend on the thread count)."""
    import torch

    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    loaded = analysis.load(experiment)
    row = loaded.trials.sort_values("seed").iloc[0]
    assert torch.get_num_threads() == 1  # set in conftest.py, as in a 1-CPU trial
    run = TrainingRun(ExperimentConfig.from_dict(row["config"]))
    while not run.finished:
        run.train_epoch()
    metrics = run.evaluate("val").metrics
    for name, value in metrics.items():
        assert row[f"val_{name}"] == pytest.approx(value, rel=1e-6, abs=1e-9), name


@pytest.mark.slow
def test_report_writes_utility_tables(experiment, tmp_path, capsys):
    assert relif(["report", str(experiment), "--out", str(tmp_path)]) == 0
    report = Path(capsys.readouterr().out.strip())
    assert report == tmp_path / "report.md" and report.exists()
    table = (tmp_path / "tables" / "utility.csv").read_text().splitlines()
    assert table[0].startswith("label,n_seeds,worst_mean,worst_std,macro_mean")
    assert table[1].startswith("erm,2,")
    loaded = analysis.load(experiment)
    worst = loaded.trials["val_worst"]
    mean_cell = f"{worst.mean():.4f} ± {worst.std(ddof=1):.4f}"
    assert mean_cell in (tmp_path / "tables" / "utility.md").read_text()
    settings = "| ERM | adam | 0.001 | 1e-05 | 6 | 2 | - | step (x 0.5 every 1 epochs) | 8 |"
    assert settings in report.read_text()


def test_the_sweep_script_rejects_a_bad_flag_before_starting_ray(tmp_path):
    args = ["--methods", "erm", "--data-dir", "/no/such/dir", "--storage", str(tmp_path)]
    result = run_cli("sweeps/nyuv2.py", *args)
    assert_one_line_error(result, "--data-dir: no such directory")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--methods", "erm"], "--data-dir is required"),
        (["--demo", "--methods", "nosuch"], "unknown method 'nosuch'"),
        (["--demo", "--seeds", "0"], "--seeds"),
        (["--demo", "--gpus-per-trial", "1"], "--gpus-per-trial"),
        (["--demo", "--r-star", "x"], "--r-star"),
        (["--demo", "--lr", "-1"], "train.lr"),
    ],
)
def test_sweep_rejects_bad_flags_before_starting_ray(args, fragment, tmp_path, capsys, no_sweep):
    """What the script above calls (`sweep_cli.main`), in this process."""
    from relif_ray.cli.sweep import main

    status = main(datasets=("nyuv2",), argv=[*args, "--storage", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and fragment in err[0], err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_report_on_a_missing_directory_is_a_one_line_error(tmp_path):
    result = run_cli("-m", "relif_ray.cli", "report", str(tmp_path / "nope"), "--out", "x")
    assert_one_line_error(result, "experiment directory not found")


def test_report_lists_errored_trials(tmp_path):
    trial = tmp_path / "exp" / "ReLiFTrainable_00000"
    trial.mkdir(parents=True)
    (trial / "params.json").write_text(json.dumps({"seed": 0}))
    (trial / "error.txt").write_text("Traceback ...\nRuntimeError: boom\n")
    loaded = analysis.load(tmp_path / "exp")
    assert loaded.trials.empty
    assert loaded.problems["status"].tolist() == ["errored"]
    assert relif(["report", str(tmp_path / "exp"), "--out", str(tmp_path)]) == 0
    assert "RuntimeError: boom" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_demo_sweep_and_report_end_to_end(tmp_path):
    """The Quickstart's main job, shortened to one epoch and one seed."""
    storage = tmp_path / "results"
    demo = run_cli(
        "sweeps/nyuv2.py", "--demo", "--epochs", "1", "--seeds", "1", "--storage", str(storage)
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    experiment = storage / "nyuv2-demo"
    assert (storage / "data" / "nyuv2-demo" / "train" / "image" / "0.npy").exists()
    loaded = analysis.load(experiment)
    assert sorted(loaded.trials["label"]) == ["erm", "relif"]
    relif_trace = loaded.traces[loaded.traces["trial"].isin(loaded.trials.query("relif")["trial"])]
    assert {"lambda", "r", "r_ema", "tau", "kappa", "loss_lip"} <= set(relif_trace.columns)
    report = run_cli("-m", "relif_ray.cli", "report", str(experiment), "--out", str(tmp_path / "r"))
    assert report.returncode == 0, report.stderr
    assert Path(report.stdout.strip()).read_text().startswith("# relif-ray report")


@pytest.mark.slow
def test_export_copies_only_what_the_report_reads(experiment, tmp_path, capsys):
    """`relif export` leaves out every checkpoint state, and `relif report` on the copy writes
    the same tables as on the original."""
    copy = tmp_path / "copy"
    assert relif(["export", str(experiment), str(copy)]) == 0
    assert capsys.readouterr().out.startswith("exported 2 trial(s) (2 with outputs): ")
    assert list(experiment.rglob("state.pt")) and not list(copy.rglob("state.pt"))
    constants = "squash_constants.json"  # what ReLiF trained on and the audit squashes with
    assert (copy / constants).read_bytes() == (experiment / constants).read_bytes()
    size = {root: sum(p.stat().st_size for p in root.rglob("*")) for root in (experiment, copy)}
    assert size[copy] * 100 < size[experiment]
    reports = {}
    for name, root in (("original", experiment), ("copy", copy)):
        out = tmp_path / f"report-{name}"
        assert relif(["report", str(root), "--out", str(out)]) == 0
        reports[name] = {
            str(path.relative_to(out)): path.read_bytes()
            for path in sorted(out.rglob("*"))
            if path.is_file() and path.name != "report.md"
        }
    assert "tables/main.csv" in reports["original"] and "tables/utility.csv" in reports["original"]
    assert reports["copy"] == reports["original"]
