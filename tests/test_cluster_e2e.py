"""A lost node and a lost driver cost nothing: real sweeps through the sweep CLI (`--address`)
on a real multi-node Ray cluster on this machine (a head and two 1-CPU worker nodes, all bound
to 127.0.0.1; `tests/local_cluster.py`), with the experiment in storage every node sees.

Each sweep is the cluster command of docs/cluster.md as written (`--address auto`, which finds
this cluster through RAY_ADDRESS), with its data, storage and name replaced, its GPU flags
dropped (this machine has none) and a tiny budget added: 2 ERM trials (seeds 0 and 1) of 4
epochs x 2 steps, one per worker node. The numbers every trial ends with are compared with the
same configs trained in this process without interruption, field by field and step by step."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pandas as pd
import pytest
import torch

from relif_ray import analysis
from relif_ray.cli import main as relif_main
from relif_ray.cli.sweep import NYUV2, main
from relif_ray.experiment.outputs import read_trial_info
from tests.conftest import HANG_GUARD_S, TINY_DATA
from tests.recipes import CLUSTER_SWEEP, documented_command, script_argv, with_flags
from tests.test_sweeps import trial_records

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 4
STEPS_PER_EPOCH = 2
LOOPBACK = "127.0.0.1"
T = TypeVar("T")


@dataclass
class LocalCluster:
    """The `tests.local_cluster` process and the drivers' environment, which names its head."""

    process: subprocess.Popen
    env: dict[str, str]

    def command(self, line: str) -> str:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAY_TMPDIR": ray_tmp,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # "this node" is 127.0.0.1 (local_cluster.py)
        "RAY_USAGE_STATS_ENABLED": "0",
        "TUNE_GLOBAL_CHECKPOINT_S": "0",  # the experiment state is saved on every loop step
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.local_cluster", "2"],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        info = json.loads(process.stdout.readline())
        # `--address auto` of the documented command finds this cluster through RAY_ADDRESS
        yield LocalCluster(process, {**env, "RAY_ADDRESS": info["address"]})
    finally:
        process.stdin.close()  # the helper shuts every node down
        try:
            process.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """12 train / 6 val images of 32x40: with batch 6 an epoch is 2 steps."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    sizes = {**TINY_DATA, "train": 12, "val": 6}
    return write_synthetic_nyuv2(tmp_path_factory.mktemp("cluster") / "data", seed=0, **sizes)


def sweep_argv(data: Path, storage: Path, name: str) -> list[str]:
    """The documented cluster sweep on this cluster (see the module docstring)."""
    documented = script_argv(documented_command("docs/cluster.md", CLUSTER_SWEEP))
    places = {"--data-dir": str(data), "--storage": str(storage), "--name": name}
    places["--pretrained"] = "none"  # random weights for the ImageNet ones: tests download nothing
    argv = with_flags(documented, places, drop=("--num-gpus", "--gpus-per-trial"))
    budget = {
        "--methods": "erm", "--seeds": 2, "--epochs": EPOCHS, "--backbone": "resnet18",
        "--batch-size": 6, "--lr": 1e-3, "--keep-checkpoints": 1,
        "--checkpoint-interval": 0,  # a checkpoint every epoch: the kills land between them
    }  # fmt: skip
    return argv + [str(item) for flag, value in budget.items() for item in (flag, value)]


def start_driver(cluster: LocalCluster, argv: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, "sweeps/nyuv2.py", *argv],
            cwd=REPO,
            env=cluster.env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


CHECKPOINT_MARKER = b"checkpoint_0000".hex()
"""A checkpoint folder's name as it appears, in hex, in a trial's pickled checkpoint manager."""


def has_checkpoint(meta: dict) -> bool:
    return CHECKPOINT_MARKER in meta["checkpoint_manager"]["value"]


def trial_states(experiment: Path) -> list[tuple[str, bool, int]]:
    """(status, has a checkpoint, failures) of every trial in Tune's latest experiment state."""
    return [
        (state["status"], has_checkpoint(meta), meta["num_failures"])
        for state, meta in trial_records(experiment)
    ]


def checkpointed_trials(experiment: Path) -> dict[str, bool]:
    """trial id -> whether Tune's latest experiment state records a checkpoint of it."""
    return {state["trial_id"]: has_checkpoint(meta) for state, meta in trial_records(experiment)}


def wait_for(condition: Callable[[], T], driver: subprocess.Popen, what: str) -> T:
    """The first true value of `condition`, polled while the driver runs."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not (value := condition()):
        assert driver.poll() is None, f"the sweep ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def running_with_a_checkpoint(experiment: Path) -> int | None:
    """The process of a trial that runs and has a checkpoint while the other trial has not
    finished; None until there is one. Not both trials with a checkpoint: the two trial
    workers can start seconds apart on a loaded machine, longer than a trial of a few short
    epochs takes, and one trial could end before the other wrote its first checkpoint."""
    records = trial_records(experiment)
    if len(records) != 2 or any(state["status"] == "TERMINATED" for state, _ in records):
        return None
    for state, meta in records:
        if state["status"] == "RUNNING" and has_checkpoint(meta):
            return meta["last_result"]["pid"]
    return None


def trained_here(argv: list[str], data: Path) -> dict[int, tuple[dict, dict, pd.DataFrame]]:
    """seed -> (config, val metrics, trace) of each ERM trial of the sweep `argv`, trained here
    in one go, with the trial's one CPU thread (float reductions depend on the thread count)."""
    from relif_ray.cli.sweep import base_config, build_parser, parse_seeds
    from relif_ray.engine import TrainingRun
    from relif_ray.sweep.labels import variant
    from relif_ray.sweep.trial_config import TrialSpec

    args = build_parser(NYUV2).parse_args(argv)
    base = base_config(args, NYUV2, str(data))
    assert torch.get_num_threads() == 1  # set in conftest.py, as in a 1-CPU trial
    runs = {}
    for seed in parse_seeds(args.seeds):
        config = TrialSpec.of(variant("erm"), seed).config(base)
        run = TrainingRun(config)
        while not run.finished:
            run.train_epoch()
        runs[seed] = (config.to_dict(), run.evaluate("val").metrics, pd.DataFrame(run.trace))
    return runs


