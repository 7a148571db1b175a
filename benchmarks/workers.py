"""Trial workers: one `TrainingRun` in a process of its own, so that its peak memory is its alone
and several can share a GPU; what a worker trains, how it is run and timed (with the GPU's
utilisation sampled meanwhile) and its rows. Run as `python -m benchmarks.workers`, it is the
worker: it prints one JSON line (images/s, median step, peak memory, the timed window;
`--trace`: every step's trace row); `--loop plain` trains with a plain fp32 PyTorch loop
(`PlainLoop`)."""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from relif_ray.experiment.record import CUDA_PEAK_MB

if TYPE_CHECKING:
    from benchmarks.harness import Context

GPU_SIZE = {"backbone": "resnet50", "height": 288, "width": 384, "batch_size": 8}
"""The paper's NYUv2 size: every GPU row's model, images and batch."""
GPU_FAST_PATH = {"precision": "bf16", "channels_last": True, "data_on_device": True}
"""The `train` fields of the GPU rows: the sweep's default where trials get a GPU."""
TOY_IMAGE = (32, 40)  # Image size of the GPU rows at toy size (the check's dry run on a CPU).
TIMING_SQUASH_BAND = {"depth": [0.0, 10.0], "normal": [0.0, 10.0]}
"""Depth/normal squash constants of timed ReLiF runs on NYUv2 (a sweep takes them from the
same-seed ERM validation run; where the band lies changes no amount of work in a step)."""
WORKER_WARMUP_STEPS = 10
"""Untimed steps of each worker on CUDA: cuDNN's autotuning, the caching allocator and the
GPU's clocks settle in them."""


def trial_config(ctx: Context, root: Path, variant: str, gpu: bool) -> dict:
    """A dense NYUv2 trial of `variant` (a method, or "relif" for ERM + ReLiF); `gpu`: the GPU
    rows' fast path, with ResNet-50 on CUDA and a toy resnet18 at toy size; its device by the
    sweep's rule (`relif_ray.sweep.compose.trial_device`: "auto" for a GPU row on CUDA)."""
    from relif_ray.sweep.compose import trial_device

    model, train = {"backbone": "resnet18", "head_channels": 128}, {"batch_size": 8}
    if gpu:
        model = {"backbone": GPU_SIZE["backbone"], "head_channels": 128}
        if not ctx.cuda:
            model = {"backbone": "resnet18", "head_channels": 16}
        train = {"batch_size": GPU_SIZE["batch_size"], **GPU_FAST_PATH}
    return {
        "device": trial_device(gpu and ctx.cuda),
        "data": {"dataset": "nyuv2", "root": str(root)},
        "model": model,
        "train": {"epochs": 100_000, "lr": 1e-4, **train},
        "method": {"name": "erm" if variant == "relif" else variant},
        "relif": {"enabled": variant == "relif", "squash_constants": TIMING_SQUASH_BAND},
    }


