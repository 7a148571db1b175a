"""Paired comparisons over seeds (`relif_ray.analysis.paired`) as `relif report` writes them:
paired.csv re-derived independently from per_trial.csv, the hierarchical bootstrap against a direct
two-stage resampling, the front shares, and the verdicts in the main and summary sections."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import DescrStatsW, ttost_paired

from relif_ray import analysis
from relif_ray.analysis.family import FAMILY_COLUMNS
from relif_ray.analysis.paired import (
    PAIRED_COLUMNS,
    front_shares,
    hierarchical_intervals,
    log_scale,
    pair_bootstrap,
    paired_summary,
    seed_bootstrap_t,
)
from relif_ray.analysis.report import ReportOptions, write_report
from relif_ray.analysis.summary import verdicts_section
from relif_ray.analysis.tables import CISettings
from relif_ray.analysis.verdicts import VerdictSettings
from relif_ray.errors import UserError
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
        if direction:
            return f"within ±{margin:g} of ERM (90%), though {direction} (95%, {n} seeds)"
        return f"within ±{margin:g} of ERM (90%, {n} seeds)"
    if direction:
        return f"{direction} than ERM (95%, {n} seeds)"
    return f"not shown{' either way' if margin else ''} with {n} seeds"


def test_paired_csv_is_rederived_from_per_trial_csv(report):
    """Every row of paired.csv from per_trial.csv alone: ratios on the log scale for Bias and
    VR, differences otherwise, scipy's t interval and t test, statsmodels' equivalence test
    and power."""
    per_trial = pd.read_csv(report / "per_trial.csv")
    paired = pd.read_csv(report / "tables" / "paired.csv", keep_default_na=False, na_values=[""])
    assert list(paired.columns) == [*PAIRED_COLUMNS, *FAMILY_COLUMNS]
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
        if row.verdict.startswith("within"):
            p = ttost_paired(values, np.zeros(len(values)), -margin, margin)[0]
        else:
            p = stats.ttest_1samp(x, 0.0).pvalue
        assert row.p == pytest.approx(p, rel=1e-9), row
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
        if margin is None:
            assert math.isnan(row.tost_low) and math.isnan(row.tost_high)
        else:  # the equivalence test's interval: the 90% t interval
            expected = DescrStatsW(values).tconfint_mean(0.10)
            assert (row.tost_low, row.tost_high) == pytest.approx(expected, rel=1e-9)
        assert pd.isna(row.note)
    # ERM's own Delta-M% is 0, so the paired Delta-M% difference is the method's Delta-M%
    erm = per_trial[per_trial["label"] == "erm"]
    assert (erm["delta_m"] == 0).all()


def test_the_main_table_and_the_summary_state_the_verdicts(report):
    main = pd.read_csv(report / "tables" / "main.csv").set_index("method")
    frame = pd.read_csv(report / "tables" / "paired.csv", dtype={"delta": str})
    frame = frame.fillna({"delta": ""}).set_index(["label", "metric", "delta"])
    paired = frame["verdict"]
    assert main.loc["erm", "bias_verdict"] == "reference"
    text = (report / "report.md").read_text()
    summary = text[text.index("## Summary: verdicts over seeds") : text.index("## Audit protocol")]
    for label in ("relif", "pcgrad"):
        bias, worst = paired[label, "bias", "p75"], paired[label, "worst", ""]
        assert (main.loc[label, "bias_verdict"], main.loc[label, "worst_verdict"]) == (bias, worst)
        assert "Bias@δ_p75 " in summary
        for key in ((label, "bias", "p75"), (label, "worst", "")):
            verdict, row = paired[key], frame.loc[key]
            if verdict.startswith(("lower", "higher", "within")):  # with the family's word
                held = "also" if row["p_adjusted"] < 0.05 else "not"
                head, _, tail = verdict.partition(")")
                verdict = (
                    f"{head}; {held} after Holm over {int(row['family_size'])} comparisons){tail}"
                )
            assert f": {verdict}" in summary, verdict
    assert "resample the audit's pairs only, not the seeds" in summary
    # the equivalence test's interval is shown beside the 95% one, named by its level
    table = (report / "tables" / "paired.md").read_text()
    assert "| CI low | CI high | 90% low | 90% high | Verdict |" in table
    assert "where their 90% interval lies inside ±0.02" in summary


def direct_bootstrap_t(gaps: dict, pairs: list, delta: float, replicates: int, seed: int):
    """The hierarchical bootstrap-t written out one step at a time: per seed, its log Bias
    ratio with the audit's pairs and `replicates` with the pairs of every task pair redrawn
    (the same draws for both trials), centred on it; then, per replicate, draw seeds and for
    each a replicate of its value, and studentize the mean by that draw's standard error."""
    rng = np.random.default_rng(seed)

    def log_ratio(trial: str, erm: str, draw=None) -> float:
        ours = theirs = 0.0
        for pair, gap in gaps[trial].gaps.items():
            chosen = slice(None) if draw is None else draw[pair]
            ours += np.maximum(gap[chosen] - delta, 0).mean()
            theirs += np.maximum(gaps[erm].gaps[pair][chosen] - delta, 0).mean()
        return math.log(ours / theirs)

    observed, within = [], []
    for trial, erm in pairs:
        observed.append(log_ratio(trial, erm))
        values = []
        for _ in range(replicates):
            draw = {p: rng.integers(0, g.size, g.size) for p, g in gaps[trial].gaps.items()}
            values.append(log_ratio(trial, erm, draw))
        within.append(np.array(values) - np.mean(values) + observed[-1])
    observed = np.array(observed)
    n = len(pairs)
    studentized = []
    for _ in range(replicates):
        drawn = [within[i][rng.integers(0, replicates)] for i in rng.integers(0, n, n)]
        error = np.std(drawn, ddof=1) / math.sqrt(n)
        studentized.append((np.mean(drawn) - observed.mean()) / error if error > 0 else 0.0)
    t_low, t_high = np.quantile(studentized, [0.025, 0.975])
    error = observed.std(ddof=1) / math.sqrt(n)
    return np.exp([observed.mean() - t_high * error, observed.mean() - t_low * error])


