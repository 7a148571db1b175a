"""Fixed-delta audit throughput in pair evaluations per second (target >= 1e7 on one core).

A pair evaluation is one sampled tuple (x of task a, y of task b) of Algorithm 1: its gap
|p_a(x) - p_b(y)|, hinge (gap - delta)_+ and violation 1[gap > delta]. Timed: the whole public
call `relif_ray.audit.fixed_delta_audit` on a NYUv2-shaped score table (3 tasks x 654
validation examples, N_eval = 256) with S pairs per task pair, so validation, pooling and the
seeded sampling are all inside the time. Reference: a plain Python loop that evaluates the
same sampled pairs one by one (timed on a prefix and reported per second); both must give the
same Bias and VR.

    python benchmarks/audit_throughput.py            # S = 2^21 per task pair
    python benchmarks/audit_throughput.py --quick    # S = 2^19
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from relif_ray.audit import fixed_delta_audit, sample_pairs, validate_scores

TARGET = 1e7
DELTA = 0.2
TASKS = ("seg", "depth", "normal")


def score_table(examples: int = 654, seed: int = 0) -> pd.DataFrame:
    """Audit scores in [0, 1] for every (task, example), in the audit's input format."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "task": np.repeat(TASKS, examples),
            "example_id": np.tile(np.arange(examples), len(TASKS)),
            "score": rng.random(len(TASKS) * examples),
            "valid": np.ones(len(TASKS) * examples, dtype=bool),
        }
    )


def python_loop_audit(
    scores: list[float], first: list[int], second: list[int], delta: float
) -> tuple[float, float]:
    """Bias and VR of one task pair, one pair at a time in plain Python."""
    hinge_sum, violations = 0.0, 0
    for x, y in zip(first, second, strict=True):
        gap = abs(scores[x] - scores[y])
        if gap > delta:
            hinge_sum += gap - delta
            violations += 1
    return hinge_sum / len(first), violations / len(first)


def measure(pairs: int = 2**21, repeats: int = 3) -> dict[str, float]:
    """Pairs per second of the audit (best of `repeats` calls) and of the Python loop (on the
    first task pair's S sampled pairs, checked against the audit's Bias and VR there)."""
    table = score_table()
    task_pairs = len(TASKS) * (len(TASKS) - 1) // 2
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fixed_delta_audit(table, DELTA, pool_size=256, pairs=pairs)
        best = min(best, time.perf_counter() - start)
    frame = validate_scores(table)
    key, (first, second) = next(iter(sample_pairs(frame, 256, pairs, 42, 0).items()))
    values, first, second = frame["score"].to_list(), first.tolist(), second.tolist()
    start = time.perf_counter()
    bias, vr = python_loop_audit(values, first, second, DELTA)
    loop_seconds = time.perf_counter() - start
    if not (np.isclose(bias, result.pairs[key].bias) and vr == result.pairs[key].vr):
        raise AssertionError(f"{key}: the Python loop disagrees with the audit")
    return {
        "pairs": float(task_pairs * pairs),
        "seconds": best,
        "pairs_per_s": task_pairs * pairs / best,
        "loop_pairs_per_s": pairs / loop_seconds,
        "speedup": (task_pairs * pairs / best) / (pairs / loop_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S = 2^19 pairs per task pair")
    args = parser.parse_args()
    result = measure(pairs=2**19 if args.quick else 2**21)
    verdict = "pass" if result["pairs_per_s"] >= TARGET else "FAIL"
    print(
        f"fixed-delta audit: {result['pairs_per_s']:.3g} pairs/s "
        f"({result['pairs']:.3g} pairs in {result['seconds']:.3f} s), Python loop "
        f"{result['loop_pairs_per_s']:.3g} pairs/s, {result['speedup']:.0f}x "
        f"(target >= {TARGET:.0e}) {verdict}"
    )


if __name__ == "__main__":
    main()
