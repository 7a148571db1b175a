"""One trial in its own process: throughput and peak memory of a `TrainingRun`.

Run by `benchmarks/run.py` (one process per trial, so the peak memory is that trial's alone
and several can be packed on one GPU). Prints one JSON line:

    images_per_s      training examples per second over the timed steps
    step_s            median over the timed chunks of seconds per step
    steps             timed steps (the device is synchronised every --chunk steps)
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


def timed_chunks(
    run: TrainingRun, steps: int | None, seconds: float | None, chunk: int
) -> list[tuple[int, float]]:
    """(steps, seconds) of each chunk of up to `chunk` training steps: `steps` steps in all, or
    as many chunks as start within `seconds`.

    On CUDA the device is synchronised only between chunks, so inside a chunk the host queues
    steps ahead of the GPU as it does in a real run (`train_steps` turns its trace into floats
    once per call, the engine's one host sync per epoch); a sync per step would leave the GPU
    idle while the host prepares the next batch and understate the throughput.
    """
    chunks: list[tuple[int, float]] = []
    done = 0
    deadline = time.perf_counter() + (seconds or float("inf"))
    while (steps is None or done < steps) and time.perf_counter() < deadline:
        count = chunk if steps is None else min(chunk, steps - done)
        synchronize(run.device)
        start = time.perf_counter()
        run.train_steps(count)
        synchronize(run.device)
        chunks.append((count, time.perf_counter() - start))
        done += count
    return chunks


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="ExperimentConfig as JSON")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=None, help="timed steps")
    parser.add_argument("--seconds", type=float, default=None, help="or: time this long")
    parser.add_argument("--start-at", type=float, default=None, help="wall clock (time.time)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--chunk", type=int, default=10, help="steps between device syncs")
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
    chunks = timed_chunks(run, args.steps, args.seconds, args.chunk)
    steps = sum(count for count, _ in chunks)
    cuda = run.device.type == "cuda"
    result = {
        "images_per_s": config.train.batch_size * steps / sum(s for _, s in chunks),
        "step_s": statistics.median(s / count for count, s in chunks),
        "steps": steps,
        "rss_imports_mb": imports_mb,
        "peak_rss_mb": peak_rss_mb(),
        "cuda_peak_mb": torch.cuda.max_memory_allocated(run.device) / 2**20 if cuda else None,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
