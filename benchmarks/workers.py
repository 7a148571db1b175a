"""Trial worker processes (`trial_worker.py`) for the memory, GPU and packing rows of `run.py`
and for `gpu_check.py`: what a worker trains (`trial_config`, `data_root`, `variants`) and
how one runs (`run_worker`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rows import GPU_FAST_PATH, GPU_SIZE, TOY_SIZE, Context
from timing import TIMING_SQUASH_BAND

BENCHMARKS = Path(__file__).resolve().parent
WORKER_WARMUP_STEPS = 10
"""Untimed steps of each trial worker first: cuDNN's autotuning (`train.cudnn_benchmark`),
the caching allocator and the GPU's clocks settle in them."""


def trial_config(ctx: Context, root: Path, variant: str, gpu: bool) -> dict:
    """A dense NYUv2 trial of `variant` (a method name, or "relif" for ERM + ReLiF); `gpu`: the
    GPU rows' fast path (bf16, channels-last, the train split on the device), with ResNet-50 on
    CUDA and a toy resnet18 on the CPU of a dry run."""
    if gpu:
        model = {"backbone": GPU_SIZE["backbone"], "head_channels": 128}
        if not ctx.cuda:
            model = {"backbone": "resnet18", "head_channels": 16}
        train = {"batch_size": GPU_SIZE["batch_size"], **GPU_FAST_PATH, "compile": ctx.compile}
    else:
        model = {"backbone": "resnet18", "head_channels": 128}
        train = {"batch_size": 8}
    return {
        "device": str(ctx.device) if gpu else "cpu",
        "data": {"dataset": "nyuv2", "root": str(root)},
        "model": model,
        "train": {"epochs": 100_000, "lr": 1e-4, **train},
        "method": {"name": "erm" if variant == "relif" else variant},
        "relif": {"enabled": variant == "relif", "squash_constants": TIMING_SQUASH_BAND},
    }


def run_worker(config: dict, warmup: int, steps: int | None = None, **options: object) -> dict:
    """One `trial_worker.py` process; its JSON result. `options` are further flags of the
    worker: `seconds=30` gives `--seconds 30`, `trace=True` gives `--trace`."""
    command = [sys.executable, str(BENCHMARKS / "trial_worker.py"), "--config", json.dumps(config)]
    command += ["--warmup", str(warmup)]
    if steps is not None:
        command += ["--steps", str(steps)]
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        command += [flag] if value is True else [flag, str(value)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"trial_worker.py exited {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def data_root(ctx: Context, gpu: bool) -> Path:
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    height, width = (64, 80)
    if gpu:
        height, width = (GPU_SIZE["height"], GPU_SIZE["width"]) if ctx.cuda else TOY_SIZE
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
    further = (
        name
        for name, cls in sorted(METHODS.items())
        if name not in paper and not missing_requirements(cls)
    )
    return (*paper, *further)
