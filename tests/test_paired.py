"""Paired comparisons over seeds (`relif_ray.analysis.paired`) as `relif report` writes them:
paired.csv re-derived independently from per_trial.csv, the hierarchical bootstrap against a direct
two-stage resampling, the front shares, and the verdicts in the main and summary sections."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from relif_ray import analysis
from relif_ray.analysis.paired import PAIRED_COLUMNS, front_shares, hierarchical_intervals
from relif_ray.analysis.report import ReportOptions, write_report
from relif_ray.analysis.tables import CISettings
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.testing.synthetic_experiment import write_synthetic_experiment
from tests.test_analysis import SETTINGS

VERDICTS = VerdictSettings(n_boot=200)
SEEDS = 5


@pytest.fixture(scope="module")
def experiment_dir(tmp_path_factory) -> Path:
    return write_synthetic_experiment(
        tmp_path_factory.mktemp("paired") / "exp",
        labels=("erm", "relif", "pcgrad"),
        seeds=SEEDS,
        n_examples=24,
        splits=("val", "test"),
        trace_steps=10,
    )


@pytest.fixture(scope="module")
def report(experiment_dir, tmp_path_factory) -> Path:
    options = ReportOptions(
        settings=SETTINGS, ci=CISettings(n_boot=0), verdicts=VERDICTS, figures=False
    )
    out = tmp_path_factory.mktemp("paired-report")
    write_report(analysis.load(experiment_dir), out, options)
    return out


def by_hand(per_trial: pd.DataFrame, variant: str, column: str, ratio: bool) -> pd.Series:
    """Per seed, the variant's value against the ERM trial of that seed (the generated
    experiment has one architecture and one ERM trial per seed)."""
    erm = per_trial[per_trial["label"] == "erm"].set_index("seed")[column]
    mine = per_trial[per_trial["variant"] == variant].set_index("seed")[column]
    return (mine / erm[mine.index]) if ratio else (mine - erm[mine.index])


def verdict_by_hand(values: np.ndarray, ratio: bool, margin: float | None) -> str:
    n = len(values)
    x = np.log(values) if ratio else values
    half = stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)
    low, high = x.mean() - half, x.mean() + half
    direction = "lower" if high < 0 else "higher" if low > 0 else None
    if margin is not None and ttost_paired(values, np.zeros(n), -margin, margin)[0] < 0.05:
        return (
            f"within ±{margin:g} of ERM"
            + (f", though {direction}" if direction else "")
            + (f" (95%, {n} seeds)")
        )
    if direction:
        return f"{direction} than ERM (95%, {n} seeds)"
    return f"not shown{' either way' if margin else ''} with {n} seeds"


def test_paired_csv_is_rederived_from_per_trial_csv(report):
    """Every row of paired.csv from per_trial.csv alone: ratios on the log scale for Bias and
    VR, differences otherwise, scipy's t interval, statsmodels' equivalence test and power."""
    per_trial = pd.read_csv(report / "per_trial.csv")
    paired = pd.read_csv(report / "tables" / "paired.csv", keep_default_na=False, na_values=[""])
    assert list(paired.columns) == PAIRED_COLUMNS
    metrics = ["bias", "vr", "bias", "vr", "worst", "macro"]
    assert list(paired.loc[paired["label"] == "relif", "metric"])[:6] == metrics
    assert set(paired["label"]) == {"relif", "pcgrad"}  # ERM is the reference
    assert {"seg_miou", "depth_rmse", "normal_angle_mean", "delta_m"} <= set(paired["metric"])
    for row in paired.itertuples():
        ratio = row.metric in ("bias", "vr")
        column = f"{row.metric}_{row.delta}" if ratio else row.metric
        values = by_hand(per_trial, row.label, column, ratio).to_numpy()
        x = np.log(values) if ratio else values
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
        ends = np.array([x.mean(), x.mean() - half, x.mean() + half])
        expected = np.exp(ends) if ratio else ends
        assert row.n_seeds == SEEDS
        assert [row.estimate, row.ci_low, row.ci_high] == pytest.approx(expected, rel=1e-9)
        margin = 0.02 if row.metric in ("worst", "macro") else None
        assert row.verdict == verdict_by_hand(values, ratio, margin), row
        if row.verdict.startswith("not shown") and (margin is None or abs(x.mean()) >= margin):
            solved = TTestPower().solve_power(
                abs(x.mean()) / x.std(ddof=1), alpha=0.05, power=0.8, alternative="two-sided"
            )
            if solved <= 1000:
                assert row.seeds_needed == max(2, math.ceil(solved)), row
        if not row.verdict.startswith("not shown"):
            assert math.isnan(row.seeds_needed)
        per_seed = dict(part.split(": ") for part in row.per_seed.split("; "))
        assert [float(v) for v in per_seed.values()] == pytest.approx(values, rel=1e-3)
    # ERM's own Delta-M% is 0, so the paired Delta-M% difference is the method's Delta-M%
    erm = per_trial[per_trial["label"] == "erm"]
    assert (erm["delta_m"] == 0).all()


def test_the_main_table_and_the_summary_state_the_verdicts(report):
    main = pd.read_csv(report / "tables" / "main.csv").set_index("method")
    paired = pd.read_csv(report / "tables" / "paired.csv", dtype=str, keep_default_na=False)
    paired = paired.set_index(["label", "metric", "delta"])["verdict"]
    assert main.loc["erm", "bias_verdict"] == "reference"
    text = (report / "report.md").read_text()
    summary = text[text.index("## Summary: verdicts over seeds") : text.index("## Audit protocol")]
    for label in ("relif", "pcgrad"):
        bias, worst = paired[label, "bias", "p75"], paired[label, "worst", ""]
        assert (main.loc[label, "bias_verdict"], main.loc[label, "worst_verdict"]) == (bias, worst)
        assert "Bias@δ_p75 " in summary and bias in summary and worst in summary
    assert "resample the audit's pairs only, not the seeds" in summary


def direct_two_stage(gaps: dict, pairs: list, delta: float, replicates: int, seed: int):
    """The hierarchical bootstrap written out one replicate at a time: draw seeds, then for
    each drawn seed the audit's pairs of every task pair (the same draws for both trials)."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(replicates):
        logs = []
        for index in rng.integers(0, len(pairs), len(pairs)):
            trial, erm = pairs[index]
            ours = theirs = 0.0
            for pair, gap in gaps[trial].gaps.items():
                draw = rng.integers(0, gap.size, gap.size)
                ours += np.maximum(gap[draw] - delta, 0).mean()
                theirs += np.maximum(gaps[erm].gaps[pair][draw] - delta, 0).mean()
            logs.append(np.log(ours / theirs))
        values.append(np.mean(logs))
    return np.exp(np.quantile(values, [0.025, 0.975]))


