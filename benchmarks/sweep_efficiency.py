"""Sweep efficiency: busy trial time / (wall time x concurrent slots) (target >= 0.97).

A grid of real trials (the sweep's `ReLiFTrainable`: ERM on synthetic NYUv2 scenes, resnet18,
one CPU and one thread each) runs on local Ray through `relif_ray.tuning.launch.run_sweep`, with
the sweep's settings: actor reuse, a checkpoint every epoch, outputs in the final checkpoint.

- busy time: the time trial actors spend doing trial work, i.e. in `setup` (data, model,
  optimiser), `step` (an epoch of training, validation and the live audit) and `save`
  (checkpoint written and persisted to storage), timed inside the actors;
- wall time: the whole `run_sweep` call, Ray already started: what is neither busy time nor
  overlapping it - Tuner start, actor process start and imports, scheduling gaps, clean-up -
  is the sweep system's overhead;
- slots: CPUs / CPUs per trial.
The stricter steps-only ratio (Tune's `time_total_s`, no set-up or checkpoints) is printed too.

Trial length is calibrated first: one step and one validation pass are timed in `--slots` Ray
workers at once (as the trials will run), then the training split is sized so that a trial of
`--epochs` epochs (one checkpoint each) takes about `--trial-seconds`.

    python benchmarks/sweep_efficiency.py --quick     # 8 trials of ~8 s on 2 CPUs, ~1 minute
    python benchmarks/sweep_efficiency.py             # 8 trials of ~30 s on 2 CPUs, ~3 minutes
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from relif_ray.config import ExperimentConfig
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.engine import TrainingRun
from relif_ray.tuning.trainable import ReLiFTrainable

TARGET = 0.97
HEIGHT, WIDTH, BATCH, VAL = 64, 80, 8, 8


def trial_config(root: str, epochs: int) -> dict:
    return {
        "data": {"dataset": "nyuv2", "root": root},
        "model": {"backbone": "resnet18", "head_channels": 32},
        "train": {"epochs": epochs, "batch_size": BATCH, "eval_batch_size": VAL, "lr": 1e-3},
    }


class TimedTrainable(ReLiFTrainable):
    """The sweep's trainable, appending (phase, seconds, wall-clock end) of every
    setup/step/save to a file per actor process in the folder `config["timing_dir"]`."""

    def _record(self, phase: str, start: float) -> None:
        seconds = time.perf_counter() - start
        line = json.dumps({"phase": phase, "seconds": seconds, "end": time.time()})
        with open(Path(self.timing_dir) / f"{os.getpid()}.jsonl", "a") as file:
            file.write(line + "\n")

    def setup(self, config: dict) -> None:
        start = time.perf_counter()
        self.timing_dir = config["timing_dir"]
        super().setup(config)
        self._record("setup", start)

    def step(self) -> dict:
        start = time.perf_counter()
        result = super().step()
        self._record("step", start)
        return result

    def save(self, *args, **kwargs):
        start = time.perf_counter()
        result = super().save(*args, **kwargs)
        self._record("save", start)
        return result


def busy_seconds(timing_dir: Path) -> dict[str, float]:
    """Total seconds per phase over every actor's timing file."""
    totals = {"setup": 0.0, "step": 0.0, "save": 0.0}
    for path in timing_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            totals[record["phase"]] += record["seconds"]
    return totals


