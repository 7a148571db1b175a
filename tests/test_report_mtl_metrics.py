"""Delta-M%, hypervolumes and the training settings as `relif report` writes them, on a
generated experiment, against hand computations from the trials' own files and pymoo."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray import analysis
from relif_ray.analysis.report import ReportOptions
from relif_ray.analysis.tables import CISettings
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment

SPLIT = "test"
NATIVE = {  # the generated NYUv2 trials' Delta-M% metrics, grouped by task, with directions
    "seg": {"seg_miou": True, "seg_pixel_acc": True},
    "depth": {"depth_abs_err": False},
    "normal": {"normal_angle_mean": False},
}
"""seg_pixel_acc and depth_abs_err are added to the written trials, so that one task has two
metrics and the per-task mean (LibMTL's count_improvement) differs from the mean over all
metrics. Their depth RMSE, which LibMTL's tables do not average, stays out."""
SCHEDULES = {
    "relif": {"scheduler": "step", "scheduler_step_size": 2, "scheduler_gamma": 0.1},
    "pcgrad": {"scheduler": "cosine", "scheduler_min_lr": 1e-5},
}
"""Learning-rate schedules written into the trials' configs (ERM keeps the default, none)."""


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory) -> Path:
    root = write_synthetic_experiment(
        tmp_path_factory.mktemp("mtl") / "exp",
        labels=("erm", "pcgrad", "relif"),
        seeds=3,
        n_examples=20,
        splits=("val", "test"),
        trace_steps=10,
    )
    rng = np.random.default_rng(5)
    for path in root.glob("*/checkpoint_*/outputs/trial.json"):
        info = json.loads(path.read_text())
        for metrics in info["metrics"].values():
            metrics["seg_pixel_acc"] = float(rng.uniform(0.5, 0.9))
            metrics["depth_abs_err"] = float(rng.uniform(0.3, 0.6))
        info["config"]["train"].update(SCHEDULES.get(info["label"], {}))
        if info["label"] == "pcgrad" and info["seed"] == 2:
            info["config"]["train"]["lr"] = 3e-4
        path.write_text(json.dumps(info))
    return root


