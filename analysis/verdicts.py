"""Verdicts over training seeds: what a set of paired per-seed values can show, in words.

A claim about methods is a claim over training seeds. Each seed gives one paired value: a
method's trial against the plain ERM trial of the same seed (same data, same initial weights
where the method allows, same audit pairs): a ratio for Bias and VR, a difference for utility.
This module turns the n paired values of one comparison into an estimate, an interval over
seeds and a verdict; `relif_ray.analysis.paired` builds the comparisons of an experiment.

- **Ratios** (Bias, VR) are compared on the log scale, where 0.5x and 2x are symmetric: the
  estimate is the geometric mean exp(mean log r), the interval exp of the Student-t interval
  of the mean log ratio. Verdict: "lower than ERM" where the interval lies below 1, "higher
  than ERM" where it lies above, else "not shown".
- **Differences with an equivalence margin m** (Worst and Macro): "within ±m of ERM (90%, n
  seeds)" where two one-sided t tests (Schuirmann 1987; statsmodels' `ttost_mean`) reject both
  |difference| >= m at 1 - level each, i.e. where the (2 level - 1) interval (90% at level 95%:
  `Comparison.tost_low`/`tost_high`) lies inside (-m, m); ", though lower (95%)" where the
  `level` interval also excludes 0; otherwise "lower" or "higher" where the `level` interval
  excludes 0; else "not shown either way".
- **Differences without a margin** (each task metric, Delta-M%): "higher" / "lower" where the
  interval excludes 0, else "not shown".
- **No spread**: where every paired value is the same (up to rounding, `without_spread`) there
  is no interval and no verdict: "no verdict: the n seeds did not vary".
- **A ratio of 0** (the method's Bias is 0 at a seed: the best outcome there is) has no log:
  it counts at `VerdictSettings.ratio_floor`, or at the comparison's smallest positive ratio
  where that is lower (`zero_ratio`), so that seed counts, as the best outcome, in n, the
  estimate and the interval; positive ratios are taken as they are. A ratio that is not
  finite (the ERM trial's Bias is 0) has no value to compare and is left out;
  `relif_ray.analysis.paired` names such seeds.

The verdict uses the Student-t interval over seeds, not a bootstrap: seeds are the unit of
replication, and at the seed counts of these experiments (2-7) a percentile bootstrap over
seeds covers far less than its nominal level (with 3 seeds it can only take 10 distinct
values), while the t interval is exact for normal paired values. Under strongly skewed
per-seed effects it covers less than nominal (docs/analysis.md gives the figures of
benchmarks/verdict_coverage.py). The audit's pair sampling moves a trial's Bias far less
than training seeds do, and it is already part of each seed's value
(`relif_ray.analysis.paired.hierarchical_intervals` resamples both levels where n allows).

**p-values** (`Comparison.p`): each verdict's test, for the adjustment over a report's family
of verdicts (`relif_ray.analysis.family`): the two-sided paired t test of the mean log ratio,
or of the mean difference, against 0 (`t_test_p`), whose rejection at 1 - level is the
`level` interval excluding 0; for a verdict of equivalence ("within ±m") the two one-sided
tests' p-value, the larger of the two (`tost_p`), whose rejection at 1 - level is the
(2 level - 1) interval inside (-m, m). NaN where there is no interval (fewer than two seeds,
or no spread). `equivalence_bound` is the smallest margin that interval lies within.

**Seeds needed**: where a verdict is "not shown" with n seeds, a planning estimate
(`planning_estimate`: post hoc, at the observed effect, not evidence): the smallest number of
seeds above n at which a test at the same level would have `power` (default 80%) against an
effect of the observed size, taking the observed mean and standard deviation as the truth: the
exact power of the t test from the noncentral t (`t_test_power`) and of the two one-sided
tests by integration over the sample standard deviation's distribution (`tost_power`). NaN
("none would") where more than `MAX_SEEDS` would be needed or the observed effect is 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import integrate, stats
from statsmodels.stats.weightstats import DescrStatsW

from relif_ray.errors import UserError

MAX_SEEDS = 1_000
"""Seeds needed beyond this are reported as not reachable (NaN): the effect is too small for
the observed spread to be worth a number."""
TAIL_MASS = 1e-15
"""Mass of the sample standard deviation's distribution left out of `tost_power`'s integral
(each side): far below any power worth reporting."""


@dataclass(frozen=True)
class VerdictSettings:
    """level: of every interval and test (95%); margin: the equivalence margin of Worst and
    Macro, on the normalized task scores in [0, 1] (docs/analysis.md says why 0.02); power:
    of the seeds-needed computation; n_boot: replicates of the hierarchical bootstrap and of
    the front shares (0: none); min_boot_seeds: fewest seeds for the hierarchical bootstrap;
    ratio_floor: where a per-seed ratio of 0 (the method's Bias is 0 at that seed) counts on
    the log scale, unless a positive ratio of the comparison is lower (`zero_ratio`;
    docs/analysis.md says why 0.01)."""

    level: float = 0.95
    margin: float = 0.02
    power: float = 0.8
    n_boot: int = 1000
    min_boot_seeds: int = 5
    ratio_floor: float = 0.01

    def __post_init__(self) -> None:
        if not 0.0 < self.level < 1.0:
            raise UserError(f"level: must be in (0, 1), got {self.level}")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise UserError(f"equivalence margin: must be a positive number, got {self.margin}")
        if not 0.0 < self.power < 1.0:
            raise UserError(f"power: must be in (0, 1), got {self.power}")
        if self.n_boot < 0:
            raise UserError(f"n_boot: must be >= 0, got {self.n_boot}")
        if not 0.0 < self.ratio_floor < 1.0:
            raise UserError(f"ratio floor: must be in (0, 1), got {self.ratio_floor}")


@dataclass(frozen=True)
class Comparison:
    """One comparison over seeds. estimate, ci_low, ci_high: on the reported scale (a ratio
    for ratio comparisons, else a difference); std: the sample std of the paired values on
    the analysis scale (log ratios, or differences); seeds_needed: NaN unless not shown;
    tost_low, tost_high: the (2 level - 1) interval the equivalence test reads (NaN without a
    margin); ci_low, ci_high and tost_low, tost_high are NaN where the values do not vary;
    p: the p-value of the verdict's test (module docstring; NaN without an interval)."""

    n: int
    estimate: float
    ci_low: float
    ci_high: float
    std: float
    verdict: str
    seeds_needed: float
    tost_low: float = math.nan
    tost_high: float = math.nan
    p: float = math.nan


def seeds_phrase(n: int, level: float) -> str:
    """ "(95%, 3 seeds)": the level and the seed count a shown verdict rests on."""
    return f"({level:.0%}, {n} seed{'s' if n != 1 else ''})"


def not_shown(n: int, either_way: bool = False) -> str:
    return f"not shown{' either way' if either_way else ''} with {n} seed{'s' if n != 1 else ''}"


def is_shown(verdict: str) -> bool:
    """Whether a verdict shows something: lower, higher or within a margin (not "not shown",
    "no verdict", "reference", ...)."""
    return verdict.startswith(("lower than ERM", "higher than ERM", "within ±"))


def planning_estimate(seeds_needed: float, power: float) -> str:
    """How a report words `Comparison.seeds_needed` of a verdict that is not shown: a planning
    figure for a next experiment, computed post hoc at the observed effect, not evidence of
    an effect; NaN: more than `MAX_SEEDS`."""
    seeds = f"more than {MAX_SEEDS:,}" if math.isnan(seeds_needed) else f"{int(seeds_needed)}"
    return (
        "planning estimate at the observed effect, post hoc and not evidence: "
        f"{seeds} seeds at {power:.0%} power"
    )


NO_SPREAD = "no verdict"
"""How a verdict without spread starts (`no_spread`)."""


def no_spread(n: int) -> str:
    """The verdict of paired values that are the same at every seed."""
    return f"{NO_SPREAD}: the {n} seeds did not vary"


def equivalence_level(level: float) -> float:
    """The level of the interval the two one-sided tests at 1 - level each read: 2 level - 1
    (90% at 95%)."""
    return 2 * level - 1


def t_interval(values: np.ndarray, level: float) -> tuple:
    """Mean and the Student-t interval of the mean, mean ± t_{(1+level)/2, n-1} s / sqrt(n),
    along the last axis (one experiment per row of a 2-D array: the coverage simulation of
    tests/test_verdicts.py); NaN bounds for fewer than two values."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[-1]
    mean = values.mean(axis=-1) if n else np.full(values.shape[:-1], np.nan)
    if n < 2:
        return mean, mean * np.nan, mean * np.nan
    half = stats.t.ppf((1 + level) / 2, n - 1) * values.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def without_spread(values: np.ndarray) -> bool:
    """Two or more values that are all the same up to rounding (a range within 1e-12 of
    their size): no interval over seeds can be drawn from them."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return False
    return bool(np.ptp(values) <= 1e-12 * max(1.0, float(np.abs(values).max())))


def zero_ratio(ratios: np.ndarray, floor: float) -> float:
    """The ratio a ratio of 0 counts at among `ratios`: `floor`, or the smallest positive
    ratio where one lies below it, so that a 0 ranks with the best outcome of its comparison
    and positive ratios are never changed."""
    ratios = np.asarray(ratios, dtype=np.float64)
    positive = ratios[np.isfinite(ratios) & (ratios > 0)]
    return float(min(floor, positive.min())) if positive.size else floor


def log_ratios(ratios: np.ndarray, floor: float) -> np.ndarray:
    """The log of every finite ratio, a ratio of 0 counted at `zero_ratio`; ratios that are
    not finite (no ERM value to compare with) are left out."""
    ratios = np.asarray(ratios, dtype=np.float64)
    kept = ratios[np.isfinite(ratios) & (ratios >= 0)]
    return np.log(np.where(kept > 0, kept, zero_ratio(kept, floor)))


def compare_ratios(ratios: np.ndarray, settings: VerdictSettings) -> Comparison:
    """Paired ratios (method / same-seed ERM) on the log scale (module docstring): a ratio of
    0 counts at `zero_ratio`; values that are not finite (an ERM Bias of 0) are
    left out, and n counts the rest."""
    logs = log_ratios(ratios, settings.ratio_floor)
    mean, low, high = (float(x) for x in t_interval(logs, settings.level))
    n = logs.size
    if without_spread(logs):
        return Comparison(n, math.exp(mean), math.nan, math.nan, 0.0, no_spread(n), math.nan)
    p = t_test_p(logs)
    if n >= 2 and high < 0:
        verdict = f"lower than ERM {seeds_phrase(n, settings.level)}"
    elif n >= 2 and low > 0:
        verdict = f"higher than ERM {seeds_phrase(n, settings.level)}"
    else:
        verdict = not_shown(n)
    needed = _needed(logs, settings, None) if verdict.startswith("not shown") else math.nan
    return Comparison(
        n, math.exp(mean), math.exp(low), math.exp(high), _std(logs), verdict, needed, p=p
    )


def compare_differences(
    differences: np.ndarray, settings: VerdictSettings, margin: float | None = None
) -> Comparison:
    """Paired differences (method - same-seed ERM); with `margin`, an equivalence test too
    (module docstring). Values that are not finite are left out."""
    differences = np.asarray(differences, dtype=np.float64)
    differences = differences[np.isfinite(differences)]
    mean, low, high = (float(x) for x in t_interval(differences, settings.level))
    n = differences.size
    if without_spread(differences):
        return Comparison(n, mean, math.nan, math.nan, 0.0, no_spread(n), math.nan)
    tost_low = tost_high = tost = math.nan
    if margin is not None:
        inner = equivalence_level(settings.level)
        _, tost_low, tost_high = (float(x) for x in t_interval(differences, inner))
        tost = tost_p(differences, margin)
    shown = seeds_phrase(n, settings.level)
    direction = None
    if n >= 2 and high < 0:
        direction = "lower"
    elif n >= 2 and low > 0:
        direction = "higher"
    p = t_test_p(differences)
    if tost < 1 - settings.level:  # both one-sided tests reject (NaN: no margin, or n < 2)
        inner_shown = seeds_phrase(n, equivalence_level(settings.level))
        verdict = f"within ±{margin:g} of ERM"
        if direction:
            verdict += f" ({equivalence_level(settings.level):.0%}), though {direction} {shown}"
        else:
            verdict += f" {inner_shown}"
        p = tost
    elif direction:
        verdict = f"{direction} than ERM {shown}"
    else:
        verdict = not_shown(n, either_way=margin is not None)
    needed = _needed(differences, settings, margin) if "not shown" in verdict else math.nan
    return Comparison(
        n, mean, low, high, _std(differences), verdict, needed, tost_low, tost_high, p
    )


def tost_p(differences: np.ndarray, margin: float) -> float:
    """The p-value of the two one-sided t tests of equivalence within ±margin (statsmodels'
    `DescrStatsW.ttost_mean`): the larger of the p-values of H0: mean <= -margin and of H0:
    mean >= margin, so that both are rejected at 1 - level where it is below; NaN for fewer
    than two values or values without spread (`without_spread`)."""
    values = np.asarray(differences, dtype=np.float64)
    if values.size < 2 or without_spread(values):
        return math.nan
    return float(DescrStatsW(values).ttost_mean(-margin, margin)[0])


def t_test_p(values: np.ndarray) -> float:
    """The two-sided p-value of the one-sample t test of mean 0 (statsmodels'
    `DescrStatsW.ttest_mean`); NaN for fewer than two values or values without spread."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or without_spread(values):
        return math.nan
    return float(DescrStatsW(values).ttest_mean(0.0)[1])


def equivalence_bound(tost_low: float, tost_high: float) -> float:
    """The smallest symmetric margin m with the equivalence test's (2 level - 1) interval
    inside [-m, m]: the margin those seeds reach, for a reader to hold against their own
    (stated in advance); NaN without an interval."""
    return float(np.max(np.abs([tost_low, tost_high])))


def _std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if values.size >= 2 else math.nan


def _needed(values: np.ndarray, settings: VerdictSettings, margin: float | None) -> float:
    """Seeds needed for a "not shown" verdict with n = values.size seeds, from the observed
    mean and spread, more than n: for the equivalence of a difference whose observed mean
    lies inside the margin, the two one-sided tests' seeds; otherwise the t test's (showing
    the observed effect as lower or higher)."""
    n = values.size
    if n < 2:
        return math.nan
    mean, std = float(values.mean()), float(values.std(ddof=1))
    if margin is not None and abs(mean) < margin:
        return tost_seeds_needed(mean, std, margin, settings.level, settings.power, n)
    return t_test_seeds_needed(mean, std, settings.level, settings.power, n)


def t_test_power(effect: float, n: int, level: float) -> float:
    """Exact power of the two-sided one-sample t test at 1 - level with n values against a
    standardized true mean `effect` (mean / std): P(T > t_c) + P(T < -t_c) with T noncentral
    t with n - 1 degrees of freedom and noncentrality effect sqrt(n). Both tails are scipy's
    `nct.sf` (the lower one as the upper tail of -T, noncentrality -effect sqrt(n)): its
    `nct.cdf` gives NaN for a negligible lower tail (at 1 degree of freedom and large
    noncentrality), and statsmodels' `TTestPower` with it."""
    df = n - 1
    critical = stats.t.ppf((1 + level) / 2, df)
    noncentrality = effect * math.sqrt(n)
    upper = stats.nct.sf(critical, df, noncentrality)
    lower = stats.nct.sf(critical, df, -noncentrality)
    return float(upper + lower)


def t_test_seeds_needed(
    mean: float, std: float, level: float, power: float, more_than: int = 1
) -> float:
    """Smallest n > `more_than` (and >= 2) at which the two-sided one-sample t test at
    1 - level has `power` against a true mean `mean` with standard deviation `std`
    (`t_test_power`); NaN where the effect is 0 or more than `MAX_SEEDS` would be needed."""
    if std == 0 or mean == 0:
        return math.nan
    effect = abs(mean) / std
    return _smallest_n(lambda n: t_test_power(effect, n, level), power, more_than)


def tost_power(mean: float, std: float, margin: float, n: int, level: float) -> float:
    """Exact power of the two one-sided tests at 1 - level each with n values, against a true
    mean difference `mean` with standard deviation `std` > 0. With Z = sqrt(n) (D - mean) /
    std standard normal and U = sqrt(n - 1) S / std chi-distributed with n - 1 degrees of
    freedom (independent), both tests reject where c U / sqrt(n - 1) - b < Z < a - c U /
    sqrt(n - 1), a = sqrt(n) (margin - mean) / std, b = sqrt(n) (margin + mean) / std, c the
    one-sided critical t; so the power is the integral over U of Phi(a - c u') - Phi(c u' - b)
    (u' = u / sqrt(n - 1)) where positive (Owen 1965), by quadrature over the chi
    distribution's bulk (`TAIL_MASS` left out each side)."""
    df = n - 1
    critical = stats.t.ppf(level, df)
    root_n = math.sqrt(n)
    a, b = root_n * (margin - mean) / std, root_n * (margin + mean) / std
    low = float(stats.chi.ppf(TAIL_MASS, df))
    high = min(float(stats.chi.isf(TAIL_MASS, df)), math.sqrt(df) * (a + b) / (2 * critical))
    if high <= low:
        return 0.0
    log_norm = (df / 2 - 1) * math.log(2) + math.lgamma(df / 2)  # chi density's constant
    step = critical / math.sqrt(df)

    def density(u: float) -> float:
        inside = _normal_cdf(a - step * u) - _normal_cdf(step * u - b)
        return inside * math.exp((df - 1) * math.log(u) - u * u / 2 - log_norm)

    mode = math.sqrt(max(df - 1, 0))
    points = [mode] if low < mode < high else None
    value = integrate.quad(density, low, high, points=points, epsabs=1e-12, limit=200)[0]
    return min(max(value, 0.0), 1.0)


def _normal_cdf(x: float) -> float:
    """The standard normal cdf of one number (math.erfc: exact in both tails, and fast
    inside a quadrature)."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


def tost_seeds_needed(
    mean: float, std: float, margin: float, level: float, power: float, more_than: int = 1
) -> float:
    """Smallest n > `more_than` (and >= 2) at which `tost_power` reaches `power`; NaN where
    |mean| >= margin (equivalence cannot be shown), std is 0, or more than `MAX_SEEDS` would
    be needed."""
    if abs(mean) >= margin or std == 0:
        return math.nan
    return _smallest_n(lambda n: tost_power(mean, std, margin, n, level), power, more_than)


def _smallest_n(power_at: Callable[[int], float], target: float, more_than: int = 1) -> float:
    """The smallest n in (more_than, MAX_SEEDS], n >= 2, with power_at(n) >= target (both
    powers grow with n): doubling, then bisection; NaN where even MAX_SEEDS falls short.
    Searching above the seeds that failed keeps "not shown with n seeds" from ever naming n
    or fewer seeds as enough."""
    first = max(2, more_than + 1)
    if first > MAX_SEEDS:
        return math.nan

    def reached(n: int) -> bool:
        return power_at(n) >= target

    low, high = first, first
    while not reached(high):
        if high == MAX_SEEDS:
            return math.nan
        low, high = high + 1, min(2 * high, MAX_SEEDS)
    while low < high:
        middle = (low + high) // 2
        if reached(middle):
            high = middle
        else:
            low = middle + 1
    return float(low)