def idle_seconds(timing_dir: Path, start: float, end: float) -> dict[str, float]:
    """Where the slots idle, summed over actors: before their first trial work (actor start,
    imports, Tune start-up), between two pieces of work (driver round trips: result
    processing, scheduling, experiment-state snapshots, the next trial's hand-over) and after
    their last one (waiting for the sweep to end)."""
    idle = {"start": 0.0, "between": 0.0, "end": 0.0}
    for path in timing_dir.glob("*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        spans = sorted((r["end"] - r["seconds"], r["end"]) for r in records)
        idle["start"] += spans[0][0] - start
        idle["between"] += sum(b[0] - a[1] for a, b in itertools.pairwise(spans))
        idle["end"] += end - spans[-1][1]
    return idle


def time_one_trial_epoch(root: str) -> tuple[float, float]:
    """(seconds per training step, seconds per validation pass) of one trial-like run."""
    torch.set_num_threads(1)
    run = TrainingRun(ExperimentConfig.from_dict(trial_config(root, epochs=1)))
    run.train_steps(1)
    start = time.perf_counter()
    run.train_steps(3)
    step_s = (time.perf_counter() - start) / 3
    start = time.perf_counter()
    run.evaluate("val")
    return step_s, time.perf_counter() - start


def calibrate(workdir: Path, slots: int) -> tuple[float, float]:
    """Step and validation time measured in `slots` Ray workers at once, as trials run."""
    import ray

    root = write_synthetic_nyuv2(
        workdir / "calibration", train=4 * BATCH, val=VAL, height=HEIGHT, width=WIDTH, seed=0
    )
    timer = ray.remote(num_cpus=1)(time_one_trial_epoch)
    timings = ray.get([timer.remote(str(root)) for _ in range(slots)])
    return max(t[0] for t in timings), max(t[1] for t in timings)


def measure(
    trials: int = 8, trial_seconds: float = 30.0, epochs: int = 2, slots: int = 2
) -> dict[str, float]:
    """Run the grid and return busy, wall, slots and their ratio (plus the trial shape)."""
    import ray
    from ray.tune import ExperimentAnalysis

    from relif_ray.sweep.labels import grid_variants
    from relif_ray.sweep.plan import Resources, param_space
    from relif_ray.tuning.launch import connect, run_sweep

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    connect(Resources(num_cpus=slots))  # the local Ray a sweep starts
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            step_s, eval_s = calibrate(workdir, slots)
            steps = max(1, math.ceil((trial_seconds / epochs - eval_s) / step_s))
            root = write_synthetic_nyuv2(
                workdir / "data", train=steps * BATCH, val=VAL, height=HEIGHT, width=WIDTH, seed=0
            )
            variants = grid_variants(["erm"], [], [])
            config = trial_config(str(root), epochs)
            space = param_space(config, variants, list(range(trials)), 0.2)
            timing_dir = workdir / "timing"
            timing_dir.mkdir()
            space.constants["timing_dir"] = str(timing_dir)
            start, started = time.perf_counter(), time.time()
            experiment = run_sweep(
                space,
                name="efficiency",
                storage=str(workdir / "results"),
                resources=Resources(cpus_per_trial=1),
                verbose=0,
                trainable=TimedTrainable,
            )
            wall = time.perf_counter() - start
            idle = idle_seconds(timing_dir, started, started + wall)
            results = [trial.last_result for trial in ExperimentAnalysis(experiment).trials]
            phases = busy_seconds(timing_dir)
    finally:
        ray.shutdown()
    busy = sum(phases.values())
    steps_only = sum(result["time_total_s"] for result in results)
    return {
        "trials": len(results),
        "slots": slots,
        "steps_per_epoch": steps,
        "mean_trial_s": busy / len(results),
        "setup_s": phases["setup"],
        "step_s": phases["step"],
        "save_s": phases["save"],
        "busy_s": busy,
        "idle_start_s": idle["start"],
        "idle_between_s": idle["between"],
        "idle_end_s": idle["end"],
        "wall_s": wall,
        "ratio": busy / (wall * slots),
        "steps_only_ratio": steps_only / (wall * slots),
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
        f"slots: busy {result['busy_s']:.1f} s (set-up {result['setup_s']:.1f}, steps "
        f"{result['step_s']:.1f}, checkpoints {result['save_s']:.1f}) / (wall "
        f"{result['wall_s']:.1f} s x {result['slots']}) = {result['ratio']:.3f} "
        f"(target >= {TARGET}) {verdict}; steps only: {result['steps_only_ratio']:.3f}; "
        f"idle slot-seconds: before the first trial {result['idle_start_s']:.1f}, between "
        f"trial work {result['idle_between_s']:.1f}, after the last {result['idle_end_s']:.1f}"
    )


if __name__ == "__main__":
    main()
