"""Interleaved step timing shared by the step-time benchmarks.

Machines are noisy (other processes, frequency scaling), so variants are never timed one after
the other: every round runs one step of each variant in a freshly shuffled order, and a ratio
is the median over rounds of the per-round ratio, with a distribution-free ~95% interval.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable

import torch

Step = Callable[[], None]

TIMING_SQUASH_BAND = {"depth": [0.0, 10.0], "normal": [0.0, 10.0]}
"""Depth/normal squash constants of timed ReLiF runs on NYUv2. A sweep takes them from the
same-seed ERM validation run; where the band lies changes no amount of work in a step."""


def interleaved_times(
    steps: dict[str, Step], rounds: int, warmup: int, cuda: bool
) -> dict[str, list[float]]:
    """Per-variant list of step times (s); `warmup` untimed rounds first."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    shuffler = random.Random(0)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    for round_index in range(warmup + rounds):
        order = list(steps)
        shuffler.shuffle(order)
        for name in order:
            synchronize()
            start = time.perf_counter()
            steps[name]()
            synchronize()
            if round_index >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def ratio_with_interval(
    times: dict[str, list[float]], name: str, reference: str
) -> tuple[float, float, float]:
    """Median of the per-round ratios name/reference and its ~95% confidence interval.

    The interval is between the order statistics n/2 -+ 0.98 sqrt(n) of the sorted ratios
    (the binomial sign-test interval for a median).
    """
    ratios = sorted(a / b for a, b in zip(times[name], times[reference], strict=True))
    n = len(ratios)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))
    return statistics.median(ratios), ratios[k], ratios[n - 1 - k]


def verdict_at_most(median: float, lower: float, target: float) -> str:
    """pass: median <= target; within noise: above, but target is inside the interval; FAIL."""
    if median <= target:
        return "pass"
    return "within noise" if lower <= target else "FAIL"
