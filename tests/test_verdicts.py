"""Verdicts over seeds (`relif_ray.analysis.verdicts`) against scipy and statsmodels, a coverage
simulation of the interval the verdicts rest on, and the words they give."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import DescrStatsW, ttost_paired

from relif_ray.analysis.verdicts import (
    MAX_SEEDS,
    VerdictSettings,
    compare_differences,
    compare_ratios,
    equivalent,
    t_interval,
    t_test_seeds_needed,
    tost_power,
    tost_seeds_needed,
)
from relif_ray.errors import UserError

SETTINGS = VerdictSettings()


def test_the_t_interval_is_statsmodels_and_scipys():
    rng = np.random.default_rng(1)
    for n in (2, 3, 7):
        values = rng.normal(0.3, 0.2, n)
        mean, low, high = t_interval(values, 0.95)
        assert (low, high) == pytest.approx(DescrStatsW(values).tconfint_mean(0.05), abs=1e-12)
        half = stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n)
        assert (mean, high - mean) == pytest.approx((values.mean(), half), abs=1e-12)


def test_the_coverage_of_the_verdicts_interval_is_nominal():
    """Many simulated experiments with a known truth: per seed, the log of the method's Bias
    over same-seed ERM's is the true log ratio plus normal seed-to-seed noise (training
    seeds), as for Bias and VR; differences of utility are the same computation without the
    log. The 95% interval covers the truth in [0.93, 0.97] of the experiments, at 2, 3 and 7
    seeds (4,000 experiments each: a binomial standard error of 0.0034)."""
    rng = np.random.default_rng(20261128)
    truth = math.log(0.6)
    for n in (2, 3, 7):
        logs = truth + rng.normal(0.0, 0.4, size=(4000, n))
        _, low, high = t_interval(logs, 0.95)
        coverage = np.mean((low <= truth) & (truth <= high))
        assert 0.93 <= coverage <= 0.97, (n, coverage)
    # what the verdict reads is that interval, on the log scale, exponentiated
    comparison = compare_ratios(np.exp(logs[0]), SETTINGS)
    _, low, high = t_interval(logs[0], 0.95)
    assert (comparison.ci_low, comparison.ci_high) == pytest.approx((math.exp(low), math.exp(high)))


def test_ratios_are_compared_on_the_log_scale():
    """0.5x and 2x are symmetric: reciprocal ratios give reciprocal estimates and intervals;
    the estimate is the geometric mean."""
    ratios = np.array([0.45, 0.5, 0.55])
    down, up = compare_ratios(ratios, SETTINGS), compare_ratios(1 / ratios, SETTINGS)
    assert down.estimate == pytest.approx(stats.gmean(ratios))
    assert up.estimate == pytest.approx(1 / down.estimate)
    assert (up.ci_low, up.ci_high) == pytest.approx((1 / down.ci_high, 1 / down.ci_low))
    assert down.verdict == "lower than ERM (95%, 3 seeds)"
    assert up.verdict == "higher than ERM (95%, 3 seeds)"


def test_the_demos_two_seeds_show_nothing():
    """The demo's per-seed Bias ratios 0.81 and 0.40: a t interval over two log ratios from
    about 0.01x to 50x, so the verdict is "not shown", with the seeds needed."""
    comparison = compare_ratios(np.array([0.81, 0.40]), SETTINGS)
    assert comparison.verdict == "not shown with 2 seeds"
    assert comparison.ci_low == pytest.approx(0.0064, abs=1e-4)
    assert comparison.ci_high == pytest.approx(50.35, abs=0.01)
    effect = abs(np.log([0.81, 0.40]).mean()) / np.log([0.81, 0.40]).std(ddof=1)
    assert comparison.seeds_needed == math.ceil(
        TTestPower().solve_power(effect, alpha=0.05, power=0.8, alternative="two-sided")
    )


def test_one_seed_has_no_interval_and_bad_ratios_are_left_out():
    one = compare_ratios(np.array([0.5]), SETTINGS)
    assert one.n == 1 and math.isnan(one.ci_low) and one.verdict == "not shown with 1 seed"
    assert math.isnan(one.seeds_needed)
    cleaned = compare_ratios(np.array([0.5, np.inf, 0.6, 0.0, np.nan, 0.55]), SETTINGS)
    assert cleaned.n == 3
    assert cleaned.estimate == pytest.approx(stats.gmean([0.5, 0.6, 0.55]))


def test_equivalence_is_statsmodels_two_one_sided_tests():
    """Over many random paired samples: "within ±m" exactly where statsmodels' paired TOST
    rejects at 5%, i.e. where the 90% t interval lies inside (-m, m)."""
    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(300):
        n = int(rng.integers(2, 8))
        erm = rng.normal(0.5, 0.05, n)
        method = erm + rng.normal(rng.uniform(-0.03, 0.03), rng.uniform(0.001, 0.02), n)
        p_value = ttost_paired(method, erm, -0.02, 0.02)[0]
        shown = equivalent(method - erm, 0.02, 0.95)
        assert shown == (p_value < 0.05)
        _, low, high = t_interval(method - erm, 0.90)
        assert shown == (low > -0.02 and high < 0.02)
        seen.add(shown)
    assert seen == {True, False}


def test_utility_verdicts_in_words():
    margin = 0.02
    within = compare_differences(np.array([0.001, -0.002, 0.0005, 0.0]), SETTINGS, margin)
    assert within.verdict == "within ±0.02 of ERM (95%, 4 seeds)"
    lower_but_within = compare_differences(np.array([-0.005, -0.006, -0.0055]), SETTINGS, margin)
    assert lower_but_within.verdict == "within ±0.02 of ERM, though lower (95%, 3 seeds)"
    lower = compare_differences(np.array([-0.05, -0.06, -0.055]), SETTINGS, margin)
    assert lower.verdict == "lower than ERM (95%, 3 seeds)"
    # the fidelity benchmark's relif Worst differences (-0.035, -0.025, -0.006)
    neither = compare_differences(np.array([-0.035, -0.025, -0.006]), SETTINGS, margin)
    assert neither.verdict == "not shown either way with 3 seeds"
    assert neither.estimate == pytest.approx(-0.022)
    without_margin = compare_differences(np.array([0.1, 0.3]), SETTINGS)
    assert without_margin.verdict == "not shown with 2 seeds"


def test_t_test_seeds_needed_is_statsmodels_solve_power():
    for mean, std in ((0.5, 1.0), (0.2, 0.3), (-1.0, 0.8), (0.05, 0.5)):
        solved = TTestPower().solve_power(
            abs(mean) / std, alpha=0.05, power=0.8, alternative="two-sided"
        )
        assert t_test_seeds_needed(mean, std, 0.95, 0.8) == max(2, math.ceil(solved))
    assert math.isnan(t_test_seeds_needed(0.0, 1.0, 0.95, 0.8))
    assert math.isnan(t_test_seeds_needed(1e-4, 1.0, 0.95, 0.8))  # beyond MAX_SEEDS
    assert MAX_SEEDS == 1000


def test_tost_power_is_a_lower_bound_close_to_a_simulation():
    """Simulated two one-sided tests at the seeds `tost_seeds_needed` gives reach the power
    (the formula is the Bonferroni lower bound), and the formula is within 0.03 of the
    simulated power there."""
    rng = np.random.default_rng(3)
    for mean, std in ((0.0, 0.01), (0.005, 0.015), (-0.01, 0.01)):
        n = int(tost_seeds_needed(mean, std, 0.02, 0.95, 0.8))
        assert (
            tost_power(mean, std, 0.02, n, 0.95) >= 0.8 > tost_power(mean, std, 0.02, n - 1, 0.95)
        )
        samples = rng.normal(mean, std, size=(4000, n))
        _, low, high = t_interval(samples, 0.90)
        simulated = np.mean((low > -0.02) & (high < 0.02))
        assert simulated >= 0.8 - 0.02
        assert abs(simulated - tost_power(mean, std, 0.02, n, 0.95)) < 0.03
    assert math.isnan(tost_seeds_needed(0.03, 0.01, 0.02, 0.95, 0.8))  # outside the margin


def test_utility_seeds_needed_follow_the_question_left_open():
    """Inside the margin: the seeds for equivalence; outside it: for a difference."""
    inside = compare_differences(np.array([-0.01, 0.012, 0.004]), SETTINGS, 0.02)
    mean, std = np.mean([-0.01, 0.012, 0.004]), np.std([-0.01, 0.012, 0.004], ddof=1)
    assert inside.seeds_needed == tost_seeds_needed(mean, std, 0.02, 0.95, 0.8)
    outside = compare_differences(np.array([-0.05, 0.01, -0.04]), SETTINGS, 0.02)
    values = [-0.05, 0.01, -0.04]
    expected = t_test_seeds_needed(np.mean(values), np.std(values, ddof=1), 0.95, 0.8)
    assert outside.seeds_needed == expected


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("level", 1.0, "level: must be in (0, 1), got 1.0"),
        ("margin", 0.0, "equivalence margin: must be a positive number, got 0.0"),
        ("power", 0.0, "power: must be in (0, 1), got 0.0"),
        ("n_boot", -1, "n_boot: must be >= 0, got -1"),
    ],
)
def test_bad_settings_are_one_line_errors(field, value, message):
    with pytest.raises(UserError, match=re.escape(message)):
        VerdictSettings(**{field: value})
