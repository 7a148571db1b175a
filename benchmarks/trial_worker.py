"""One trial in its own process: throughput and peak memory of a `TrainingRun`.

Run by `benchmarks/run.py` (one process per trial, so the peak memory is that trial's alone
and several can be packed on one GPU). `--loop plain` trains the same model with a plain fp32
PyTorch loop instead of the engine (`PlainLoop`), the baseline of the GPU speed target.
Prints one JSON line:

    images_per_s      training examples per second over the timed steps
    step_s            median over the timed chunks of seconds per step
    steps             timed steps (the device is synchronised every --chunk steps)
    rss_imports_mb    peak resident memory after the imports (torch, relif_ray)
    peak_rss_mb       peak resident memory of the whole process (VmHWM on Linux)
    cuda_peak_mb      torch.cuda.max_memory_allocated (null on CPU)
    timed_from, timed_to    wall clock (time.time) of the first timed step's start and the
                      last one's end: the window in which the parent samples GPU utilisation
    trace             with --trace: every step's trace row (losses, weights, ReLiF state)

    python benchmarks/trial_worker.py --config '{"data": ...}' --warmup 2 --steps 5
    python benchmarks/trial_worker.py --config ... --seconds 20 --start-at 1767225600.0
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from relif_ray.config import ExperimentConfig
from relif_ray.engine import TrainingRun
from relif_ray.problems import load_problem


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


class PlainLoop:
    """The config's model trained by a plain fp32 PyTorch loop, without the engine: NCHW, no
    autocast, batches gathered on the host and copied with `.to(device)`, the sum of the task
    losses, torch's default Adam (lr, weight decay). Reads only data, model, seed, device,
    train.batch_size, lr and weight_decay of the config (none of the fast-path fields); the
    trace holds the summed loss."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.device = torch.device(config.device)
        problem = load_problem(config.data)
        self.tasks, self.split = problem.tasks, problem.splits["train"]
        torch.manual_seed(config.seed)
        self.model = problem.build_model(config.model).to(self.device)
        train = config.train
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=train.lr, weight_decay=train.weight_decay
        )
        self.batch_size = train.batch_size
        self.generator = torch.Generator().manual_seed(config.seed)
        self.order = torch.empty(0, dtype=torch.long)
        self.losses: list[torch.Tensor] = []
        self.trace: list[dict[str, float]] = []

    def train_steps(self, count: int) -> None:
        self.model.train()
        for _ in range(count):
            if len(self.order) < self.batch_size:  # a new epoch
                self.order = torch.randperm(len(self.split), generator=self.generator)
            index, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
            batch = {key: value.to(self.device) for key, value in self.split.batch(index).items()}
            output = self.model(batch)
            loss = sum(
                task.loss(output.predictions[task.name], batch[task.name]) for task in self.tasks
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.losses.append(loss.detach())
        self.trace += [{"loss": float(loss)} for loss in self.losses]
        self.losses.clear()


def timed_chunks(
    run: TrainingRun | PlainLoop, steps: int | None, seconds: float | None, chunk: int
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
    parser.add_argument(
        "--loop", choices=["engine", "plain"], default="engine", help="plain: `PlainLoop`"
    )
    parser.add_argument("--trace", action="store_true", help="print every step's trace row")
    parser.add_argument(
        "--compile-backend",
        help="torch.compile backend for train.compile (default inductor; eager traces with "
        "dynamo only, for a quick check on a CPU)",
    )
    parser.add_argument(
        "--compile-mode", help="torch.compile mode for train.compile, e.g. reduce-overhead"
    )
    args = parser.parse_args()
    if args.steps is None and args.seconds is None:
        parser.error("give --steps or --seconds")
    torch.set_num_threads(args.threads)
    options = {"backend": args.compile_backend, "mode": args.compile_mode}
    options = {key: value for key, value in options.items() if value}
    if options:
        torch.compile = functools.partial(torch.compile, **options)
    imports_mb = peak_rss_mb()
    config = ExperimentConfig.from_dict(json.loads(args.config))
    run = TrainingRun(config) if args.loop == "engine" else PlainLoop(config)
    run.train_steps(args.warmup)
    if args.start_at is not None:
        time.sleep(max(0.0, args.start_at - time.time()))
    timed_from = time.time()
    chunks = timed_chunks(run, args.steps, args.seconds, args.chunk)
    timed_to = time.time()
    steps = sum(count for count, _ in chunks)
    cuda = run.device.type == "cuda"
    result = {
        "images_per_s": config.train.batch_size * steps / sum(s for _, s in chunks),
        "step_s": statistics.median(s / count for count, s in chunks),
        "steps": steps,
        "rss_imports_mb": imports_mb,
        "peak_rss_mb": peak_rss_mb(),
        "cuda_peak_mb": torch.cuda.max_memory_allocated(run.device) / 2**20 if cuda else None,
        "timed_from": timed_from,
        "timed_to": timed_to,
    }
    if args.trace:
        result["trace"] = run.trace
    print(json.dumps(result))


if __name__ == "__main__":
    main()
