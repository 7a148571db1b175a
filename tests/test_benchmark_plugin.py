"""Adding a benchmark is one module: docs/examples/my_benchmark.py, copied to a folder of its
own named by RELIF_PROBLEMS_PATH, is found by `relif make-data`, by the trial processes of a
real Ray sweep (`sweeps/run.py`) and by `relif report`, through the discovery path of the
built-in benchmarks. The test registers nothing: the module defines `BENCHMARK`, as nyuv2.py
does. The same sweep runs the plug-in method of docs/examples/my_method.py
(RELIF_METHODS_PATH).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relif_ray import analysis
from relif_ray.plugins import PLUGIN_PATHS
from tests.conftest import HANG_GUARD_S, ONE_TRIAL_AT_A_TIME

REPO = Path(__file__).resolve().parents[1]

EXAMPLE = REPO / "docs" / "examples" / "my_benchmark.py"
"""The complete plug-in benchmark of the docs (dataset `toy`), used as it is."""


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("plugins")
    shutil.copy(EXAMPLE, folder)  # as its docstring says: a directory of its own
    methods = tmp_path_factory.mktemp("methods")
    shutil.copy(REPO / "docs" / "examples" / "my_method.py", methods)
    return {
        **os.environ,
        "RELIF_PROBLEMS_PATH": str(folder),
        "RELIF_METHODS_PATH": str(methods),
        "PYTHONPATH": str(REPO),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray on the loopback address only (Ray's switch for single-machine clusters), and
        # without the token of ~/.ray/auth_token, which other local clusters may rewrite.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
    }


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


@pytest.mark.slow
def test_make_data_finds_the_plugin(
    plugin_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Found through the path given; without it (`relif make-data` in this process, whose
    environment names no plug-in folder), not found."""
    from relif_ray.cli import main

    result = run(plugin_env, "-m", "relif_ray.cli", "make-data", "toy", "--out",
                 str(tmp_path / "toy"), "--examples", "12")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "toy").iterdir())[:2] == ["test_x.npy", "test_y.npy"]
    monkeypatch.delenv("RELIF_PROBLEMS_PATH", raising=False)
    assert main(["make-data", "toy", "--out", str(tmp_path / "x")]) == 2
    assert "invalid choice: 'toy'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


HEAD = (
    "import ray, sys; "
    "ray.init(num_cpus=2, include_dashboard=False, "
    "_system_config={'prestart_worker_first_driver': False}); "
    "print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read()"
)
"""A local Ray head on 127.0.0.1 that lives until its stdin closes. It prestarts no idle
workers for its own driver, which runs no task (2 processes of CPU for nothing on 2 cores)."""


@pytest.fixture
def bare_cluster(plugin_env: dict[str, str]):
    """A Ray cluster started WITHOUT RELIF_PROBLEMS_PATH and RELIF_METHODS_PATH: its workers
    inherit no plug-in path."""
    env = {key: value for key, value in plugin_env.items() if key not in PLUGIN_PATHS}
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        yield head.stdout.readline().strip()
    finally:
        head.stdin.close()
        head.wait(timeout=HANG_GUARD_S)


@pytest.mark.slow
def test_sweep_trials_and_report_find_the_plugin(
    plugin_env: dict[str, str], bare_cluster: str, tmp_path: Path
) -> None:
    """The sweep joins a cluster whose workers were started without the plug-in paths: its
    trials find the toy module and the `gls` method only because the driver passes the paths
    on to them."""
    sweep = run(
        plugin_env, "sweeps/run.py", "--dataset", "toy", "--demo", "--methods",
        "erm,relif,gls+relif", "--storage", str(tmp_path), "--address", bare_cluster,
        *ONE_TRIAL_AT_A_TIME,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "delta_ref = 0.1" in sweep.stdout
    experiment = tmp_path / "toy-demo"
    loaded = analysis.load(experiment)
    trials = loaded.trials
    assert sorted(trials["label"]) == ["erm", "gls+relif", "relif"]  # all loaded the toy problem
    gls_trial = trials.loc[trials["label"] == "gls+relif", "trial"].item()
    gls = loaded.traces[loaded.traces["trial"] == gls_trial]
    left, right = gls["loss_left"], gls["loss_right"]  # the weights of the geometric mean
    expected = (left * right) ** 0.5 / (2 * left)
    assert gls["weight_left"].to_numpy() == pytest.approx(expected.to_numpy(), rel=1e-4)
    out = tmp_path / "report"
    report = run(plugin_env, "-m", "relif_ray.cli", "report", str(experiment), "--out", str(out))
    assert report.returncode == 0, report.stderr[-3000:]
    text = (out / "report.md").read_text()
    assert "Finished trials: 3 (data set: toy)" in text
    assert json.loads((out / "delta_ref.json").read_text())["deltas"][0]["value"] == 0.1
    header = (out / "tables" / "utility.csv").read_text().splitlines()[0]
    assert "left_accuracy_mean" in header and "right_accuracy_mean" in header
    markdown = (out / "tables" / "utility.md").read_text()
    assert "Left accuracy ↑" in markdown  # the direction the toy metric declares


def test_workers_get_the_plugin_directories_as_absolute_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Trials run in their own folders, so a relative directory is resolved by the driver;
    the benchmark and the method plug-in paths travel alike."""
    from relif_ray.plugins import METHODS_PATH, PROBLEMS_PATH, worker_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PROBLEMS_PATH, f"plugins{os.pathsep}{os.pathsep}/opt/more")
    monkeypatch.delenv(METHODS_PATH, raising=False)
    assert worker_env() == {PROBLEMS_PATH: f"{tmp_path / 'plugins'}{os.pathsep}/opt/more"}
    monkeypatch.setenv(METHODS_PATH, "methods")
    assert worker_env()[METHODS_PATH] == str(tmp_path / "methods")
    monkeypatch.delenv(PROBLEMS_PATH)
    monkeypatch.delenv(METHODS_PATH)
    assert worker_env() == {}
