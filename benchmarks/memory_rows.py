"""The `memory` section of `run.py`: one trial worker process per variant: its peak memory (RSS
on the CPU, torch.cuda.max_memory_allocated on CUDA) and, with the GPU rows, its training
images/s and GPU utilisation; then the same of the plain fp32 loop, and ERM's speed-up over
it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from rows import Context, Row
from timing import verdict
from utilisation import UtilisationSampler
from workers import WORKER_WARMUP_STEPS, data_root, run_worker, trial_config, variants

PLAIN_LOOP = "plain fp32 loop"
"""The same model trained by a hand-written fp32 loop (`trial_worker.py --loop plain`)."""
PLAIN_LOOP_TARGET = 1.5
"""ERM's training images/s (bf16, channels-last, the engine) over the plain fp32 loop's."""


def setting_text(config: dict, root: Path) -> str:
    """What a worker trained, for the rows' detail: model, image size, batch, fast path."""
    height, width = np.load(root / "train" / "image" / "0.npy", mmap_mode="r").shape[:2]
    train = config["train"]
    text = f"{config['model']['backbone']} {height}x{width} batch {train['batch_size']}"
    text += f" {train.get('precision', 'fp32')}"
    text += ", channels-last" if train.get("channels_last") else ""
    text += ", data on device" if train.get("data_on_device") else ""
    return text + (", compile" if train.get("compile") else "")


def worker_steps(ctx: Context) -> int:
    """Timed steps of each worker of the memory rows."""
    return (10 if ctx.quick else 40) if ctx.cuda else 2


def versus_erm(results: dict[str, dict], variant: str, peak: str) -> str:
    """The variant's peak memory as a multiple of ERM's, when ERM ran in the same call."""
    if "erm" not in results or results["erm"][peak] is None:
        return ""
    return f"{results[variant][peak] / results['erm'][peak]:.2f}x ERM's; "


def memory_and_throughput_rows(
    ctx: Context, chosen: tuple[str, ...] | None = None, plain_loop: bool = True
) -> list[Row]:
    """Peak memory of one trial per variant (default: `variants()`), as a multiple of ERM's
    where ERM is among them; with the GPU rows also its training images/s, and (`plain_loop`)
    the plain fp32 loop's and ERM's speed-up over it."""
    root = data_root(ctx, ctx.gpu_rows)
    compiled = " (compile)" if ctx.compile else ""
    backend = {"compile_backend": ctx.compile_backend} if ctx.compile_backend else {}
    chosen = chosen or variants()
    rows = []
    results = {}
    for variant in chosen:
        config = trial_config(ctx, root, variant, ctx.gpu_rows)
        results[variant] = timed_worker(ctx, config, **backend)
        if not ctx.gpu_rows:
            rows.append(
                Row(
                    "memory",
                    f"peak RSS per trial, {variant}",
                    results[variant]["peak_rss_mb"],
                    "MiB",
                    "-",
                    "info",
                    f"{versus_erm(results, variant, 'peak_rss_mb')}resnet18 64x80 batch 8, "
                    f"one process; after imports {results[variant]['rss_imports_mb']:.0f} MiB",
                )
            )
            continue
        memory = versus_erm(results, variant, "cuda_peak_mb")
        rows += gpu_rows(variant + compiled, results[variant], setting_text(config, root), memory)
    if not ctx.gpu_rows:
        return rows + [
            Row("gpu", f"training images/s, {v}", None, "img/s", "-", "needs a GPU") for v in chosen
        ]
    if plain_loop:
        erm = results["erm"]["images_per_s"] if "erm" in results and not ctx.compile else None
        rows += plain_loop_rows(ctx, erm)
    return rows


def plain_loop_rows(ctx: Context, erm_images_per_s: float | None) -> list[Row]:
    """The plain fp32 loop's memory and images/s rows, and ERM's speed-up over it (target
    >= 1.5; given ERM's images/s, from a worker of the same size)."""
    root = data_root(ctx, gpu=True)
    config = trial_config(ctx, root, "erm", gpu=True)
    config["train"].update(
        precision="fp32", channels_last=False, compile=False, data_on_device=False
    )
    result = timed_worker(ctx, config, loop="plain")
    rows = gpu_rows(PLAIN_LOOP, result, setting_text(config, root))
    if erm_images_per_s is None:
        return rows
    speedup = erm_images_per_s / result["images_per_s"]
    return rows + [
        Row(
            "gpu",
            f"ERM images/s / {PLAIN_LOOP} images/s",
            speedup,
            "x",
            f">= {PLAIN_LOOP_TARGET}",
            verdict(speedup >= PLAIN_LOOP_TARGET),
            "the engine on the fast path (bf16 autocast, channels-last, the train split on "
            "the device, fused Adam on CUDA) against a hand-written fp32 NCHW loop of the "
            "same model with host batches and torch's default Adam (trial_worker.py --loop "
            "plain)",
        )
    ]


def timed_worker(ctx: Context, config: dict, **options: object) -> dict:
    """One trial worker of the memory rows (`WORKER_WARMUP_STEPS`, then `worker_steps`); on
    CUDA with "gpu_utilisation": the GPU's mean utilisation (%) over its timed steps, sampled
    every 0.1 s (None without a reading), which says whether a step keeps the GPU busy or is
    bound by host work."""
    sampler = None
    if ctx.cuda:
        sampler = UtilisationSampler(ctx.device, time.time(), math.inf, period=0.1)
        sampler.start()
    try:
        warmup = WORKER_WARMUP_STEPS if ctx.cuda else 3  # on a CPU only the memory counts
        result = run_worker(config, warmup, worker_steps(ctx), **options)
    finally:
        if sampler is not None:
            sampler.stopped.set()
            sampler.join()
    if sampler is not None:
        result["gpu_utilisation"] = sampler.mean(result["timed_from"], result["timed_to"])
    return result


def gpu_rows(name: str, result: dict, setting: str, memory_note: str = "") -> list[Row]:
    """The peak GPU memory (`memory_note` first in its detail), training images/s and (on
    CUDA) GPU utilisation rows of one worker's result."""
    peak = result["cuda_peak_mb"]
    utilisation = []
    if "gpu_utilisation" in result:
        busy = result["gpu_utilisation"]
        utilisation.append(
            Row(
                "gpu",
                f"GPU utilisation while timed, {name}",
                busy,
                "%",
                "-",
                "info" if busy is not None else "no reading",
                f"{setting}; NVML every 0.1 s over the {result['steps']} timed steps "
                f"({result['timed_to'] - result['timed_from']:.1f} s): well below 100% means "
                "the GPU waits for host work",
            )
        )
    return utilisation + [
        Row(
            "memory",
            f"peak GPU memory per trial, {name}",
            peak,
            "MiB",
            "-",
            "info" if peak is not None else "needs a GPU",
            f"{memory_note}{setting} (torch.cuda.max_memory_allocated); host peak RSS "
            f"{result['peak_rss_mb']:.0f} MiB",
        ),
        Row(
            "gpu",
            f"training images/s, {name}",
            result["images_per_s"],
            "img/s",
            "-",
            "info",
            f"{setting}, {result['steps']} steps, median step {1e3 * result['step_s']:.1f} ms",
        ),
    ]
