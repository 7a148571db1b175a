"""One trial in its own process: throughput and peak memory of a `TrainingRun`.

Run by `benchmarks/run.py` (one process per trial, so the peak memory is that trial's alone
and several can be packed on one GPU). Prints one JSON line:

    images_per_s      training examples per second over the timed steps
    step_s            median seconds per timed step
    steps             timed steps
    rss_imports_mb    peak resident memory after the imports (torch, relif_ray)
    peak_rss_mb       peak resident memory of the whole process (VmHWM on Linux)
    cuda_peak_mb      torch.cuda.max_memory_allocated (null on CPU)

    python benchmarks/trial_worker.py --config '{"data": ...}' --warmup 2 --steps 5
    python benchmarks/trial_worker.py --config ... --seconds 20 --start-at 1767225600.0
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun


def peak_rss_mb() -> float:
    """This process's peak resident memory (MiB).

    Linux: VmHWM of /proc/self/status, which starts afresh at exec. getrusage's ru_maxrss is
    not used there: it carries the parent's peak across fork + exec, so a worker started by a
    large parent would report the parent's size. Elsewhere ru_maxrss (bytes on macOS).
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def timed_steps(run: TrainingRun, steps: int | None, seconds: float | None) -> list[float]:
    """Step times of `steps` steps, or of as many as fit in `seconds`."""
    cuda = run.device.type == "cuda"
    times: list[float] = []
    deadline = time.perf_counter() + (seconds or float("inf"))
    while (steps is None or len(times) < steps) and time.perf_counter() < deadline:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run.train_steps(1)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="ExperimentConfig as JSON")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=None, help="timed steps")
    parser.add_argument("--seconds", type=float, default=None, help="or: time this long")
    parser.add_argument("--start-at", type=float, default=None, help="wall clock (time.time)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    if args.steps is None and args.seconds is None:
        parser.error("give --steps or --seconds")
    torch.set_num_threads(args.threads)
    imports_mb = peak_rss_mb()
    config = ExperimentConfig.from_dict(json.loads(args.config))
    run = TrainingRun(config)
    run.train_steps(args.warmup)
    if args.start_at is not None:
        time.sleep(max(0.0, args.start_at - time.time()))
    times = timed_steps(run, args.steps, args.seconds)
    cuda = run.device.type == "cuda"
    result = {
        "images_per_s": config.train.batch_size * len(times) / sum(times),
        "step_s": statistics.median(times),
        "steps": len(times),
        "rss_imports_mb": imports_mb,
        "peak_rss_mb": peak_rss_mb(),
        "cuda_peak_mb": torch.cuda.max_memory_allocated(run.device) / 2**20 if cuda else None,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
