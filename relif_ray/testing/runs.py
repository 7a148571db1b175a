"""How far apart two training runs ended: the CUDA graph's tests and benchmark compare a
graphed run with eager ones by it."""

from __future__ import annotations

from relif_ray.engine import TrainingRun


def largest_relative_difference(a: TrainingRun, b: TrainingRun) -> float:
    """Over every traced number and every weight: |a - b| relative to the larger of the two
    (a weight: relative to its tensor's largest magnitude)."""
    worst = 0.0
    for row_a, row_b in zip(a.trace, b.trace, strict=True):
        for key, value in row_a.items():
            scale = max(abs(value), abs(row_b[key]), 1e-12)
            worst = max(worst, abs(value - row_b[key]) / scale)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        scale = pa.detach().abs().max().clamp_min(1e-12)
        worst = max(worst, float((pa - pb).abs().max() / scale))
    return worst
