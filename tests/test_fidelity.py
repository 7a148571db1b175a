"""The fidelity experiment (`python -m benchmarks.fidelity`): each ReLiF label against the
same-seed ERM trial, and its rows recomputed from the report's per-trial numbers at the smoke
size, end to end through the real sweep and report; its record is the harness's."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import fidelity, fidelity_goal
from relif_ray import analysis

REPO = Path(__file__).resolve().parents[1]


def test_fidelity_compares_each_label_with_the_same_seed_erm_trial() -> None:
    trials = pd.DataFrame(
        {
            "label": ["erm", "erm", "relif", "relif"],
            "seed": [0, 1, 1, 0],
            "bias_p75": [0.4, 0.2, 0.05, 0.1],
            "worst": [0.3, 0.5, 0.48, 0.31],
        }
    )
    assert fidelity.compare(trials, "relif", "bias_p75", ratio=True) == pytest.approx(
        {0: 0.25, 1: 0.25}
    )
    assert fidelity.compare(trials, "relif", "worst", ratio=False) == pytest.approx(
        {0: 0.01, 1: -0.02}
    )


@pytest.mark.slow
def test_fidelity_quick_rows_recompute_from_the_reports_per_trial_csv(
    ray_session, tmp_path
) -> None:
    """The --quick size end to end through the real sweep and report (each in a process of
    its own; the sweep on the tests' Ray, as `-- --address ADDRESS` sends it to a cluster):
    every row recomputed from the report's per_trial.csv and interface_per_trial.csv, every
    target applied."""
    address = ray_session.get_runtime_context().gcs_address
    on_the_tests_ray = ("--address", address, "--max-concurrent-trials", "1")
    size = dataclasses.replace(fidelity.QUICK, sweep_flags=on_the_tests_ray)
    rows = fidelity.fidelity_rows(size, tmp_path)
    trials = pd.read_csv(tmp_path / "report" / "per_trial.csv")
    interfaces = pd.read_csv(tmp_path / "report" / "interface_per_trial.csv")
    labels = ["erm", "relif", "relif-clipshare", "relif-logistic", "relif-st"]
    assert sorted(trials["label"]) == labels == sorted(size.labels + ("erm",))
    erm = trials[trials["label"] == "erm"].set_index("seed")
    by_name = {row.name: row for row in rows}
    assert len(rows) == 1 + 8 * len(size.labels) + len(fidelity_goal.GOAL_LABELS)
    traces = analysis.load(tmp_path / "results" / "fidelity").traces
    clip_columns = ["clip0_depth", "clip0_normal", "clip1_depth", "clip1_normal"]
    for label in size.labels:
        trial = trials[trials["label"] == label].set_index("seed")
        paper = by_name[f"Bias@delta_p75 {label} / ERM (a) q10-q90"]
        assert paper.per_seed == pytest.approx((trial["bias_p75"] / erm["bias_p75"]).to_dict())
        for interface, letter in (("q1-q99", "(b)"), ("ecdf", "(c)")):
            rows_of = interfaces[interfaces["interface"] == interface].set_index("trial")
            mine = rows_of.loc[trial["trial"], "bias"].to_numpy()
            reference = rows_of.loc[erm.loc[trial.index, "trial"], "bias"].to_numpy()
            bias = by_name[f"Bias@delta_p75 {label} / ERM {letter} {interface}"]
            assert list(bias.per_seed.values()) == pytest.approx(list(mine / reference))
            assert bias.value == pytest.approx(np.mean(list(bias.per_seed.values())))
        vr = by_name[f"VR@delta_p75 {label} / ERM"]
        assert vr.per_seed == pytest.approx((trial["vr_p75"] / erm["vr_p75"]).to_dict())
        worst = by_name[f"Worst {label} - ERM"]
        assert worst.per_seed == pytest.approx((trial["worst"] - erm["worst"]).to_dict())
        macro = by_name[f"Macro {label} - ERM"]
        assert macro.per_seed == pytest.approx((trial["macro"] - erm["macro"]).to_dict())
        # each row ends with the report's verdict over seeds: with one seed, nothing is shown
        assert paper.detail.endswith("over seeds: not shown with 1 seed")
        assert "; over seeds: not shown with 1 seed, " in vr.detail
        for row in (worst, macro):
            assert "; over seeds: not shown either way with 1 seed, " in row.detail
        at_bound = by_name[f"share of {label} steps with lambda at a bound"]
        lam = traces[traces["trial"].isin(trial["trial"])]["lambda"]
        assert at_bound.value == pytest.approx(float(((lam <= 0.01) | (lam >= 1.0)).mean()))
        clipped = by_name[f"clipped shares {label} - ERM (largest)"]
        difference = trial[clip_columns] - erm.loc[trial.index, clip_columns]
        assert clipped.per_seed == pytest.approx(difference.max(axis=1).to_dict())
        assert clipped.value == pytest.approx(difference.mean().max())
    for label in fidelity_goal.GOAL_LABELS:  # one seed shows no cut: the goal is not met
        goal = by_name.pop(f"goal {label}")
        assert goal.result == "FAIL" and "(a) q10-q90 FAIL" in goal.detail
        assert goal.detail.count("not shown") == 3 + 2  # three interfaces, Worst and Macro
    judged = {row.name: row for row in by_name.values() if row.result in ("pass", "FAIL")}
    bounds = {
        "Bias@delta_p75 relif / ERM (a) q10-q90": ("<=", 0.5),
        "Worst relif - ERM": (">=", -0.02),
        "Macro relif - ERM": (">=", -0.02),
        "Bias@delta_p75 relif-st / ERM (a) q10-q90": ("<=", 0.35),
        "Bias@delta_p75 relif-st / ERM (c) ecdf": ("<=", 0.35),
        "clipped shares relif-st - ERM (largest)": ("<=", 0.05),
        "Worst relif-st - ERM": (">=", -0.02),
    }
    assert set(judged) == set(bounds)
    for name, (comparison, bound) in bounds.items():
        value = judged[name].value
        passed = value <= bound if comparison == "<=" else value >= bound
        assert judged[name].result == ("pass" if passed else "FAIL"), name
    report = (tmp_path / "report" / "report.md").read_text()
    section = report[report.index("## Audit-interface sensitivity") :]
    assert "| ReLiF-ST | (c) ecdf |" in section and "Skipped" not in section.split("## ")[1]


def test_the_flags_choose_the_size_data_and_sweep_flags_of_another_run(tmp_path) -> None:
    """What the GPU check asks for: its own data (sizes read from the folder), its seeds,
    steps and model, no bootstrap, the sweep's GPU flags after `--`, and no targets."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    root = write_synthetic_nyuv2(tmp_path / "data", train=6, val=4, height=16, width=24, seed=0)
    parser = fidelity.build_parser()
    argv = ["--data-dir", str(root), "--seeds", "2", "--steps", "7", "--backbone", "resnet50"]
    argv += ["--n-boot", "0", "--no-targets", "--", "--num-gpus", "1", "--precision", "bf16"]
    size = fidelity.chosen_size(parser.parse_args(argv), parser)
    assert (size.train, size.val, size.height, size.width) == (6, 4, 16, 24)
    assert (size.seeds, size.steps, size.backbone, size.judged) == (2, 7, "resnet50", False)
    assert size.sweep_flags == ("--num-gpus", "1", "--precision", "bf16")
    assert size.report_flags == ("--no-figures", "--n-boot", "0")
    assert fidelity.chosen_size(parser.parse_args([]), parser) == fidelity.FULL
    with pytest.raises(SystemExit) as failed:  # argparse's one-line error
        fidelity.chosen_size(parser.parse_args(["--data-dir", str(tmp_path / "none")]), parser)
    assert failed.value.code == 2
    row = fidelity.target_row("Worst relif - ERM", -0.1, "", "", {0: -0.1}, False)
    assert (row.target, row.result, row.per_seed) == ("-", "info", {0: -0.1})
    judged = fidelity.target_row("Worst relif - ERM", -0.1, "", "", {}, True)
    assert (judged.target, judged.result) == (">= -0.02", "FAIL")
    assert fidelity.target_row("Worst relif - ERM", -0.01, "", "", {}, True).result == "pass"


@pytest.mark.slow
def test_the_record_is_the_harness_record_and_says_when_the_sweep_failed(tmp_path, capsys):
    """The record (`--out`, `--json`) is the harness's: the command, the machine with the
    checkout's short commit ("+" where a tracked file differs; this test runs in a checkout),
    the section's status and the rows. A mistake in the sweep's flags after `--` is the sweep's
    own one-line error: exit 2, no traceback, and a record that says so and holds no rows."""
    out = tmp_path / "out"
    argv = ["--quick", "--out", str(out), "--", "--no-such-flag"]
    assert fidelity.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("python -m benchmarks.fidelity: error: ")
    assert error[0].endswith("nyuv2.py: error: unrecognized arguments: --no-such-flag")
    record = json.loads((out / "fidelity.json").read_text())
    assert record["command"] == "python -m benchmarks.fidelity " + " ".join(argv)
    assert record["rows"] == [] and record["sections"][0]["status"].startswith("FAIL: ")
    assert {"cpu", "cores", "torch", "python", "load_average_end"} <= set(record["machine"])
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode == 0:
        assert record["machine"]["commit"].removesuffix("+") == head.stdout.strip()
    assert (out / "fidelity.md").read_text().startswith("`python -m benchmarks.fidelity --quick")


def test_the_variants_goal_needs_every_part_over_seeds() -> None:
    """`fidelity_goal.judge`: the Bias interval's upper bound (Student-t over seeds of the log
    ratio, recomputed here with scipy) at most 0.5x under every interface, Worst and Macro shown
    within ±0.02, the clipped share at most ERM's + 0.05; any part missing fails it."""
    from scipy import stats

    ratios = {
        "(a) q10-q90": {0: 0.20, 1: 0.25, 2: 0.22, 3: 0.18, 4: 0.21},
        "(b) q1-q99": {0: 0.30, 1: 0.35, 2: 0.28, 3: 0.33, 4: 0.31},
        "(c) ecdf": {0: 0.25, 1: 0.27, 2: 0.24, 3: 0.26, 4: 0.22},
    }
    within = "within ±0.02 of ERM (95%, 5 seeds)"
    utility = {"worst": within, "macro": within}
    met = fidelity_goal.judge(ratios, utility, 0.03)
    logs = np.log(list(ratios["(b) q1-q99"].values()))
    upper = np.exp(logs.mean() + stats.t.ppf(0.975, 4) * logs.std(ddof=1) / np.sqrt(5))
    assert met.met and met.largest_upper == pytest.approx(upper, rel=1e-9)
    assert met.detail.count("pass") == 6
    wide = {**ratios, "(b) q1-q99": {0: 0.2, 1: 0.9, 2: 0.3, 3: 0.5, 4: 0.4}}
    failed = fidelity_goal.judge(wide, utility, 0.03)
    assert not failed.met and "(b) q1-q99 FAIL" in failed.detail and failed.largest_upper > 0.5
    assert not fidelity_goal.judge(ratios, utility, 0.051).met
    shown_loss = {"worst": "lower than ERM (95%, 5 seeds)", "macro": within}
    assert not fidelity_goal.judge(ratios, shown_loss, 0.0).met
    higher = {**ratios, "(c) ecdf": {seed: 1 / value for seed, value in ratios["(c) ecdf"].items()}}
    assert not fidelity_goal.judge(higher, utility, 0.0).met
