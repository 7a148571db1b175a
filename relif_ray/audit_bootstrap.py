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
    `bootstrap_bias_ci` gives alone, bit for bit, and the draws and gathers (the cost) are
    made once."""
    if not (_is_integer(n_boot) and n_boot > 0):
        raise UserError(f"n_boot: must be a positive integer, got {n_boot!r}")
    if not 0.0 < level < 1.0:
        raise UserError(f"level: must be in (0, 1), got {level}")
    resolved = [resolve_delta(delta, list(gaps.gaps)) for delta in deltas]
    rng = np.random.default_rng(seed)
    replicates = np.zeros((len(deltas), n_boot))
    for key, values in gaps.gaps.items():
        resampled = values[resample_positions(rng, values.size, n_boot)]
        for row, thresholds in enumerate(resolved):
            replicates[row] += np.maximum(resampled - thresholds[key], 0.0).mean(axis=1)
    replicates /= len(gaps.gaps)
    tail = (1 - level) / 2
    bounds = np.quantile(replicates, [tail, 1 - tail], axis=1)
    return [(float(low), float(high)) for low, high in bounds.T]


__all__ = ["bootstrap_bias_ci", "bootstrap_bias_cis", "resample_positions"]