@pytest.fixture(scope="module")
def stored(experiment_dir) -> pd.DataFrame:
    """One row per trial straight from its trial.json: label, seed, the split's metrics."""
    rows = []
    for path in sorted(experiment_dir.glob("*/checkpoint_*/outputs/trial.json")):
        info = json.loads(path.read_text())
        rows.append({"label": info["label"], "seed": info["seed"], **info["metrics"][SPLIT]})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def report(experiment_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mtl-report")
    options = ReportOptions(
        settings=analysis.AuditSettings(pool_size=16, pairs=128),
        split=SPLIT,
        ci=CISettings(n_boot=0),
        figures=False,
    )
    analysis.write_report(analysis.load(experiment_dir), out, options)
    return out


def by_hand_delta_m(
    stored: pd.DataFrame, label: str, seed: int, native: dict | None = None
) -> float:
    """LibMTL's count_improvement, written out: per task the mean signed relative change of
    its metrics (`NATIVE`) against same-seed ERM, then the mean over tasks, x100."""
    trial = stored[(stored["label"] == label) & (stored["seed"] == seed)].iloc[0]
    erm = stored[(stored["label"] == "erm") & (stored["seed"] == seed)].iloc[0]
    per_task = []
    for metrics in (native or NATIVE).values():
        changes = [
            (1 if higher else -1) * (trial[m] - erm[m]) / erm[m] for m, higher in metrics.items()
        ]
        per_task.append(sum(changes) / len(changes))
    return 100 * sum(per_task) / len(per_task)


def test_utility_table_delta_m_is_libmtls_count_improvement_by_hand(report, stored):
    table = pd.read_csv(report / "tables" / "utility.csv").set_index("label")
    for label in ("pcgrad", "relif"):
        values = [by_hand_delta_m(stored, label, seed) for seed in range(3)]
        assert table.loc[label, "delta_m_mean"] == pytest.approx(np.mean(values), abs=1e-9)
        assert table.loc[label, "delta_m_std"] == pytest.approx(np.std(values, ddof=1), abs=1e-9)
    # averaging per task first matters here: the plain mean over the four metrics differs
    assert not np.isclose(by_hand_delta_m(stored, "relif", 0), _flat_mean(stored, "relif", 0))
    # and depth RMSE (in the table, not in Delta-M%) would change it
    with_rmse = by_hand_delta_m(stored, "relif", 0, {**NATIVE, "depth": {"depth_rmse": False}})
    assert not np.isclose(by_hand_delta_m(stored, "relif", 0), with_rmse)
    assert "Depth RMSE" in (report / "tables" / "utility.md").read_text()
    assert (table.loc["erm", "delta_m_mean"], table.loc["erm", "delta_m_std"]) == (0, 0)
    assert "Δm% vs ERM ↑" in (report / "tables" / "utility.md").read_text()
    note = "Δm%: 100 x the mean over tasks of the mean over each task's metrics (LibMTL)"
    assert note in (report / "report.md").read_text()


def test_relif_report_takes_the_literatures_delta_m_conventions(
    experiment_dir, stored, tmp_path, capsys
):
    """`relif report --delta-m-base FILE --delta-m-sign lower --delta-m-average metric`:
    against fixed numbers, lower is better, the plain mean over metrics (Nash-MTL's and
    FAMO's convention), by hand from the trials' files; per_trial.csv has each trial's value
    and paired.csv its difference from same-seed ERM's."""
    from relif_ray.cli import main

    base = {m: 0.5 + 0.1 * i for i, m in enumerate(m for t in NATIVE.values() for m in t)}
    path = tmp_path / "single_task.json"
    path.write_text(json.dumps(base))
    out = tmp_path / "report"
    flags = ["--delta-m-base", str(path), "--delta-m-sign", "lower", "--delta-m-average", "metric"]
    common = ["--split", SPLIT, "--pool-size", "16", "--pairs", "128", "--n-boot", "0"]
    assert main(["report", str(experiment_dir), "--out", str(out), *flags, *common,
                 "--no-figures"]) == 0  # fmt: skip
    capsys.readouterr()
    directions = {m: h for task in NATIVE.values() for m, h in task.items()}

    def by_hand(row: pd.Series) -> float:
        changes = [(1 if h else -1) * (row[m] - base[m]) / base[m] for m, h in directions.items()]
        return -100 * float(np.mean(changes))

    per_trial = pd.read_csv(out / "per_trial.csv")
    rows = stored.set_index(["label", "seed"])
    for row in per_trial.itertuples():
        expected = by_hand(rows.loc[(row.label, row.seed)])
        assert row.delta_m == pytest.approx(expected, abs=1e-9)
    paired = pd.read_csv(out / "tables" / "paired.csv")
    relif = paired[(paired["label"] == "relif") & (paired["metric"] == "delta_m")].iloc[0]
    erm = per_trial[per_trial["label"] == "erm"].set_index("seed")["delta_m"]
    mine = per_trial[per_trial["label"] == "relif"].set_index("seed")["delta_m"]
    assert relif["estimate"] == pytest.approx((mine - erm[mine.index]).mean(), abs=1e-9)
    note = "Δm%: 100 x the plain mean over all metrics (Nash-MTL, FAMO) of the relative change "
    note += "against the fixed metric values of single_task.json, signed so that lower is better"
    assert note in (out / "report.md").read_text()
    assert "Δm% ↓" in (out / "tables" / "utility.md").read_text()


def _flat_mean(stored: pd.DataFrame, label: str, seed: int) -> float:
    trial = stored[(stored["label"] == label) & (stored["seed"] == seed)].iloc[0]
    erm = stored[(stored["label"] == "erm") & (stored["seed"] == seed)].iloc[0]
    metrics = {m: h for task in NATIVE.values() for m, h in task.items()}
    changes = [(1 if h else -1) * (trial[m] - erm[m]) / erm[m] for m, h in metrics.items()]
    return 100 * sum(changes) / len(changes)


def union_of_boxes(bias: np.ndarray, worst: np.ndarray) -> float:
    """The area of the union of the boxes [bias_i, 1] x [0, worst_i], by brute force over the
    grid the coordinates make (no sorting or sweep: independent of `hypervolume`)."""
    xs = np.unique(np.clip(np.append(bias, 1.0), None, 1.0))
    ys = np.unique(np.clip(np.append(worst, 0.0), 0.0, None))
    area = 0.0
    cells = itertools.product(zip(xs[:-1], xs[1:], strict=True), zip(ys[:-1], ys[1:], strict=True))
    for (x0, x1), (y0, y1) in cells:
        if any(b <= x0 and w >= y1 for b, w in zip(bias, worst, strict=True)):
            area += (x1 - x0) * (y1 - y0)
    return area


def test_hypervolumes_of_the_pareto_section_by_hand_and_pymoo(report):
    points = pd.read_csv(report / "pareto_points.csv")
    table = pd.read_csv(report / "tables" / "hypervolume.csv").set_index("method")
    means = pd.read_csv(report / "pareto_means.csv").set_index("variant")
    groups = {label: points[points["variant"] == label] for label in ("erm", "pcgrad", "relif")}
    groups["all trials"] = points
    hv = pytest.importorskip("pymoo.indicators.hv").HV(ref_point=np.array([1.0, 0.0]))
    for name, group in groups.items():
        bias, worst = group["bias"].to_numpy(), group["worst"].to_numpy()
        expected = union_of_boxes(bias, worst)
        assert 0 < expected < 1
        assert table.loc[name, "n_points"] == len(group)
        assert table.loc[name, "hypervolume"] == pytest.approx(expected, abs=1e-12), name
        assert hv(np.column_stack([bias, -worst])) == pytest.approx(expected, abs=1e-12)
        if name != "all trials":
            assert means.loc[name, "hypervolume"] == table.loc[name, "hypervolume"]
    text = (report / "report.md").read_text()
    section = text[text.index("## Utility-fairness Pareto front") : text.index("## Threshold")]
    assert "### Hypervolume" in section and "(Bias 1, Worst 0)" in section
    assert f"| all trials | 9 | {table.loc['all trials', 'hypervolume']:.4f} |" in section


def test_report_lists_each_methods_training_settings(report):
    text = (report / "report.md").read_text()
    section = text[text.index("## Training settings") : text.index("## Controller settings")]
    header = (
        "| variant | optimizer | lr | weight_decay | batch_size | epochs | max_steps | "
        "scheduler | steps run |"
    )
    assert header in section
    assert "| ERM | adam | 0.0001 | 1e-05 | 8 | 1 | - | none | 10 |" in section
    assert "| ReLiF | adam | 0.0001 | 1e-05 | 8 | 1 | - | step (x 0.1 every 2 epochs) | 10 |" in (
        section
    )
    cosine = "cosine (to 1e-05 over the run's epochs)"
    assert f"| PCGrad | adam | 0.0001 / 0.0003 | 1e-05 | 8 | 1 | - | {cosine} | 10 |" in section