def test_the_hierarchical_interval_agrees_with_a_direct_bootstrap_t(experiment_dir):
    results = analysis.audit(analysis.load(experiment_dir), settings=SETTINGS)
    per_seed = analysis.paired_per_seed(results)
    pcgrad = per_seed[per_seed["label"] == "pcgrad"]
    settings = VerdictSettings(n_boot=600)
    intervals = hierarchical_intervals(results, pcgrad, settings)
    assert set(intervals) == {(m, d.key) for m in ("bias", "vr") for d in results.deltas}
    pairs = list(pcgrad[["trial", "erm_trial"]].drop_duplicates().itertuples(index=False))
    gaps = results.audit.gaps(results.split)
    delta = results.primary
    direct = direct_bootstrap_t(gaps, pairs, delta.value, 600, 1)
    low, high = intervals["bias", delta.key]
    width = np.log(direct[1] / direct[0])
    assert abs(np.log(low / direct[0])) < 0.15 * width
    assert abs(np.log(high / direct[1])) < 0.15 * width
    # the t interval's centre: the interval is about the same mean log ratio
    chosen = pcgrad[(pcgrad["metric"] == "bias") & (pcgrad["delta"] == delta.key)]
    centre = np.log(chosen["paired"]).mean()
    assert np.log(low) < centre < np.log(high)
    # below the minimum seed count there is no hierarchical interval
    fewer = pcgrad[pcgrad["seed"] < 4]
    assert hierarchical_intervals(results, fewer, settings) == {}