def data_root(ctx: Context, gpu: bool) -> Path:
    """32 training images at the workers' size (written once per work folder)."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    height, width = (64, 80)
    if gpu:
        height, width = (GPU_SIZE["height"], GPU_SIZE["width"]) if ctx.cuda else TOY_IMAGE
    root = ctx.workdir / f"nyuv2-{height}x{width}"
    if not root.exists():
        write_synthetic_nyuv2(root, train=32, val=2, height=height, width=width, seed=0)
    return root


def variants() -> tuple[str, ...]:
    """ERM, ERM + ReLiF, the paper's other methods, then every other registered method whose
    dependencies are installed."""
    from relif_ray.methods import METHODS
    from relif_ray.methods.registry import missing_requirements
    from relif_ray.sweep.labels import PAPER_LABELS

    paper = ("erm", "relif", *(label for label in PAPER_LABELS if label not in ("erm", "relif")))
    installed = [name for name, cls in sorted(METHODS.items()) if not missing_requirements(cls)]
    further = (name for name in installed if name not in paper)
    return (*paper, *further)


def run_worker(config: dict, warmup: int, steps: int, **options: object) -> dict:
    """One worker process; its JSON result. `options` are further flags: `loop="plain"` gives
    `--loop plain`, `trace=True` gives `--trace`."""
    from benchmarks.harness import REPO

    command = [sys.executable, "-m", "benchmarks.workers", "--config", json.dumps(config)]
    command += ["--warmup", str(warmup)]
    command += ["--steps", str(steps)]
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        command += [flag] if value is True else [flag, str(value)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        failed = f"benchmarks.workers exited {result.returncode}"
        raise RuntimeError(f"{failed}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def timed_worker(ctx: Context, config: dict, **options: object) -> dict:
    """One worker: on CUDA `WORKER_WARMUP_STEPS` then 10 (40 at real size) timed steps, with
    "gpu_utilisation" the GPU's mean utilisation (%) over them, sampled every 0.1 s (None
    without a reading): well below 100% means the GPU waits for host work. On a CPU only the
    memory counts: 3 steps, then 2."""
    sampler = UtilisationSampler(ctx.device, 0.1) if ctx.cuda else None
    if sampler is not None:
        sampler.start()
    try:
        steps = (40 if ctx.size == "real" else 10) if ctx.cuda else 2
        result = run_worker(config, WORKER_WARMUP_STEPS if ctx.cuda else 3, steps, **options)
    finally:
        if sampler is not None:
            sampler.stopped.set()
            sampler.join()
    if sampler is not None:
        result["gpu_utilisation"] = sampler.mean(result["timed_from"], result["timed_to"])
    return result


def setting_text(config: dict, root: Path) -> str:
    """What a worker trained: model, image size, batch, fast path."""
    import numpy as np

    height, width = np.load(root / "train" / "image" / "0.npy", mmap_mode="r").shape[:2]
    train = config["train"]
    text = f"{config['model']['backbone']} {height}x{width} batch {train['batch_size']}"
    text += f" {train.get('precision', 'fp32')}"
    text += ", channels-last" if train.get("channels_last") else ""
    text += ", data on device" if train.get("data_on_device") else ""
    return text + (", compile" if train.get("compile") else "")


def worker_rows(ctx: Context, name: str, result: dict, setting: str, note: str = "") -> None:
    """The GPU utilisation (on CUDA), peak GPU memory (`note` first in its detail) and training
    images/s rows of one worker's result, with the device it trained on (`trained_on`: on
    CUDA a worker that trained elsewhere is an error)."""
    from benchmarks.harness import trained_on

    setting = f"{setting}, {trained_on(ctx, [result['device']], name)}"
    if "gpu_utilisation" in result:
        busy, span = result["gpu_utilisation"], result["timed_to"] - result["timed_from"]
        ctx.row(f"GPU utilisation while timed, {name}", busy, "%",
                f"{setting}; NVML every 0.1 s over the {result['steps']} timed steps ({span:.1f} "
                "s): well below 100% means the GPU waits for host work",
                result="info" if busy is not None else "no reading")  # fmt: skip
    peak = result[CUDA_PEAK_MB]
    ctx.row(f"peak GPU memory per trial, {name}", peak, "MiB",
            f"{note}{setting} (torch.cuda.max_memory_allocated); host peak RSS "
            f"{result['peak_rss_mb']:.0f} MiB", result="info" if peak else "needs a GPU"
            )  # fmt: skip
    ctx.row(f"training images/s, {name}", result["images_per_s"], "img/s",
            f"{setting}, {result['steps']} steps ({result['steps_as']}), median step "
            f"{1e3 * result['step_s']:.1f} ms")  # fmt: skip


# --- the GPU's utilisation --------------------------------------------------------------------


class UtilisationSampler(threading.Thread):
    """GPU utilisation (%) every `period` s until stopped (NVML through torch.cuda.utilization,
    else nvidia-smi), as (time.time(), percent) samples."""

    def __init__(self, device: torch.device, period: float):
        super().__init__(daemon=True)
        self.index, self.period = device.index or 0, period
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self.index))
        except Exception:  # no NVML bindings (pynvml), or NVML failed: ask nvidia-smi
            query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            try:
                lines = subprocess.run([*query, "-i", str(self.index)], capture_output=True,
                                       text=True, check=True).stdout.split()  # fmt: skip
            except (OSError, subprocess.CalledProcessError):
                return None
            return float(lines[0]) if lines else None

    def run(self) -> None:
        while not self.stopped.is_set():
            value = self.read()
            if value is not None:
                self.samples.append((time.time(), value))
            self.stopped.wait(self.period)

    def mean(self, start: float = 0.0, end: float = math.inf) -> float | None:
        """Mean utilisation of the samples taken in [start, end]; None without any."""
        values = [value for at, value in self.samples if start <= at <= end]
        return statistics.mean(values) if values else None


# --- the worker process -----------------------------------------------------------------------


def peak_rss_mb() -> float:
    """This process's peak resident memory (MiB): Linux's VmHWM, which starts afresh at exec
    (getrusage's ru_maxrss would carry a large parent's peak across fork + exec)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


