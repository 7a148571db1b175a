"""Which direction is better for the numbers a trial reports beside its tasks' native metrics.

A task's native metrics declare their own direction (`higher_is_better` of its metric
accumulator, `relif_ray.tasks.base`). The others have one home here: the normalized task
scores and their Worst and Macro (higher is better: the paper's Table 1 scores) and the
fixed-delta audit's Bias and VR (lower is better: violation magnitude and rate, Algorithm 1).
Tune's schedulers and Optuna's objectives take their mode from `tune_mode`, the report's
tables their best-value marks from `Benchmark.metric_directions`.
"""

from __future__ import annotations

from typing import Literal

SUMMARY_HIGHER_IS_BETTER: dict[str, bool] = {
    "score": True,
    "worst": True,
    "macro": True,
    "bias": False,
    "vr": False,
}
"""Summary number -> whether higher is better; `score` stands for every `<task>_score`."""


def higher_is_better(metric: str) -> bool:
    """The direction of a summary number, also as a trial reports it on a split (`val_bias`)."""
    return SUMMARY_HIGHER_IS_BETTER[metric.removeprefix("val_")]


def tune_mode(metric: str) -> Literal["max", "min"]:
    """Ray Tune's and Optuna's mode of a summary number: "max" where higher is better."""
    return "max" if higher_is_better(metric) else "min"
