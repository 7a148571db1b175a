"""Verdicts over seeds (`relif_ray.analysis.verdicts`) against scipy and statsmodels, a coverage
simulation of the interval the verdicts rest on, and the words they give."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import ndtr
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import DescrStatsW, ttost_paired

from relif_ray.analysis.verdicts import (
    MAX_SEEDS,
    VerdictSettings,
    compare_differences,
    compare_ratios,
    equivalence_bound,
    planning_estimate,
    t_interval,
    t_test_p,
    t_test_power,
    t_test_seeds_needed,
    tost_p,
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


def test_one_seed_has_no_interval_and_ratios_without_an_erm_value_are_left_out():
    """inf and NaN (an ERM Bias of 0) have no ratio to compare and are left out; a ratio of 0
    (the method's Bias is 0) is a seed, counted at the floor."""
    one = compare_ratios(np.array([0.5]), SETTINGS)
    assert one.n == 1 and math.isnan(one.ci_low) and one.verdict == "not shown with 1 seed"
    assert math.isnan(one.seeds_needed)
    cleaned = compare_ratios(np.array([0.5, np.inf, 0.6, 0.0, np.nan, 0.55]), SETTINGS)
    assert cleaned.n == 4
    floor = SETTINGS.ratio_floor
    assert cleaned.estimate == pytest.approx(stats.gmean([0.5, 0.6, floor, 0.55]))


def test_a_ratio_of_zero_is_a_seed_and_the_best_outcome():
    """[0, 0.3, 0.5]: three seeds, the 0 at log(floor); a positive ratio at or above the floor
    in its place never gives a lower estimate; below the floor the 0 ties with the smallest
    positive ratio, which is taken as it is."""
    settings = VerdictSettings(ratio_floor=0.01)
    zero = compare_ratios(np.array([0.0, 0.3, 0.5]), settings)
    logs = np.log([0.01, 0.3, 0.5])
    _, low, high = t_interval(logs, 0.95)
    assert zero.n == 3 and zero.verdict == "not shown with 3 seeds"
    assert zero.estimate == pytest.approx(math.exp(logs.mean()))
    assert (zero.ci_low, zero.ci_high) == pytest.approx((math.exp(low), math.exp(high)))
    assert zero.seeds_needed > 3
    for positive in (0.01, 0.05, 0.2, 0.9):
        other = compare_ratios(np.array([positive, 0.3, 0.5]), settings)
        assert other.estimate >= zero.estimate - 1e-12
    tied = compare_ratios(np.array([0.0, 0.004, 0.5]), settings)
    assert tied.estimate == pytest.approx(stats.gmean([0.004, 0.004, 0.5]))
    # positive ratios below the floor are not moved: no zero, no change
    small = compare_ratios(np.array([0.001, 0.05, 0.3]), settings)
    assert small.estimate == pytest.approx(stats.gmean([0.001, 0.05, 0.3]))
    # a zero at every seed but one still shows the cut
    shown = compare_ratios(np.array([0.0, 0.0, 0.0, 0.02]), settings)
    assert shown.n == 4 and shown.verdict == "lower than ERM (95%, 4 seeds)"


def test_values_that_do_not_vary_give_no_verdict():
    """Identical paired values (up to rounding): no interval, no lower/higher/within, no
    seeds needed; one phrase that says the seeds did not vary."""
    for ratios in ([0.5, 0.5], [0.5, 0.5 * (1 + 1e-15), 0.5], [0.0, 0.0, 0.001]):
        found = compare_ratios(np.array(ratios), SETTINGS)
        assert found.verdict == f"no verdict: the {len(ratios)} seeds did not vary", ratios
        assert math.isnan(found.ci_low) and math.isnan(found.ci_high) and found.std == 0
        assert math.isnan(found.seeds_needed)
    for margin in (0.02, None):
        found = compare_differences(np.array([0.003, 0.003, 0.003]), SETTINGS, margin)
        assert found.verdict == "no verdict: the 3 seeds did not vary"
        assert math.isnan(found.tost_low) and math.isnan(found.seeds_needed)
    assert compare_differences(np.array([0.0, 0.0]), SETTINGS).verdict.startswith("no verdict")
    # any spread at all is a spread
    assert compare_ratios(np.array([0.5, 0.5001]), SETTINGS).verdict == (
        "lower than ERM (95%, 2 seeds)"
    )


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
        assert tost_p(method - erm, 0.02) == pytest.approx(p_value, rel=1e-12)
        shown = compare_differences(method - erm, SETTINGS, 0.02).verdict.startswith("within")
        assert shown == (p_value < 0.05)
        _, low, high = t_interval(method - erm, 0.90)
        assert shown == (low > -0.02 and high < 0.02)
        seen.add(shown)
    assert seen == {True, False}


def test_utility_verdicts_in_words():
    margin = 0.02
    within = compare_differences(np.array([0.001, -0.002, 0.0005, 0.0]), SETTINGS, margin)
    assert within.verdict == "within ±0.02 of ERM (90%, 4 seeds)"
    lower_but_within = compare_differences(np.array([-0.005, -0.006, -0.0055]), SETTINGS, margin)
    assert lower_but_within.verdict == "within ±0.02 of ERM (90%), though lower (95%, 3 seeds)"
    lower = compare_differences(np.array([-0.05, -0.06, -0.055]), SETTINGS, margin)
    assert lower.verdict == "lower than ERM (95%, 3 seeds)"
    # the fidelity benchmark's relif Worst differences (-0.035, -0.025, -0.006)
    neither = compare_differences(np.array([-0.035, -0.025, -0.006]), SETTINGS, margin)
    assert neither.verdict == "not shown either way with 3 seeds"
    assert neither.estimate == pytest.approx(-0.022)
    without_margin = compare_differences(np.array([0.1, 0.3]), SETTINGS)
    assert without_margin.verdict == "not shown with 2 seeds"


def test_each_verdict_carries_the_p_value_of_its_own_test():
    """A ratio's p is scipy's one-sample t test of the log ratios, a difference's of the
    differences; an equivalence verdict's is statsmodels' paired TOST p-value (the larger of
    the two one-sided ones); below 1 - level exactly where the verdict shows something; NaN
    without an interval. The equivalence bound is the 90% interval's larger end in size."""
    ratios = np.array([0.5, 0.62, 0.41, 0.7])
    cut = compare_ratios(ratios, SETTINGS)
    assert cut.p == pytest.approx(stats.ttest_1samp(np.log(ratios), 0.0).pvalue, rel=1e-12)
    assert cut.p < 0.05 and cut.verdict == "lower than ERM (95%, 4 seeds)"
    erm = np.array([0.50, 0.52, 0.49, 0.51])
    method = erm + np.array([-0.003, 0.001, -0.002, 0.0015])
    within = compare_differences(method - erm, SETTINGS, 0.02)
    assert within.verdict == "within ±0.02 of ERM (90%, 4 seeds)"
    assert within.p == pytest.approx(ttost_paired(method, erm, -0.02, 0.02)[0], rel=1e-12)
    one_sided = [stats.ttest_1samp(method - erm, bound, alternative=side).pvalue
                 for bound, side in ((-0.02, "greater"), (0.02, "less"))]  # fmt: skip
    assert within.p == pytest.approx(max(one_sided), rel=1e-9)
    assert equivalence_bound(within.tost_low, within.tost_high) == pytest.approx(
        max(abs(x) for x in DescrStatsW(method - erm).tconfint_mean(0.10)), rel=1e-12
    )
    lower = compare_differences(np.array([-0.05, -0.06, -0.055]), SETTINGS, 0.02)
    expected = stats.ttest_1samp([-0.05, -0.06, -0.055], 0.0).pvalue
    assert lower.p == pytest.approx(expected, rel=1e-12) and lower.p < 0.05
    neither = compare_differences(np.array([-0.035, -0.025, -0.006]), SETTINGS, 0.02)
    assert neither.p == pytest.approx(t_test_p(np.array([-0.035, -0.025, -0.006])))
    assert neither.p > 0.05 and neither.verdict.startswith("not shown")
    assert math.isnan(compare_ratios(np.array([0.5]), SETTINGS).p)
    assert math.isnan(compare_differences(np.array([0.1, 0.1, 0.1]), SETTINGS, 0.02).p)


def test_the_planning_estimate_says_what_it_is():
    words = "planning estimate at the observed effect, post hoc and not evidence"
    assert planning_estimate(12.0, 0.8) == f"{words}: 12 seeds at 80% power"
    assert planning_estimate(math.nan, 0.8) == f"{words}: more than 1,000 seeds at 80% power"


def test_equivalence_names_the_interval_it_rests_on():
    """Differences -0.002 and +0.002: the 95% interval crosses the margin, the 90% interval
    the two one-sided tests read lies inside it, and the verdict says 90%; the (2 level - 1)
    interval is statsmodels' at that level, for any level."""
    found = compare_differences(np.array([-0.002, 0.002]), SETTINGS, 0.02)
    assert found.verdict == "within ±0.02 of ERM (90%, 2 seeds)"
    assert found.ci_low < -0.02 and found.ci_high > 0.02
    assert (found.tost_low, found.tost_high) == pytest.approx((-0.012628, 0.012628), abs=1e-6)
    rng = np.random.default_rng(11)
    for level in (0.9, 0.95, 0.99):
        values = rng.normal(0.003, 0.01, 5)
        found = compare_differences(values, VerdictSettings(level=level), 0.02)
        expected = DescrStatsW(values).tconfint_mean(2 * (1 - level))
        assert (found.tost_low, found.tost_high) == pytest.approx(expected, abs=1e-12)
        inside = -0.02 < found.tost_low < found.tost_high < 0.02
        assert (tost_p(values, 0.02) < 1 - level) == inside
    assert math.isnan(compare_differences(np.array([0.1, 0.3]), SETTINGS).tost_low)


def chi_square_density(v: float, df: int) -> float:
    return math.exp((df / 2 - 1) * math.log(v) - v / 2 - df / 2 * math.log(2) - math.lgamma(df / 2))


def chi_square_power(upper: float, lower: float, df: int, critical: float) -> float:
    """P(Z + upper > c sqrt(V / df)) + P(Z + lower < -c sqrt(V / df)) over V chi-square(df):
    the exact power of a t test whose statistic is (Z + nc) / sqrt(V / df), integrated with
    scipy over V (independent of the noncentral t's own implementation)."""

    def tails(v: float) -> float:
        scaled = critical * math.sqrt(v / df)
        return (ndtr(upper - scaled) + ndtr(-scaled - lower)) * chi_square_density(v, df)

    ends = stats.chi2.ppf([1e-14, 1 - 1e-14], df)
    return integrate.quad(tails, *ends, points=[max(df - 2, 0.0)], limit=400, epsabs=1e-12)[0]


def chi_square_tost_power(mean: float, std: float, margin: float, n: int, level: float) -> float:
    """Both one-sided tests reject: -margin + c S / sqrt(n) < D < margin - c S / sqrt(n), with
    D normal(mean, std / sqrt(n)) and (n - 1) S^2 / std^2 chi-square(n - 1); integrated with
    scipy over the chi-square."""
    df, critical = n - 1, stats.t.ppf(level, n - 1)

    def inside(v: float) -> float:
        half = margin - critical * std * math.sqrt(v / df) / math.sqrt(n)
        if half <= 0:
            return 0.0
        spread = std / math.sqrt(n)
        probability = ndtr((half - mean) / spread) - ndtr((-half - mean) / spread)
        return probability * chi_square_density(v, df)

    top = df * (margin * math.sqrt(n) / (critical * std)) ** 2  # where the band closes
    ends = stats.chi2.ppf([1e-14, 1 - 1e-14], df)
    return integrate.quad(inside, ends[0], min(ends[1], top), limit=400, epsabs=1e-12)[0]


def test_the_powers_are_exact_at_every_effect_and_spread():
    """A grid of effects and spreads at n = 2..10 (ratios of 2-seed pairs like 0.44 and
    0.53 among them, where scipy's noncentral-t cdf gives NaN at one degree of freedom): the
    t test's and the two one-sided tests' powers are finite, in [0, 1], and within 1e-6 of the
    power integrated over the chi-square distribution."""
    for n in range(2, 11):
        critical = stats.t.ppf(0.975, n - 1)
        for mean in (0.005, 0.05, 0.2, 0.7, 2.0):
            for std in (0.01, 0.13, 0.5, 2.0):
                power = t_test_power(mean / std, n, 0.95)
                nc = mean / std * math.sqrt(n)
                assert 0 <= power <= 1
                assert power == pytest.approx(chi_square_power(nc, nc, n - 1, critical), abs=1e-6)
        for mean in (0.0, 0.004, 0.01, 0.019):
            for std in (0.001, 0.005, 0.02, 0.05):
                power = tost_power(mean, std, 0.02, n, 0.95)
                assert 0 <= power <= 1
                expected = chi_square_tost_power(mean, std, 0.02, n, 0.95)
                assert power == pytest.approx(expected, abs=1e-6), (n, mean, std)


def test_not_shown_never_needs_as_few_seeds_as_failed():
    """Over random paired values at n = 2..10 and at several powers: where a verdict is "not
    shown" with n seeds, the seeds needed are more than n or none (NaN: beyond the cap); the
    same for the two one-sided tests. Two ratios 0.44 and 0.53 need 3 seeds."""
    assert compare_ratios(np.array([0.44, 0.53]), SETTINGS).seeds_needed == 3
    rng = np.random.default_rng(63)
    counted = {"ratio": 0, "equivalence": 0}
    for power in (0.5, 0.8, 0.95):
        settings = VerdictSettings(power=power)
        for _ in range(100):
            n = int(rng.integers(2, 11))
            ratios = np.exp(rng.normal(rng.uniform(-1, 0), rng.uniform(0.01, 1), n))
            found = compare_ratios(ratios, settings)
            if found.verdict.startswith("not shown"):
                counted["ratio"] += 1
                assert math.isnan(found.seeds_needed) or found.seeds_needed > n, (ratios, found)
            differences = rng.normal(rng.uniform(-0.015, 0.015), rng.uniform(0.001, 0.02), n)
            found = compare_differences(differences, settings, 0.02)
            if found.verdict.startswith("not shown"):
                counted["equivalence"] += 1
                assert math.isnan(found.seeds_needed) or found.seeds_needed > n, found
    assert min(counted.values()) > 40


def test_t_test_seeds_needed_is_statsmodels_solve_power():
    for mean, std in ((0.5, 1.0), (0.2, 0.3), (-1.0, 0.8), (0.05, 0.5)):
        solved = TTestPower().solve_power(
            abs(mean) / std, alpha=0.05, power=0.8, alternative="two-sided"
        )
        assert t_test_seeds_needed(mean, std, 0.95, 0.8) == max(2, math.ceil(solved))
    assert math.isnan(t_test_seeds_needed(0.0, 1.0, 0.95, 0.8))
    assert math.isnan(t_test_seeds_needed(1e-4, 1.0, 0.95, 0.8))  # beyond MAX_SEEDS
    assert MAX_SEEDS == 1000


def test_tost_power_is_a_simulations():
    """Simulated two one-sided tests at the seeds `tost_seeds_needed` gives reach the power,
    and the exact power is within 0.03 of the simulated one there (4,000 experiments: a
    binomial standard error below 0.007)."""
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
        ("ratio_floor", 0.0, "ratio floor: must be in (0, 1), got 0.0"),
    ],
)
def test_bad_settings_are_one_line_errors(field, value, message):
    with pytest.raises(UserError, match=re.escape(message)):
        VerdictSettings(**{field: value})
