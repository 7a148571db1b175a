"""Coverage of the intervals over seeds behind the report's verdicts, by simulation with a known
truth (docs/analysis.md, "Verdicts over seeds", quotes its figures):

1. the verdict's Student-t interval of the mean log ratio when the per-seed log ratios are
   skewed (standardized gamma noise: skewness 2 / sqrt(shape); normal for reference);
2. paired.csv's hierarchical interval (`relif_ray.analysis.paired.hierarchical_intervals`:
   seeds, then the audit's pairs, bootstrap-t) against the percentile interval of the same
   two-stage resampling and the t interval, on simulated audit gaps.

    python -m benchmarks.verdict_coverage                # the documented figures (minutes)
    python -m benchmarks.verdict_coverage --quick        # a tenth of the experiments

Each line is the share of simulated experiments whose 95% interval holds the truth.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from relif_ray.analysis.paired import log_scale, pair_bootstrap, seed_bootstrap_t
from relif_ray.analysis.verdicts import VerdictSettings, t_interval

LEVEL = 0.95
SEED_COUNTS = (2, 3, 5, 7, 10)
SHAPES = (math.inf, 16.0, 4.0, 1.0, 0.25)
"""Gamma shapes of the per-seed noise: skewness 0 (normal), 0.5, 1, 2 and 4."""
SEED_SPREAD = 0.3
"""Standard deviation of the per-seed log ratio (training seeds)."""
DELTA = 0.5
TASK_PAIRS = 3
SHARED = 0.5
"""Share of a method's sampled gaps that are the ERM trial's gap of the same pair (the audit
samples the same example pairs for both trials), the rest independent."""


def skewed_noise(rng: np.random.Generator, shape: float, size: tuple) -> np.ndarray:
    """Noise of mean 0 and standard deviation 1: standardized gamma(shape), normal at inf."""
    if math.isinf(shape):
        return rng.standard_normal(size)
    return (rng.gamma(shape, 1.0, size) - shape) / math.sqrt(shape)


def t_coverage(experiments: int, seed: int) -> dict[tuple[float, int], float]:
    """(shape, n) -> coverage of the t interval of the mean log ratio over n seeds."""
    rng = np.random.default_rng(seed)
    truth = math.log(0.6)
    coverage = {}
    for shape in SHAPES:
        for n in SEED_COUNTS:
            logs = truth + SEED_SPREAD * skewed_noise(rng, shape, (experiments, n))
            _, low, high = t_interval(logs, LEVEL)
            coverage[shape, n] = float(np.mean((low <= truth) & (truth <= high)))
    return coverage


def true_log_ratio(location: float) -> float:
    """E over seeds of log(Bias_method / Bias_ERM) in the gap model of `simulated_gaps`:
    gaps are exponential(1) for ERM and scale c times that for the method, so at delta the
    Bias is e^-delta and c e^(-delta / c); log c is normal(location, SEED_SPREAD). By
    Gauss-Hermite quadrature over log c."""
    nodes, weights = hermegauss(80)
    scale = np.exp(location + SEED_SPREAD * nodes)
    per_seed = np.log(scale) - DELTA / scale + DELTA
    return float(weights @ per_seed / weights.sum())


def simulated_gaps(
    rng: np.random.Generator, location: float, n: int, pairs: int
) -> list[tuple[dict, dict]]:
    """n seeds of (method's, ERM's) sampled gaps, `pairs` per task pair."""
    seeds = []
    for _ in range(n):
        scale = math.exp(location + SEED_SPREAD * rng.standard_normal())
        method, erm = {}, {}
        for task_pair in range(TASK_PAIRS):
            theirs = rng.exponential(1.0, pairs)
            own = np.where(rng.random(pairs) < SHARED, theirs, rng.exponential(1.0, pairs))
            method[f"pair{task_pair}"], erm[f"pair{task_pair}"] = scale * own, theirs
        seeds.append((method, erm))
    return seeds


def hierarchical_coverage(
    experiments: int, n: int, pairs: int, n_boot: int, seed: int
) -> dict[str, float]:
    """Coverage of the bootstrap-t, the two-stage percentile interval and the t interval of
    the mean Bias log ratio over n seeds of simulated gaps."""
    rng = np.random.default_rng(seed)
    location = math.log(0.6)
    truth = true_log_ratio(location)
    settings = VerdictSettings(n_boot=n_boot, level=LEVEL)
    tail = (1 - LEVEL) / 2
    hits = {"bootstrap-t": 0, "percentile": 0, "t interval": 0}
    for _ in range(experiments):
        within = [
            pair_bootstrap(method, erm, {"d": DELTA}, n_boot, rng)["bias", "d"]
            for method, erm in simulated_gaps(rng, location, n, pairs)
        ]
        observed, replicates = log_scale(
            np.array([value for value, _ in within]),
            np.stack([values for _, values in within]),
            settings.ratio_floor,
        )
        low, high = seed_bootstrap_t(observed, replicates, LEVEL, rng)
        hits["bootstrap-t"] += low <= truth <= high
        drawn = replicates[rng.integers(0, n, (n_boot, n)), rng.integers(0, n_boot, (n_boot, n))]
        low, high = np.quantile(drawn.mean(axis=1), [tail, 1 - tail])
        hits["percentile"] += low <= truth <= high
        _, low, high = t_interval(observed, LEVEL)
        hits["t interval"] += low <= truth <= high
    return {name: count / experiments for name, count in hits.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the experiments")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    experiments = 20_000 // scale
    print(f"t interval of the mean log ratio, {LEVEL:.0%}, {experiments:,} experiments each")
    print("| skewness | " + " | ".join(f"{n} seeds" for n in SEED_COUNTS) + " |")
    print("|---|" + "---|" * len(SEED_COUNTS))
    coverage = t_coverage(experiments, seed=1)
    for shape in SHAPES:
        skewness = 0.0 if math.isinf(shape) else 2 / math.sqrt(shape)
        cells = " | ".join(f"{coverage[shape, n]:.3f}" for n in SEED_COUNTS)
        print(f"| {skewness:g} | {cells} |")
    experiments = 2_000 // scale
    print(
        f"\nhierarchical interval, {LEVEL:.0%}, {experiments:,} experiments each, "
        f"{TASK_PAIRS} task pairs of 128 sampled gaps, 500 resamples"
    )
    print("| seeds | bootstrap-t | two-stage percentile | t interval |")
    print("|---|---|---|---|")
    for n in (5, 10):
        found = hierarchical_coverage(experiments, n, pairs=128, n_boot=500, seed=n)
        print(
            f"| {n} | {found['bootstrap-t']:.3f} | {found['percentile']:.3f} | "
            f"{found['t interval']:.3f} |"
        )


if __name__ == "__main__":
    main()