def test_the_hierarchical_interval_agrees_with_a_direct_two_stage_bootstrap(experiment_dir):
    results = analysis.audit(analysis.load(experiment_dir), settings=SETTINGS)
    per_seed = analysis.paired_per_seed(results)
    pcgrad = per_seed[per_seed["label"] == "pcgrad"]
    settings = VerdictSettings(n_boot=600)
    intervals = hierarchical_intervals(results, pcgrad, settings)
    assert set(intervals) == {(m, d.key) for m in ("bias", "vr") for d in results.deltas}
    pairs = list(pcgrad[["trial", "erm_trial"]].drop_duplicates().itertuples(index=False))
    gaps = results.audit.gaps(results.split)
    delta = results.primary
    direct = direct_two_stage(gaps, pairs, delta.value, 600, 1)
    low, high = intervals["bias", delta.key]
    width = np.log(direct[1] / direct[0])
    assert abs(np.log(low / direct[0])) < 0.15 * width
    assert abs(np.log(high / direct[1])) < 0.15 * width
    # below the minimum seed count there is no hierarchical interval
    fewer = pcgrad[pcgrad["seed"] < 4]
    assert hierarchical_intervals(results, fewer, settings) == {}


def front_fixture(bias: dict, worst: dict) -> SimpleNamespace:
    rows = [
        {"variant": v, "seed": s, "bias_p75": b, "worst": worst[v][i]}
        for v, values in bias.items()
        for i, (s, b) in enumerate(zip(range(len(values)), values, strict=True))
    ]
    return SimpleNamespace(
        per_trial=pd.DataFrame(rows),
        primary=SimpleNamespace(key="p75"),
        variants=list(bias),
    )


def test_front_shares_over_seed_resamples():
    """A method better in Bias and Worst at every seed is on the front in every resample and
    the dominated one in none; two methods that trade Bias for Worst at every seed both are."""
    results = front_fixture(
        {"a": [0.1, 0.2, 0.15], "b": [0.3, 0.4, 0.35], "c": [0.05, 0.06, 0.07]},
        {"a": [0.6, 0.7, 0.65], "b": [0.5, 0.6, 0.55], "c": [0.4, 0.45, 0.5]},
    )
    shares = front_shares(results, VerdictSettings(n_boot=300))
    assert shares.to_dict() == {"a": 1.0, "b": 0.0, "c": 1.0}
    # close means that swap order from seed to seed: both shares strictly between 0 and 1
    noisy = front_fixture(
        {"a": [0.1, 0.3, 0.2, 0.25], "b": [0.3, 0.1, 0.22, 0.2]},
        {"a": [0.5, 0.5, 0.5, 0.5], "b": [0.5, 0.5, 0.5, 0.5]},
    )
    shares = front_shares(noisy, VerdictSettings(n_boot=300))
    assert 0 < shares["a"] < 1 and 0 < shares["b"] < 1
    assert front_shares(noisy, VerdictSettings(n_boot=0)).isna().all()


def test_pareto_means_csv_carries_the_front_shares(experiment_dir, tmp_path):
    options = ReportOptions(
        settings=SETTINGS, ci=CISettings(n_boot=0), verdicts=VerdictSettings(n_boot=100),
        figures=False,
    )  # fmt: skip
    write_report(analysis.load(experiment_dir), tmp_path, options)
    means = pd.read_csv(tmp_path / "pareto_means.csv").set_index("variant")
    assert means["front_share"].between(0, 1).all()
    assert (means.loc[means["on_front"], "front_share"] > 0).all()