@pytest.fixture(scope="module")
def uninterrupted(data) -> dict[int, tuple[dict, dict, pd.DataFrame]]:
    return trained_here(sweep_argv(data, Path("unused"), "x"), data)


def assert_uninterrupted_numbers(experiment: Path, uninterrupted) -> analysis.Experiment:
    loaded = analysis.load(experiment)
    assert sorted(loaded.trials["seed"]) == sorted(uninterrupted) and loaded.problems.empty
    for _, row in loaded.trials.iterrows():
        config, metrics, trace = uninterrupted[row["seed"]]
        assert row["config"] == config
        for name, value in metrics.items():
            assert row[f"val_{name}"] == value, (row["seed"], name)
        stored = loaded.trace(row["trial"]).drop(columns="trial")
        pd.testing.assert_frame_equal(stored[trace.columns], trace, check_exact=True)
        assert len(list(Path(row["path"]).parents[1].glob("checkpoint_*"))) == 1
    return loaded


def test_a_lost_worker_node_costs_nothing(
    cluster, data, tmp_path, uninterrupted, capsys, monkeypatch
):
    """A worker node dies mid-sweep: its trial restarts from its last checkpoint on the other
    node and both trials end with the numbers of an uninterrupted run. Meanwhile a second sweep
    of the same name is refused, and `relif report` reads only the finished trial."""
    experiment = tmp_path / "lost-node"
    log = tmp_path / "lost-node.log"
    driver = start_driver(cluster, sweep_argv(data, tmp_path, "lost-node"), log)
    try:
        pid = wait_for(lambda: running_with_a_checkpoint(experiment), driver, "a checkpoint")
        assert cluster.command(f"kill-node-of {pid}") == "killed"

        monkeypatch.setattr(sys, "argv", ["nyuv2.py"])
        argv = ["--demo", "--storage", str(tmp_path), "--name", "lost-node"]
        assert main(datasets=("nyuv2",), argv=argv) == 2
        refused = capsys.readouterr().err.strip().splitlines()
        assert len(refused) == 1 and f"in use by a running sweep (pid {driver.pid} on" in refused[0]

        wait_for(
            lambda: [s for s, _, _ in trial_states(experiment)].count("TERMINATED") == 1,
            driver,
            "the first trial to finish",
        )
        out = tmp_path / "report-running"
        report = ["report", str(experiment), "--out", str(out), "--no-figures", "--n-boot", "0"]
        assert relif_main(report) == 0
        note = capsys.readouterr().err.strip()
        named = re.fullmatch(
            r"relif: note: A sweep is still running: 1 trial\(s\) still running \((\S+)\), "
            r"not in this report; it covers the 1 finished trial\(s\)",
            note,
        )
        assert named and (experiment / named.group(1)).is_dir(), note
        finished = pd.read_csv(out / "per_trial.csv", dtype={"trial": str})
        assert len(finished) == 1 and not named.group(1).endswith(finished["trial"][0])
        assert driver.wait(timeout=HANG_GUARD_S) == 0, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    rows = trial_states(experiment)
    assert sorted(rows) == [("TERMINATED", True, 0), ("TERMINATED", True, 1)]
    loaded = assert_uninterrupted_numbers(experiment, uninterrupted)
    restored = [read_trial_info(p)["restored_from_checkpoint"] for p in loaded.outputs.values()]
    assert sorted(restored) == [False, True]
    listening = set(json.loads(cluster.command("listening")))
    assert listening == {LOOPBACK}  # every node process listens on the loopback address only


def test_a_killed_driver_on_the_cluster_resumes_with_identical_numbers(
    cluster, data, tmp_path, uninterrupted
):
    assert len(cluster.command("add")) == 56  # a fresh worker replaces the lost one
    argv = sweep_argv(data, tmp_path, "driver-killed")
    experiment = tmp_path / "driver-killed"
    log = tmp_path / "driver-killed.log"
    driver = start_driver(cluster, argv, log)
    try:
        wait_for(lambda: running_with_a_checkpoint(experiment), driver, "a checkpoint")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    checkpointed = checkpointed_trials(experiment)  # the dead driver's last word
    resumed = subprocess.run(
        [sys.executable, "sweeps/nyuv2.py", *argv, "--resume"],
        cwd=REPO,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    (tmp_path / "resumed.log").write_text(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [s for s, _, _ in trial_states(experiment)] == ["TERMINATED"] * 2
    loaded = assert_uninterrupted_numbers(experiment, uninterrupted)
    restored = {
        trial: read_trial_info(outputs)["restored_from_checkpoint"]
        for trial, outputs in loaded.outputs.items()
    }
    assert restored == checkpointed and any(restored.values())  # the rest started over