def test_the_hierarchical_interval_covers_a_known_truth():
    """400 simulated experiments of 5 seeds: per seed, the method's sampled gaps are the ERM
    trial's (exponential) times a seed's factor c (log c normal around log 0.6, sd 0.3), the
    audit's 48 pairs of one task pair; the truth is E log(c e^(-delta / c) / e^-delta), the
    mean log Bias ratio over seeds. The bootstrap-t interval covers it in [0.91, 0.98] of the
    experiments (a binomial standard error of 0.011); the percentile interval of the same
    two-stage resampling covered about 0.85 (benchmarks/verdict_coverage.py)."""
    from numpy.polynomial.hermite_e import hermegauss

    rng = np.random.default_rng(2026)
    delta, location, spread, n, pairs = 0.5, math.log(0.6), 0.3, 5, 48
    nodes, weights = hermegauss(60)
    scale = np.exp(location + spread * nodes)
    truth = float(weights @ (np.log(scale) - delta / scale + delta) / weights.sum())
    hits = 0
    for _ in range(400):
        observed, replicates = [], []
        for factor in np.exp(location + spread * rng.standard_normal(n)):
            erm = rng.exponential(1.0, pairs)
            own = np.where(rng.random(pairs) < 0.5, erm, rng.exponential(1.0, pairs))
            found = pair_bootstrap({"p": factor * own}, {"p": erm}, {"d": delta}, 300, rng)
            observed.append(found["bias", "d"][0])
            replicates.append(found["bias", "d"][1])
        logs, resampled = log_scale(np.array(observed), np.stack(replicates), 0.01)
        low, high = seed_bootstrap_t(logs, resampled, 0.95, rng)
        hits += low <= truth <= high
    assert 0.91 <= hits / 400 <= 0.98, hits / 400


def test_the_seed_bootstrap_t_studentizes_and_leaves_out_seeds_without_a_value():
    """Without pair noise (replicates equal to each seed's value) the bootstrap-t interval
    holds the mean and is wider than the seeds' percentile interval; a seed whose value is
    not finite is left out; fewer than two seeds give no interval."""
    rng = np.random.default_rng(5)
    observed = np.log([0.5, 0.62, 0.41, 0.7, 0.55])
    replicates = np.repeat(observed[:, None], 400, axis=1)
    low, high = seed_bootstrap_t(observed, replicates, 0.95, rng)
    means = observed[rng.integers(0, 5, (4000, 5))].mean(axis=1)
    percentile = np.quantile(means, [0.025, 0.975])
    assert low < observed.mean() < high
    assert high - low > percentile[1] - percentile[0]
    with_missing = np.append(observed, math.inf)
    again = seed_bootstrap_t(
        with_missing, np.vstack([replicates, np.zeros(400)]), 0.95, np.random.default_rng(5)
    )
    assert again == pytest.approx((low, high))
    assert all(math.isnan(x) for x in seed_bootstrap_t(observed[:1], replicates[:1], 0.95, rng))


