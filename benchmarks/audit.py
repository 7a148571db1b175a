"""The fixed-delta audit's speed: the `audit` suite (pair evaluations per second of one whole
`fixed_delta_audit` call, against a plain Python loop that must give the same Bias and VR) and
the `analysis` suite (loading and auditing trials generated in the output format; below the real
size the time of fewer trials is judged by its linear extrapolation to 1,000)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.harness import Context
from benchmarks.targets import TARGETS
from relif_ray.audit import fixed_delta_audit, sample_pairs, validate_scores

DELTA = 0.2
TASKS = ("seg", "depth", "normal")
LABELS = ("erm", "pcgrad", "gradnorm", "fairgrad", "relif")
DELTAS = (0.15, 0.20, 0.275, 0.35, 0.45)


def score_table(examples: int = 654, seed: int = 0) -> pd.DataFrame:
    """Audit scores in [0, 1] for every (task, example), in the audit's input format."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "task": np.repeat(TASKS, examples), "example_id": np.tile(np.arange(examples), len(TASKS)),
        "score": rng.random(len(TASKS) * examples), "valid": np.ones(len(TASKS) * examples, bool),
    })  # fmt: skip


def python_loop_audit(scores: list[float], first: list[int], second: list[int],
                      delta: float) -> tuple[float, float]:  # fmt: skip
    """Bias and VR of one task pair, one pair at a time in plain Python."""
    hinge_sum, violations = 0.0, 0
    for x, y in zip(first, second, strict=True):
        gap = abs(scores[x] - scores[y])
        if gap > delta:
            hinge_sum += gap - delta
            violations += 1
    return hinge_sum / len(first), violations / len(first)


def measure_audit(pairs: int, repeats: int = 3) -> dict[str, float]:
    """Pairs per second of the audit (best of `repeats` calls) and of the Python loop (on the
    first task pair's sampled pairs, checked against the audit's Bias and VR there)."""
    table = score_table()
    task_pairs = len(TASKS) * (len(TASKS) - 1) // 2
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fixed_delta_audit(table, DELTA, pool_size=256, pairs=pairs)
        best = min(best, time.perf_counter() - start)
    frame = validate_scores(table)
    key, (first, second) = next(iter(sample_pairs(frame, 256, pairs, 42, 0).items()))
    start = time.perf_counter()
    bias, vr = python_loop_audit(frame["score"].to_list(), first.tolist(), second.tolist(), DELTA)
    loop_seconds = time.perf_counter() - start
    if not (np.isclose(bias, result.pairs[key].bias) and vr == result.pairs[key].vr):
        raise AssertionError(f"{key}: the Python loop disagrees with the audit")
    per_s, loop_per_s = task_pairs * pairs / best, pairs / loop_seconds
    return {"pairs": float(task_pairs * pairs), "seconds": best, "pairs_per_s": per_s,
            "loop_pairs_per_s": loop_per_s, "speedup": per_s / loop_per_s}  # fmt: skip


def audit_suite(ctx: Context) -> None:
    m = measure_audit({"toy": 2**12, "demo": 2**19, "real": 2**21}[ctx.size])
    ctx.judged("audit pairs/s", "fixed-delta audit throughput (1 core)", m["pairs_per_s"],
               "pairs/s", f"{m['pairs']:.3g} pairs in {m['seconds']:.3f} s (sampling included); "
               f"plain Python loop {m['loop_pairs_per_s']:.3g} pairs/s ({m['speedup']:.1f}x)"
               )  # fmt: skip


def generate(root: Path, trials: int, examples: int) -> float:
    """Write the experiment unless `root` already holds it; the seconds spent."""
    from relif_ray.testing.synthetic_experiment import write_synthetic_experiment

    if root.is_dir() and sum(1 for _ in root.iterdir()) == trials:
        return 0.0
    start = time.perf_counter()
    seeds = trials // len(LABELS)
    write_synthetic_experiment(root, LABELS, seeds, n_examples=examples, representation_dim=64,
                               trace_steps=200)  # fmt: skip
    return time.perf_counter() - start


def measure_analysis(root: Path, induced: bool = False) -> dict[str, float]:
    """Seconds to load and to audit the experiment at `root`; `induced`: also the
    validation-induced thresholds (which read every representation file)."""
    from relif_ray import analysis
    from relif_ray.analysis.experiment_audit import ExperimentAudit

    start = time.perf_counter()
    experiment = analysis.load(root)
    loaded = time.perf_counter()
    audit = ExperimentAudit(experiment)
    audit.fixed(DELTAS, "val")
    audited = time.perf_counter()
    result = {"trials": float(len(experiment.trials)), "load_s": loaded - start,
              "audit_s": audited - loaded, "total_s": audited - start}  # fmt: skip
    if induced:
        audit.induced()
        result["induced_s"] = time.perf_counter() - audited
    return result


def analysis_suite(ctx: Context) -> None:
    trials = {"toy": 10, "demo": 100, "real": 1000}[ctx.size]
    generated = generate(ctx.workdir / "analysis", trials, 654)
    m = measure_analysis(ctx.workdir / "analysis")
    per_thousand = m["total_s"] * 1000 / trials
    target = TARGETS["load + audit of 1,000 trials (s)"]
    detail = (f"load {m['load_s']:.2f} s + audit {m['audit_s']:.2f} s; generating took "
              f"{generated:.0f} s (not timed)")  # fmt: skip
    scaled = trials != 1000
    if scaled:
        detail = f"{trials} trials, x{1000 // trials} = {per_thousand:.1f} s for 1000; {detail}"
    ctx.row(f"load + audit {trials} generated trials", m["total_s"], "s", detail,
            target=f"{target.text} s / 1000",
            result=target.judge(per_thousand) + (" (scaled)" if scaled else ""))  # fmt: skip