class PlainLoop:
    """The config's model trained by a plain fp32 PyTorch loop, without the engine: NCHW, no
    autocast, batches gathered on the host and copied with `.to(device)`, the sum of the task
    losses, torch's default Adam. Reads none of the fast-path fields; its trace holds the loss."""

    def __init__(self, config) -> None:  # noqa: ANN001
        from relif_ray.problems import load_problem

        self.device = torch.device(config.device)
        problem = load_problem(config.data)
        self.tasks, self.split = problem.tasks, problem.splits["train"]
        torch.manual_seed(config.seed)
        self.model = problem.build_model(config.model).to(self.device)
        train = config.train
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=train.lr,
                                          weight_decay=train.weight_decay)  # fmt: skip
        self.batch_size = train.batch_size
        self.generator = torch.Generator().manual_seed(config.seed)
        self.order = torch.empty(0, dtype=torch.long)
        self.trace: list[dict[str, float]] = []

    def train_steps(self, count: int) -> None:
        self.model.train()
        losses = []
        for _ in range(count):
            if len(self.order) < self.batch_size:  # a new epoch
                self.order = torch.randperm(len(self.split), generator=self.generator)
            index, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
            batch = {key: value.to(self.device) for key, value in self.split.batch(index).items()}
            output = self.model(batch)
            loss = sum(t.loss(output.predictions[t.name], batch[t.name]) for t in self.tasks)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(loss.detach())
        self.trace += [{"loss": float(loss)} for loss in losses]


def steps_as(run) -> str:  # noqa: ANN001
    """How the worker's steps ran: graphed whole, graphed around the method's host solve,
    or eager (with the engine's reason)."""
    from relif_ray.cuda_graph import SolvedGraphedStep

    if isinstance(run, PlainLoop):
        return "eager (the plain loop)"
    members = getattr(run, "members", None)
    if members is not None:  # a fused run: its form, and how its first seed's steps ran
        return f"{len(members)} seeds {run.form}, each {steps_as(members[0])}"
    if run.graphed is None:
        return f"eager: {run.eager_reason}"
    if run.graphed.graph is None:
        return "eager: the capture failed"
    if isinstance(run.graphed, SolvedGraphedStep):
        return "graphed around the host solve"
    return "graphed"


def timed_chunks(run, steps: int, chunk: int) -> list[tuple[int, float]]:  # noqa: ANN001
    """(steps, seconds) of each chunk of up to `chunk` of `steps` steps. On CUDA the device is
    synchronised between chunks only, so the host queues steps ahead of the GPU as in a real
    run (a sync per step would leave the GPU idle while the host prepares the next batch)."""
    chunks: list[tuple[int, float]] = []
    synchronize = torch.cuda.synchronize if run.device.type == "cuda" else (lambda: None)
    for done in range(0, steps, chunk):
        count = min(chunk, steps - done)
        synchronize()
        start = time.perf_counter()
        run.train_steps(count)
        synchronize()
        chunks.append((count, time.perf_counter() - start))
    return chunks


def main() -> None:
    parser = argparse.ArgumentParser(description="One trial worker: throughput and peak memory.")
    parser.add_argument("--config", required=True, help="ExperimentConfig as JSON")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, required=True, help="timed steps")
    parser.add_argument("--chunk", type=int, default=10, help="steps between device syncs")
    parser.add_argument("--loop", choices=["engine", "plain"], default="engine")
    parser.add_argument("--trace", action="store_true", help="print every step's trace row")
    parser.add_argument("--compile-backend", help="torch.compile backend (eager: a dry run)")
    parser.add_argument("--compile-mode", help="torch.compile mode, e.g. reduce-overhead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {"backend": args.compile_backend, "mode": args.compile_mode}
    if any(options.values()):
        torch.compile = functools.partial(torch.compile, **{k: v for k, v in options.items() if v})
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    imports_mb = peak_rss_mb()
    config = ExperimentConfig.from_dict(json.loads(args.config))
    seeds = config.train.fused_seeds
    if seeds > 1:  # one fused run of seeds seed, seed + 1, ... (`relif_ray.fused`)
        from relif_ray.fused import FusedTrainingRun
        from relif_ray.sweep.trial_config import seed_configs

        run = FusedTrainingRun(seed_configs(config, tuple(range(config.seed, config.seed + seeds))))
    else:
        run = TrainingRun(config) if args.loop == "engine" else PlainLoop(config)
    run.train_steps(args.warmup)
    timed_from = time.time()
    chunks = timed_chunks(run, args.steps, args.chunk)
    timed_to, steps = time.time(), sum(count for count, _ in chunks)
    cuda = run.device.type == "cuda"
    result = {
        "images_per_s": seeds * config.train.batch_size * steps / sum(s for _, s in chunks),
        "step_s": statistics.median(s / count for count, s in chunks),
        "steps": steps, "rss_imports_mb": imports_mb, "peak_rss_mb": peak_rss_mb(),
        CUDA_PEAK_MB: torch.cuda.max_memory_allocated(run.device) / 2**20 if cuda else None,
        "timed_from": timed_from, "timed_to": timed_to, "device": str(run.device),
        "steps_as": steps_as(run),
    }  # fmt: skip
    if args.trace:
        result["trace"] = run.trace if seeds == 1 else [member.trace for member in run.members]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
