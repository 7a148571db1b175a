"""How delta_ref is chosen and how far a method's own thresholds drift from it (appendix B).

The fixed-delta audit (`relif_ray.audit`, Algorithm 1) holds one threshold delta_ref fixed for
every method. This module holds what surrounds that threshold, over the SAME pairs the audit
samples (same pools, same seeds, `relif_ray.audit.sample_pairs`):

- calibration: the reference-pair distances (1 - cos(f(x), f(y))) / 2 of a reference model's
  shared representations (`pair_distances`), read as delta_ref by a quantile
  (`delta_from_quantile`: delta_p75, delta_p50) or split-conformally (`conformal_delta`,
  Theorem B.3);
- threshold drift, diagnostics only and never the audit: a method's induced thresholds
  delta_m,ab (`induced_thresholds`), its drift budget eps_m (`drift_budget`) and the ranking
  certificate of Theorem B.2 (`ranking_is_robust`).

Everything is vectorised numpy; nothing here needs torch or storage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import pandas as pd

from relif_ray.audit import (
    AuditSettings,
    Delta,
    PairKey,
    resolve_delta,
    sample_pairs,
    validate_scores,
)
from relif_ray.errors import UserError


def pair_distances(
    scores: pd.DataFrame,
    example_ids: Sequence | np.ndarray,
    embeddings: np.ndarray,
    *,
    settings: AuditSettings = AuditSettings(),
) -> dict[PairKey, np.ndarray]:
    """Per task pair, the cosine-induced distances (1 - cos(f(x), f(y))) / 2 of the
    L2-normalized shared representations over the SAME S pairs the audit samples (same pools,
    same seeds): the reference-pair distances of Theorem B.3. A reference model's distances,
    pooled over task pairs, are the distribution delta_ref is read from (its 75th percentile
    is delta_p75, `delta_from_quantile`; `relif_ray.analysis.delta`); their per-pair means are a
    model's induced thresholds (`induced_thresholds`).

    example_ids, embeddings: the model's shared representation, row i of `embeddings` (N, D)
    belonging to example_ids[i]; `scores` needs an `example_id` column.
    """
    frame = validate_scores(scores)
    if "example_id" not in frame.columns:
        raise UserError("scores: reference distances need an 'example_id' column")
    matrix = np.asarray(embeddings, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != len(example_ids):
        raise UserError("embeddings: need one row per example id")
    positions = pd.Index(example_ids).get_indexer(frame["example_id"])
    if (positions < 0).any():
        missing = frame["example_id"].to_numpy()[positions < 0][0]
        raise UserError(f"embeddings: no representation for example_id {missing!r}")
    rows = unit_rows(matrix)[positions]
    sampled = sample_pairs(frame, settings=settings)
    return {key: cosine_distances(rows, x, y) for key, (x, y) in sampled.items()}


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """The rows of `matrix` scaled to unit L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def cosine_distances(unit: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(1 - cos) / 2 of rows x[i] and y[i] of the unit-norm matrix `unit`, in [0, 1]."""
    cosine = np.einsum("ij,ij->i", unit[x], unit[y])
    return (1 - np.clip(cosine, -1, 1)) / 2


def induced_thresholds(
    scores: pd.DataFrame,
    example_ids: Sequence | np.ndarray,
    embeddings: np.ndarray,
    *,
    settings: AuditSettings = AuditSettings(),
) -> dict[PairKey, float]:
    """Method-induced thresholds delta_m,ab: diagnostics of threshold drift, never the audit.

    The paper derives them from "cosine distances between normalized task prototypes" of the
    model's own representation (section 3.2, threshold-drift table) without a formula. Ours:
    for each task pair, the mean of `pair_distances`, the cosine-induced distance between the
    L2-normalized shared representations over the SAME S pairs the audit samples (same pools,
    same seeds), i.e. the representation-scale tolerance that pair distribution induces. We
    do not use class means of each task's pool: where all tasks share the same inputs (NYUv2)
    those means coincide and every threshold would collapse to ~0.
    """
    distances = pair_distances(scores, example_ids, embeddings, settings=settings)
    return {key: float(values.mean()) for key, values in distances.items()}


def _finite_values(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0 or not np.isfinite(array).all():
        raise UserError(f"{name}: need at least one value, all finite")
    return array


def delta_from_quantile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """delta_ref as the q-quantile of a reference distribution (e.g. q=0.75 for delta_p75),
    with numpy's default linear interpolation."""
    if not 0.0 <= q <= 1.0:
        raise UserError(f"q: must be in [0, 1], got {q}")
    return float(np.quantile(_finite_values(values, "values"), q))


def conformal_delta(distances: Sequence[float] | np.ndarray, alpha: float) -> float:
    """Split-conformal delta_ref (Theorem B.3): k = ceil((n + 1)(1 - alpha)); the k-th smallest
    distance if k <= n, else 1. Then P(D_new > delta) <= alpha for an exchangeable new pair.

    k is computed in exact rational arithmetic on alpha's float value, so (n + 1)(1 - alpha)
    landing on an integer is not pushed up by rounding.
    """
    if not 0.0 < alpha < 1.0:
        raise UserError(f"alpha: must be in (0, 1), got {alpha}")
    ordered = np.sort(_finite_values(distances, "distances"))
    k = math.ceil((ordered.size + 1) * (1 - Fraction(alpha)))
    return float(ordered[k - 1]) if k <= ordered.size else 1.0


def drift_budget(
    induced: Mapping[PairKey, float],
    ref: Delta,
    weights: Mapping[PairKey, float] | None = None,
) -> float:
    """eps_m = sum_ab w_ab |delta_m,ab - delta_ref,ab| (Theorem B.2).

    weights default to the fixed-delta audit's task-pair frequencies, 1 / #pairs each.
    """
    keys = list(induced)
    reference = resolve_delta(ref, keys)
    if weights is None:
        weights = dict.fromkeys(keys, 1.0 / len(keys))
    missing = [key for key in keys if key not in weights]
    if missing:
        raise UserError(f"weights: no weight for task pair {missing[0]}")
    return float(sum(weights[key] * abs(induced[key] - reference[key]) for key in keys))


ROBUSTNESS_TOLERANCE = 1e-9
"""How far |B_A - B_B| must exceed eps_A + eps_B to count. The theorem's bound is exact in real
numbers, but a Bias is a floating-point mean whose rounding can move it by a few ulps, enough
to flip a ranking whose margin beats the budget by less than that."""


def ranking_is_robust(bias_a: float, bias_b: float, eps_a: float, eps_b: float) -> bool:
    """Theorem B.2: if |B_A - B_B| > eps_A + eps_B under delta_ref, replacing it by the
    method-induced thresholds cannot reverse the Bias ordering of A and B. A margin within
    `ROBUSTNESS_TOLERANCE` of the budget is not counted as robust."""
    return abs(bias_a - bias_b) > eps_a + eps_b + ROBUSTNESS_TOLERANCE


__all__ = [
    "ROBUSTNESS_TOLERANCE",
    "conformal_delta",
    "cosine_distances",
    "delta_from_quantile",
    "drift_budget",
    "induced_thresholds",
    "pair_distances",
    "ranking_is_robust",
]