def front_fixture(bias: dict, worst: dict) -> SimpleNamespace:
    rows = [
        {"trial": f"{v}-{s}", "variant": v, "seed": s, "bias_p75": b, "worst": worst[v][i]}
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


def test_front_shares_average_both_metrics_over_the_same_seeds():
    """Method a lacks its Worst at seed 2, where its Bias is poor: both of its means are over
    seeds 0 and 1 only, where it dominates b, so b is on the front only in the resamples
    that draw seed 2 alone ((1/3)^3 of them), not whenever seed 2 pulls a's Bias mean up."""
    results = front_fixture(
        {"a": [0.1, 0.1, 0.9], "b": [0.3, 0.3, 0.3]},
        {"a": [0.5, 0.5, math.nan], "b": [0.5, 0.5, 0.5]},
    )
    shares = front_shares(results, VerdictSettings(n_boot=600))
    assert shares["b"] == pytest.approx(1 / 27, abs=0.03)
    assert shares["a"] == pytest.approx(1 - shares["b"])


def test_front_shares_refuse_two_trials_of_one_seed():
    results = front_fixture({"a": [0.1, 0.2], "b": [0.3, 0.4]}, {"a": [0.5, 0.6], "b": [0.5, 0.6]})
    duplicate = results.per_trial.iloc[[0]].assign(trial="a-0-again", bias_p75=0.9)
    results.per_trial = pd.concat([results.per_trial, duplicate], ignore_index=True)
    message = "front shares: a has 2 trials of seed 0 (a-0, a-0-again); a method needs one trial"
    with pytest.raises(UserError, match=re.escape(message)):
        front_shares(results, VerdictSettings(n_boot=10))


def test_pareto_means_csv_carries_the_front_shares(experiment_dir, tmp_path):
    options = ReportOptions(
        settings=SETTINGS, ci=CISettings(n_boot=0), verdicts=VerdictSettings(n_boot=100),
        figures=False,
    )  # fmt: skip
    write_report(analysis.load(experiment_dir), tmp_path, options)
    means = pd.read_csv(tmp_path / "pareto_means.csv").set_index("variant")
    assert means["front_share"].between(0, 1).all()
    assert (means.loc[means["on_front"], "front_share"] > 0).all()


def test_zero_bias_and_values_without_spread_are_named(experiment_dir):
    """An ERM Bias of 0 leaves its seed out of every ratio at that delta, named by seed and
    ERM trial; a method's Bias of 0 is a seed (ratio 0, at the floor); a Worst difference
    that is the same at every seed gives no verdict, and the report's summary says so once,
    naming the trials."""
    results = analysis.audit(analysis.load(experiment_dir), settings=SETTINGS)
    per_trial = results.per_trial.copy()
    trial_of = per_trial.set_index(["label", "seed"])["trial"]
    key = f"bias_{results.primary.key}"
    erm_zero, relif_zero = trial_of["erm", 1], trial_of["relif", 0]
    per_trial.loc[per_trial["trial"] == erm_zero, key] = 0.0
    per_trial.loc[per_trial["trial"] == relif_zero, key] = 0.0
    erm_worst = per_trial[per_trial["label"] == "erm"].set_index("seed")["worst"]
    pcgrad = per_trial["label"] == "pcgrad"
    per_trial.loc[pcgrad, "worst"] = per_trial.loc[pcgrad, "seed"].map(erm_worst) + 0.01
    results.per_trial = per_trial
    settings = VerdictSettings(n_boot=0)
    paired = paired_summary(results, settings).set_index(["label", "metric", "delta"])
    relif = paired.loc["relif", "bias", results.primary.key]
    assert relif["n_seeds"] == SEEDS - 1  # seed 1 left out, seed 0 (ratio 0) kept
    assert relif["note"] == f"seed 1 left out: ERM's bias is 0 ({erm_zero})"
    assert "0: 0;" in relif["per_seed"]
    logs = np.log(np.maximum(by_hand(per_trial, "relif", key, True).drop(1), 0.01))
    assert relif["estimate"] == pytest.approx(math.exp(logs.mean()))
    worst = paired.loc["pcgrad", "worst", ""]
    assert worst["verdict"] == f"no verdict: the {SEEDS} seeds did not vary"
    assert math.isnan(worst["ci_low"]) and math.isnan(worst["seeds_needed"])
    pcgrad_trials = ", ".join(trial_of["pcgrad", seed] for seed in range(SEEDS))
    erm_trials = ", ".join(trial_of["erm", seed] for seed in range(SEEDS))
    assert worst["note"] == (
        f"the seeds did not vary: trials {pcgrad_trials} against ERM trials {erm_trials}"
    )
    summary = verdicts_section(results, paired.reset_index(), settings)
    assert summary.count("did not vary") == 2  # the verdict's clause, and the note once
    assert f"- PCGrad (worst): the seeds did not vary: trials {pcgrad_trials}" in summary
    zero_note = f"seed 1 left out: ERM's bias is 0 ({erm_zero})."
    assert f"- ReLiF (bias@{results.primary.symbol}): {zero_note}" in summary
