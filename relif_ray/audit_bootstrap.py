"""The pair bootstrap of the fixed-delta audit (`relif_ray.audit`): how much a Bias moves
with the audit's sampled pairs, for fixed pools. Each replicate resamples, within every task
pair, its S sampled gaps with replacement. It measures the Monte-Carlo uncertainty of the pair
sampling given the pools, not variation across training seeds (the seeds' spread is the report's
± std and its verdicts over seeds)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relif_ray.audit import AuditGaps, Delta, _is_integer, resolve_delta
from relif_ray.errors import UserError


def resample_positions(rng: np.random.Generator, size: int, n_boot: int) -> np.ndarray:
    """`n_boot` resamples with replacement of positions 0..size-1, (n_boot, size): the one
    draw of every pair bootstrap (`bootstrap_bias_cis`, the paired comparisons' two-stage
    bootstrap)."""
    return rng.integers(0, size, size=(n_boot, size))


def bootstrap_bias_ci(
    gaps: AuditGaps,
    delta: Delta,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the aggregate Bias at `delta`.

    Each replicate resamples, within every task pair, its S sampled gaps with replacement and
    recomputes the mean over task pairs. It measures the Monte-Carlo uncertainty of the pair
    sampling given the pools, not variation across training seeds (report mean +- std there).
    """
    return bootstrap_bias_cis(gaps, [delta], n_boot, level, seed)[0]


def bootstrap_bias_cis(
    gaps: AuditGaps,
    deltas: Sequence[Delta],
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[tuple[float, float]]:
    """`bootstrap_bias_ci` at each of `deltas`, from one resampling: the resampled positions
    depend on the seed and the task pairs' sizes only, so each delta's interval is the one
    `bootstrap_bias_ci` gives alone (to float rounding), and the draws (the cost) are made
    once."""
    return bootstrap_bias_cis_batch([(gaps, deltas)], n_boot, level, seed)[0]


def bootstrap_bias_cis_batch(
    requests: Sequence[tuple[AuditGaps, Sequence[Delta]]],
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[list[tuple[float, float]]]:
    """`bootstrap_bias_cis` of each (gaps, deltas) request, as each would be alone (to float
    rounding), from one draw per stratum: requests whose strata have the same sizes in the
    same order draw the same positions from `seed` (each alone starts its own generator at
    `seed`), so their positions are drawn once, turned into counts (`resample_counts`), and
    every request's and delta's resampled means are one matrix product with the hinge values
    (gap - delta)+. A report's Bias intervals (every method, every delta shown) are a handful
    of such batches, not one resampling each."""
    if not (_is_integer(n_boot) and n_boot > 0):
        raise UserError(f"n_boot: must be a positive integer, got {n_boot!r}")
    if not 0.0 < level < 1.0:
        raise UserError(f"level: must be in (0, 1), got {level}")
    by_sizes: dict[tuple[int, ...], list[int]] = {}
    for index, (gaps, _) in enumerate(requests):
        sizes = tuple(values.size for values in gaps.gaps.values())
        by_sizes.setdefault(sizes, []).append(index)
    found: list[list[tuple[float, float]]] = [[] for _ in requests]
    for sizes, members in by_sizes.items():
        batch = _replicates([requests[index] for index in members], sizes, n_boot, seed)
        for index, replicates in zip(members, batch, strict=True):
            tail = (1 - level) / 2
            bounds = np.quantile(replicates, [tail, 1 - tail], axis=1)
            found[index] = [(float(low), float(high)) for low, high in bounds.T]
    return found


def _replicates(
    requests: Sequence[tuple[AuditGaps, Sequence[Delta]]],
    sizes: tuple[int, ...],
    n_boot: int,
    seed: int,
) -> list[np.ndarray]:
    """Per request, (deltas x n_boot): each replicate's mean over strata of the resampled
    mean hinge; every request's strata have `sizes`, so one draw serves them all."""
    keys = [list(gaps.gaps) for gaps, _ in requests]
    thresholds = [
        [resolve_delta(delta, names) for delta in deltas]
        for (_, deltas), names in zip(requests, keys, strict=True)
    ]
    rng = np.random.default_rng(seed)
    replicates = [np.zeros((len(deltas), n_boot)) for _, deltas in requests]
    for stratum, size in enumerate(sizes):
        counts = resample_counts(rng, size, n_boot)
        hinges = [
            np.maximum(gaps.gaps[names[stratum]] - resolved[names[stratum]], 0.0)
            for (gaps, _), names, per_delta in zip(requests, keys, thresholds, strict=True)
            for resolved in per_delta
        ]
        means = counts @ np.stack(hinges, axis=1) / size
        column = 0
        for rows in replicates:
            rows += means[:, column : column + len(rows)].T
            column += len(rows)
    return [rows / len(sizes) for rows in replicates]


def resample_counts(rng: np.random.Generator, size: int, n_boot: int) -> np.ndarray:
    """(n_boot, size): how often each position is drawn in each of `n_boot` resamples with
    replacement (`resample_positions`), so that a resample's mean of any per-pair statistic
    is one row of a matrix product."""
    positions = resample_positions(rng, size, n_boot)
    rows = np.arange(n_boot, dtype=np.int64)[:, None] * size
    flat = np.bincount((positions + rows).ravel(), minlength=n_boot * size)
    return flat.reshape(n_boot, size).astype(np.float64)


__all__ = [
    "bootstrap_bias_ci",
    "bootstrap_bias_cis",
    "bootstrap_bias_cis_batch",
    "resample_counts",
    "resample_positions",
]
