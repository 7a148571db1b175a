"""The `packing` suite: 1, 2 and 3 ERM trials sharing one GPU through the real
`sweeps/nyuv2.py` (`--gpus-per-trial` 1, 1/2, 1/3, the sweep's default GPU path, real-size
epochs with their validations and checkpoints): aggregate images/s over the trials' span, the
GPU's utilisation (NVML), each trial's peak GPU memory; then, at the best packing, the aggregate
against the isolated graphed ERM rate of the same run (the `graph` suite's row)."""

from __future__ import annotations

import json
import math
import sys
import time

from harness import NEEDS_CUDA, NEEDS_GPU, OUT_OF_TIME, Context
from sweep import real_data
from throughput import GRAPHED
from workers import UtilisationSampler

PACKINGS = (1, 2, 3)
BATCH_SIZE = 8


def sweep_command(ctx: Context, name: str, gpus_per_trial: float, seeds: int) -> list[str]:
    """`sweeps/nyuv2.py` of ERM x `seeds` on the real-size data with the sweep's default GPU
    path: one GPU, random weights, 2 real-size epochs (1 at toy size), no retries."""
    epochs, backbone = (1, "resnet18") if ctx.toy else (2, "resnet50")
    command = [sys.executable, "sweeps/nyuv2.py", "--data-dir", str(real_data(ctx))]
    command += ["--methods", "erm", "--seeds", str(seeds), "--epochs", str(epochs)]
    command += ["--backbone", backbone, "--batch-size", str(BATCH_SIZE), "--pretrained", "none"]
    command += ["--num-gpus", "1", "--gpus-per-trial", f"{gpus_per_trial:.3f}"]
    command += ["--max-failures", "0", "--storage", str(ctx.workdir / "results")]
    return command + ["--name", name]


def packing_suite(ctx: Context) -> None:
    if not ctx.gpu_rows:
        for per_gpu in PACKINGS:
            ctx.skip(f"sweep aggregate images/s, {per_gpu} trial(s) per GPU", NEEDS_GPU)
            ctx.skip(f"GPU utilisation, {per_gpu} trial(s) per GPU", NEEDS_GPU)
        return
    aggregate = {}
    for per_gpu in PACKINGS:
        name = f"sweep aggregate images/s, {per_gpu} trial(s) per GPU"
        if not ctx.has_time(60):  # Ray's start and shutdown, set-up, 2 real-size epochs
            ctx.skip(name, OUT_OF_TIME)
            continue
        with ctx.step(name):
            aggregate[per_gpu] = sweep_throughput(ctx, per_gpu, name)
    measured = {k: v for k, v in aggregate.items() if v}
    isolated = ctx.earlier_row(GRAPHED)
    if measured and isolated is not None:
        best = max(measured, key=measured.get)
        name = "sweep aggregate images/s per GPU / isolated graphed ERM"
        ctx.judged(name, name, measured[best] / isolated.value, "x", f"{best} trial(s) per GPU, "
                   "the best packing; isolated: the graph suite's row")  # fmt: skip


def sweep_throughput(ctx: Context, per_gpu: int, name: str) -> float | None:
    """One sweep of `per_gpu` ERM trials sharing the GPU: its aggregate images/s over the
    trials' span, the GPU's mean utilisation then and the trials' peak memory (rows); the
    images/s, None if the sweep failed."""
    experiment = ctx.workdir / "results" / f"packing-{per_gpu}"
    sampler = UtilisationSampler(ctx.device, 0, math.inf, 0.25) if ctx.cuda else None
    if sampler is not None:
        sampler.start()
    start = time.time()
    code = ctx.run(sweep_command(ctx, experiment.name, 1 / per_gpu, per_gpu))
    wall = time.time() - start
    if sampler is not None:
        sampler.stopped.set()
    outputs = sorted(experiment.glob("*/checkpoint_*/outputs/trial.json"))
    trials = [json.loads(path.read_text()) for path in outputs]
    if code != 0 or len(trials) < per_gpu:
        ctx.row(name, None, "img/s", f"sweeps/nyuv2.py exited {code}; {len(trials)} trial(s) "
                "finished", result="FAIL")  # fmt: skip
        return None
    first, last = min(t["started_at"] for t in trials), max(t["finished_at"] for t in trials)
    images_per_s = sum(t["steps"] for t in trials) * BATCH_SIZE / (last - first)
    devices = sorted({trial["device"] for trial in trials})
    results = [path.read_text().splitlines() for path in sorted(experiment.glob("*/result.json"))]
    peaks = [json.loads(lines[-1]).get("cuda_peak_mb") for lines in results if lines]
    shown = ", ".join(f"{p:.0f}" for p in peaks if p is not None)
    peak = f"{shown} MiB" if shown else "not reported (CPU)"
    on_cpu = ctx.cuda and any(not device.startswith("cuda") for device in devices)
    ctx.row(name, images_per_s, "img/s",
            f"{len(trials)} ERM trial(s) x {trials[0]['steps']} steps of batch {BATCH_SIZE}, "
            "with validation, live audit and checkpoints, over the trials' span "
            f"{last - first:.1f} s; the command took {wall:.1f} s (Ray start and shutdown "
            f"included); peak GPU memory per trial {peak}; trials ran on {', '.join(devices)}",
            target="trials on cuda", result="FAIL" if on_cpu else "info")  # fmt: skip
    if sampler is None:
        ctx.skip(f"GPU utilisation, {per_gpu} trial(s) per GPU", NEEDS_CUDA)
        return images_per_s
    mean = sampler.mean(first, last)
    ctx.row(f"GPU utilisation, {per_gpu} trial(s) per GPU", mean, "%",
            f"NVML every 0.25 s over the trials' span; {len(sampler.samples)} samples",
            result="info" if mean is not None else "no reading")  # fmt: skip
