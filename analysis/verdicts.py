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
- **Differences with an equivalence margin m** (Worst and Macro): "within ±m of ERM" where two
  one-sided t tests (Schuirmann 1987; statsmodels' `ttost_mean`) reject both |difference| >= m
  at 1 - level each, i.e. where the (2 level - 1) interval lies inside (-m, m); otherwise
  "lower" or "higher" where the `level` interval excludes 0; else "not shown either way".
- **Differences without a margin** (each task metric, Delta-M%): "higher" / "lower" where the
  interval excludes 0, else "not shown".

The verdict uses the Student-t interval over seeds, not a bootstrap: seeds are the unit of
replication, and at the seed counts of these experiments (2-7) a percentile bootstrap over
seeds covers far less than its nominal level (with 3 seeds it can only take 10 distinct
values), while the t interval is exact for normal paired values and the t test's level is
robust to moderate non-normality. The audit's pair sampling moves a trial's Bias far less
than training seeds do, and it is already part of each seed's value
(`relif_ray.analysis.paired.hierarchical_interval` resamples both levels where n allows).

**Seeds needed**: where a verdict is "not shown", the smallest number of seeds at which a
test at the same level would show the observed paired effect with `power` (default 80%),
taking the observed mean and standard deviation as the truth (statsmodels' `TTestPower` for
the t test; the power of the two one-sided tests from the noncentral t, `tost_power`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import DescrStatsW

from relif_ray.errors import UserError

MAX_SEEDS = 1_000
"""Seeds needed beyond this are reported as not reachable (NaN): the effect is too small for
the observed spread to be worth a number."""


@dataclass(frozen=True)
class VerdictSettings:
    """level: of every interval and test (95%); margin: the equivalence margin of Worst and
    Macro, on the normalized task scores in [0, 1] (docs/analysis.md says why 0.02); power:
    of the seeds-needed computation; n_boot: replicates of the hierarchical bootstrap and of
    the front shares (0: none); min_boot_seeds: fewest seeds for the hierarchical bootstrap."""

    level: float = 0.95
    margin: float = 0.02
    power: float = 0.8
    n_boot: int = 1000
    min_boot_seeds: int = 5

    def __post_init__(self) -> None:
        if not 0.0 < self.level < 1.0:
            raise UserError(f"level: must be in (0, 1), got {self.level}")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise UserError(f"equivalence margin: must be a positive number, got {self.margin}")
        if not 0.0 < self.power < 1.0:
            raise UserError(f"power: must be in (0, 1), got {self.power}")
        if self.n_boot < 0:
            raise UserError(f"n_boot: must be >= 0, got {self.n_boot}")


@dataclass(frozen=True)
class Comparison:
    """One comparison over seeds. estimate, ci_low, ci_high: on the reported scale (a ratio
    for ratio comparisons, else a difference); std: the sample std of the paired values on
    the analysis scale (log ratios, or differences); seeds_needed: NaN unless not shown."""

    n: int
    estimate: float
    ci_low: float
    ci_high: float
    std: float
    verdict: str
    seeds_needed: float


def seeds_phrase(n: int, level: float) -> str:
    """ "(95%, 3 seeds)": the level and the seed count a shown verdict rests on."""
    return f"({level:.0%}, {n} seed{'s' if n != 1 else ''})"


def not_shown(n: int, either_way: bool = False) -> str:
    return f"not shown{' either way' if either_way else ''} with {n} seed{'s' if n != 1 else ''}"


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


def compare_ratios(ratios: np.ndarray, settings: VerdictSettings) -> Comparison:
    """Paired ratios (method / same-seed ERM) on the log scale (module docstring). Values that
    are not finite and positive (an ERM Bias of 0) are left out, and n counts the rest."""
    ratios = np.asarray(ratios, dtype=np.float64)
    logs = np.log(ratios[np.isfinite(ratios) & (ratios > 0)])
    mean, low, high = (float(x) for x in t_interval(logs, settings.level))
    n = logs.size
    if n >= 2 and high < 0:
        verdict = f"lower than ERM {seeds_phrase(n, settings.level)}"
    elif n >= 2 and low > 0:
        verdict = f"higher than ERM {seeds_phrase(n, settings.level)}"
    else:
        verdict = not_shown(n)
    needed = _needed(logs, settings, None) if verdict.startswith("not shown") else math.nan
    return Comparison(n, math.exp(mean), math.exp(low), math.exp(high), _std(logs), verdict, needed)


def compare_differences(
    differences: np.ndarray, settings: VerdictSettings, margin: float | None = None
) -> Comparison:
    """Paired differences (method - same-seed ERM); with `margin`, an equivalence test too
    (module docstring). Values that are not finite are left out."""
    differences = np.asarray(differences, dtype=np.float64)
    differences = differences[np.isfinite(differences)]
    mean, low, high = (float(x) for x in t_interval(differences, settings.level))
    n = differences.size
    shown = seeds_phrase(n, settings.level)
    direction = None
    if n >= 2 and high < 0:
        direction = "lower"
    elif n >= 2 and low > 0:
        direction = "higher"
    if margin is not None and n >= 2 and equivalent(differences, margin, settings.level):
        verdict = f"within ±{margin:g} of ERM" + (f", though {direction}" if direction else "")
        verdict += f" {shown}"
    elif direction:
        verdict = f"{direction} than ERM {shown}"
    else:
        verdict = not_shown(n, either_way=margin is not None)
    needed = _needed(differences, settings, margin) if "not shown" in verdict else math.nan
    return Comparison(n, mean, low, high, _std(differences), verdict, needed)


def equivalent(differences: np.ndarray, margin: float, level: float) -> bool:
    """Two one-sided t tests (statsmodels' `DescrStatsW.ttost_mean`): both H0: mean <= -margin
    and H0: mean >= margin rejected at 1 - level."""
    p_value = DescrStatsW(np.asarray(differences, dtype=np.float64)).ttost_mean(-margin, margin)[0]
    return bool(p_value < 1 - level)


def _std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if values.size >= 2 else math.nan


def _needed(values: np.ndarray, settings: VerdictSettings, margin: float | None) -> float:
    """Seeds needed for a "not shown" verdict, from the observed mean and spread: for the
    equivalence of a difference whose observed mean lies inside the margin, the two one-sided
    tests' seeds; otherwise the t test's (showing the observed effect as lower or higher)."""
    if values.size < 2:
        return math.nan
    mean, std = float(values.mean()), float(values.std(ddof=1))
    if margin is not None and abs(mean) < margin:
        return tost_seeds_needed(mean, std, margin, settings.level, settings.power)
    return t_test_seeds_needed(mean, std, settings.level, settings.power)


def t_test_seeds_needed(mean: float, std: float, level: float, power: float) -> float:
    """Smallest n >= 2 at which the two-sided one-sample t test at 1 - level has `power`
    against a true mean `mean` with standard deviation `std` (statsmodels' `TTestPower`);
    NaN where the effect is 0 or more than `MAX_SEEDS` would be needed."""
    if std == 0 or mean == 0:
        return math.nan
    effect = abs(mean) / std
    return _smallest_n(
        lambda n: TTestPower().power(effect, n, 1 - level, alternative="two-sided"), power
    )


def tost_power(mean: float, std: float, margin: float, n: float, level: float) -> float:
    """Power of the two one-sided tests at 1 - level each with n seeds, against a true mean
    difference `mean` with standard deviation `std`: P(T_low > t_c) + P(T_high < -t_c) - 1
    (floored at 0), with T_low = (D + margin) / SE and T_high = (D - margin) / SE noncentral t
    with n - 1 degrees of freedom. The Bonferroni lower bound of the joint rejection, so the
    seeds needed are at worst slightly more than enough (tests/test_verdicts.py checks it
    against a simulation)."""
    df = n - 1
    critical = stats.t.ppf(level, df)
    scale = math.sqrt(n) / std
    upper = stats.nct.sf(critical, df, (mean + margin) * scale)
    lower = stats.nct.cdf(-critical, df, (mean - margin) * scale)
    return max(float(upper + lower - 1), 0.0)


def tost_seeds_needed(mean: float, std: float, margin: float, level: float, power: float) -> float:
    """Smallest n >= 2 at which `tost_power` reaches `power`; NaN where |mean| >= margin
    (equivalence cannot be shown) or more than `MAX_SEEDS` would be needed."""
    if abs(mean) >= margin:
        return math.nan
    if std == 0:
        return 2.0
    return _smallest_n(lambda n: tost_power(mean, std, margin, n, level), power)


def _smallest_n(power_at: Callable[[int], float], target: float) -> float:
    """The smallest n in [2, MAX_SEEDS] with power_at(n) >= target (both powers grow with n):
    doubling, then bisection; NaN where even MAX_SEEDS falls short. A NaN power counts as
    reached: the noncentral t's series fails only at large noncentrality, where the power is
    1 to double precision (scipy and statsmodels alike, e.g. effect 0.75 at n = 251)."""

    def reached(n: int) -> bool:
        power = power_at(n)
        return math.isnan(power) or power >= target

    high = 2
    while not reached(high):
        if high == MAX_SEEDS:
            return math.nan
        high = min(2 * high, MAX_SEEDS)
    low = high // 2 + 1 if high > 2 else 2
    while low < high:
        middle = (low + high) // 2
        if reached(middle):
            high = middle
        else:
            low = middle + 1
    return float(low)
