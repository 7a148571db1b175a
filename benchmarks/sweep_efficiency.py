"""Sweep efficiency: busy trial time / (wall time x concurrent slots) (issue 5; target >= 0.9).

A grid of real trials (the sweep's `ReLiFTrainable`: ERM on synthetic NYUv2 scenes, resnet18,
one CPU and one thread each) runs on local Ray through `relif_ray.tune.run_sweep`, with the
sweep's settings: actor reuse, a checkpoint every epoch, outputs in the final checkpoint.

- busy time of a trial: Tune's `time_total_s`, the sum of its `step()`s (training, validation
  and the live audit): the work a user wants the machine to do;
- wall time: the whole `run_sweep` call, Ray already started (Tuner set-up, actor start-up and
  set-up, checkpoints, scheduling gaps and the final clean-up all count against efficiency);
- slots: CPUs / CPUs per trial.

Trial length is calibrated first: one step and one validation pass are timed in-process, then
the training split is sized so that a trial of `--epochs` epochs takes about `--trial-seconds`.

    python benchmarks/sweep_efficiency.py --quick     # 8 trials of ~8 s on 2 CPUs, ~1 minute
    python benchmarks/sweep_efficiency.py             # 8 trials of ~30 s on 2 CPUs, ~3 minutes
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from relif_ray.config import ExperimentConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.engine import TrainingRun

TARGET = 0.9
HEIGHT, WIDTH, BATCH, VAL = 64, 80, 8, 8


def trial_config(root: str, epochs: int) -> dict:
    return {
        "data": {"dataset": "nyuv2", "root": root},
        "model": {"backbone": "resnet18", "head_channels": 32},
        "train": {"epochs": epochs, "batch_size": BATCH, "eval_batch_size": VAL, "lr": 1e-3},
    }


def calibrate(workdir: Path) -> tuple[float, float]:
    """(seconds per training step, seconds per validation pass) with one thread."""
    root = write_synthetic_nyuv2(
        workdir / "calibration", train=4 * BATCH, val=VAL, height=HEIGHT, width=WIDTH, seed=0
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = TrainingRun(ExperimentConfig.from_dict(trial_config(str(root), epochs=1)))
        run.train_steps(1)
        start = time.perf_counter()
        run.train_steps(3)
        step_s = (time.perf_counter() - start) / 3
        start = time.perf_counter()
        run.evaluate("val")
        eval_s = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return step_s, eval_s


def measure(
    trials: int = 8, trial_seconds: float = 30.0, epochs: int = 2, slots: int = 2
) -> dict[str, float]:
    """Run the grid and return busy, wall, slots and their ratio (plus the trial shape)."""
    import ray
    from ray.tune import ExperimentAnalysis

    from relif_ray.tune import Resources, param_space, run_sweep
    from relif_ray.variants import grid_variants

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        step_s, eval_s = calibrate(workdir)
        per_epoch = trial_seconds / epochs
        steps = max(1, math.ceil((per_epoch - eval_s) / step_s))
        root = write_synthetic_nyuv2(
            workdir / "data", train=steps * BATCH, val=VAL, height=HEIGHT, width=WIDTH, seed=0
        )
        space = param_space(
            trial_config(str(root), epochs),
            grid_variants(["erm"], [], []),
            list(range(trials)),
            0.2,
        )
        ray.init(num_cpus=slots, include_dashboard=False)
        try:
            start = time.perf_counter()
            experiment = run_sweep(
                space,
                name="efficiency",
                storage=str(workdir / "results"),
                resources=Resources(cpus_per_trial=1),
                verbose=0,
            )
            wall = time.perf_counter() - start
        finally:
            ray.shutdown()
        results = [trial.last_result for trial in ExperimentAnalysis(experiment).trials]
    busy = sum(result["time_total_s"] for result in results)
    return {
        "trials": len(results),
        "slots": slots,
        "steps_per_epoch": steps,
        "mean_trial_s": busy / len(results),
        "busy_s": busy,
        "wall_s": wall,
        "ratio": busy / (wall * slots),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 trials of about 8 s")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--trial-seconds", type=float, default=30.0)
    parser.add_argument("--epochs", type=int, default=2, help="epochs (checkpoints) per trial")
    parser.add_argument("--slots", type=int, default=2, help="CPUs of local Ray, one per trial")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.quick:
        args.trial_seconds = 8.0
    result = measure(args.trials, args.trial_seconds, args.epochs, args.slots)
    verdict = "pass" if result["ratio"] >= TARGET else "FAIL"
    print(
        f"{result['trials']} trials x {result['mean_trial_s']:.1f} s busy on {result['slots']} "
        f"slots: busy {result['busy_s']:.1f} s / (wall {result['wall_s']:.1f} s x "
        f"{result['slots']}) = {result['ratio']:.3f} (target >= {TARGET}) {verdict}"
    )


if __name__ == "__main__":
    main()
