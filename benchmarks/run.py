"""Every performance target of relif-ray in one command, side by side.

    python benchmarks/run.py --quick          # a few minutes on a 2-core CPU
    python benchmarks/run.py                  # full sizes (tens of minutes on CPU)
    python benchmarks/run.py --json           # machine-readable rows

Each row has its target and a result: pass / FAIL / "within noise" (a step-time ratio above
its target whose ~95% interval still contains the target) / info (no target). Ratios are
measured in this one process, variants interleaved step by step, so machine noise hits both
sides alike; the CPU rows use one torch thread. Rows:

- ReLiF overhead: ERM + ReLiF step time over ERM's, dense NYUv2 model and clinical LSTM
  (target <= 1.05; `relif_step_time.py`);
- ReLiF host work: ATen calls and GPU kernel launches of one regularizer forward + backward,
  deterministic counts (target: their pinned bounds; `relif_op_count.py`);
- methods: each registered method's step time over ERM's (info) and over the implementation
  of the same method in TorchJD or the LibMTL 1.1.5 package on the same model and batch where
  one exists (target <= 1.0); for every representation-gradient mode, the step time over
  ERM's (target <= 1.3) and the cosine between its update and the exact one on the same batch
  (info; `methods_step_time.py`);
- audit: fixed-delta audit pair evaluations per second vs a plain Python loop (target >= 1e7
  on one core; `audit_throughput.py`);
- analysis: load and audit 1,000 generated trials (target <= 10 s; `analysis_load.py`; --quick
  times 100 trials and judges the linear extrapolation to 1,000);
- sweep efficiency on local Ray (target >= 0.97; `sweep_efficiency.py`, when present);
- architectures: each NYUv2 architecture's step time over LibMTL 1.1.5's same architecture on
  the same model and batch (target <= 1.0; `architectures_step_time.py`) and its peak memory
  per trial (one `trial_worker.py` process each);
- peak memory per trial: one process per variant (ERM + ReLiF and every registered method;
  `trial_worker.py`): peak RSS on CPU, torch.cuda.max_memory_allocated on CUDA, and its ratio
  to ERM's;
- CUDA only (else "needs a GPU"): training images/s of ResNet-50 at 288x384, batch 8, bf16,
  channels-last, for ERM, ERM + ReLiF and each method, and of a plain fp32 PyTorch loop of the
  same model (target: ERM >= 1.5x the plain loop); and aggregate images/s with the GPU's
  utilisation for 1, 2 and 4 ERM trials packed on one GPU.
- fidelity, only with `--only fidelity` (at most 15 minutes of sweeps on 2 idle CPU cores):
  ReLiF's and ReLiF-ST's fixed-delta Bias under three audit interfaces, clipped shares, VR,
  Worst and Macro against same-seed ERM through the real sweep and report (`fidelity.py`).

Run from the repository root with relif_ray importable (`pip install -e .`, or PYTHONPATH=.).
The sibling modules are imported inside their sections, so a section runs without the others'
dependencies (TorchJD for the methods rows, Ray for the sweep row).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rows import Row, emit, machine
from timing import TIMING_SQUASH_BAND, verdict, verdict_at_most

BENCHMARKS = Path(__file__).resolve().parent
SWEEP_EFFICIENCY_MODULE = "sweep_efficiency"
"""benchmarks/sweep_efficiency.py: `measure(trial_seconds=...) -> {"ratio": ...}`, `TARGET`."""

PACKED_TRIALS = (1, 2, 4)
GPU_SIZE = {"backbone": "resnet50", "height": 288, "width": 384, "batch_size": 8}
GPU_FAST_PATH = {"precision": "bf16", "channels_last": True, "data_on_device": True}
"""The `train` fields of the GPU rows: docs/benchmarks.md's fast path."""
WORKER_WARMUP_STEPS = 10
"""Untimed steps of each trial worker first: cuDNN's autotuning (`train.cudnn_benchmark`),
the caching allocator and the GPU's clocks settle in them."""
TOY_SIZE = (32, 40)
"""Image size of the GPU rows in a dry run on the CPU (`gpu_check.py --dry-run`)."""


PLAIN_LOOP = "plain fp32 loop"
"""The same model trained by a hand-written fp32 loop (`trial_worker.py --loop plain`)."""
PLAIN_LOOP_TARGET = 1.5
"""ERM's training images/s (bf16, channels-last, the engine) over the plain fp32 loop's."""


@dataclass
class Context:
    quick: bool
    device: torch.device
    workdir: Path
    compile: bool = False
    dry_run: bool = False
    """Run the GPU rows' code at toy size on this (CPU) device: `gpu_check.py --dry-run`."""
    compile_backend: str | None = None
    """torch.compile backend of `compile` (None: inductor; dry runs use "eager")."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def gpu_rows(self) -> bool:
        """Whether the GPU rows run: on CUDA, or at toy size in a dry run."""
        return self.cuda or self.dry_run


# --- ReLiF overhead -------------------------------------------------------------------------


def relif_rows(ctx: Context, rounds: int | None = None) -> list[Row]:
    import relif_step_time as module

    rounds = rounds or (20 if ctx.quick else 60)
    fast = GPU_FAST_PATH if ctx.gpu_rows else {}
    if ctx.cuda:
        dense = module.Setting(
            device="cuda",
            rounds=rounds,
            backbone="resnet50",
            height=288,
            width=384,
            batch_size=8,
            train=fast,
        )
    else:
        size = TOY_SIZE if ctx.dry_run else (64, 80) if ctx.quick else (96, 128)
        dense = module.Setting(rounds=rounds, height=size[0], width=size[1], train=fast)
    small = ctx.quick and not ctx.cuda
    lstm = module.Setting(
        model="lstm",
        device=str(ctx.device),
        rounds=rounds,
        batch_size=4 if ctx.dry_run else 16 if small else 64,
        patients=12 if ctx.dry_run else 40 if small else 120,
    )
    rows = []
    for label, setting in (("dense", dense), ("clinical LSTM", lstm)):
        result = module.measure(setting)
        shape = (
            f"{setting.backbone} {setting.height}x{setting.width}"
            if setting.model == "dense"
            else "LSTM 2x256"
        )
        rows.append(
            Row(
                "relif",
                f"ERM+ReLiF / ERM step time, {label}",
                result["ratio"],
                "x",
                f"<= {module.TARGET}",
                verdict_at_most(result["ratio"], result["ratio_low"], module.TARGET),
                f"[{result['ratio_low']:.3f}, {result['ratio_high']:.3f}]; {shape}, batch "
                f"{int(result['batch_size'])}; ERM {1e3 * result['erm_step_s']:.1f} ms, "
                f"ReLiF {1e3 * result['relif_step_s']:.1f} ms; {setting.rounds} rounds",
            )
        )
    return rows


RELIF_COUNT_METHODS = {
    "ATen calls": "nested calls included (torch.profiler)",
    "kernel launches": "operations on device tensors, views excluded, counted on the meta device",
}


def relif_op_count_rows(ctx: Context) -> list[Row]:
    """ATen calls and device kernel launches of one regularizer forward + backward (counts,
    made on the CPU whatever the device), against the counts before issue 29's rewrite
    (`relif_op_count.py`)."""
    import relif_op_count as module

    rows = []
    for setting in module.SETTINGS:
        shape = (
            f"{len(setting.tasks)} tasks, batch {setting.batch_size}, representation "
            f"{setting.width}; torch {torch.__version__}"
        )
        counts = {
            "ATen calls": (module.aten_calls, module.LIMIT, module.BEFORE),
            "kernel launches": (module.device_kernels, module.KERNEL_LIMIT, module.KERNELS_BEFORE),
        }
        for what, (count_of, limits, befores) in counts.items():
            how = RELIF_COUNT_METHODS[what]
            count, limit, before = count_of(setting), limits[setting.name], befores[setting.name]
            rows.append(
                Row(
                    "relif",
                    f"ReLiF regularizer {what} per step, {setting.name}",
                    count,
                    "",
                    f"<= {limit}",
                    verdict(count <= limit),
                    f"forward + backward, {how}; {before} before the rewrite "
                    f"({before / count:.2f}x); {shape}",
                )
            )
    return rows


# --- methods vs ERM and TorchJD -------------------------------------------------------------


def methods_rows(ctx: Context, rounds: int | None = None, cosine_steps: int = 20) -> list[Row]:
    import methods_step_time as module

    if ctx.cuda:
        description, summary, cosines = module.measure(
            "cuda",
            quick=ctx.quick,
            batch_size=GPU_SIZE["batch_size"],
            height=GPU_SIZE["height"],
            width=GPU_SIZE["width"],
            backbone=GPU_SIZE["backbone"],
            head_channels=128,
            rounds=rounds,
            cosine_steps=cosine_steps,
        )
    else:
        description, summary, cosines = module.measure(
            "cpu", quick=ctx.quick, rounds=rounds, cosine_steps=cosine_steps
        )
    rows = []
    for name, timing in summary.items():
        if name in module.COUNTERPART.values() or name == "erm":
            continue
        detail = f"{timing.ms_per_step:.1f} ms/step; {description}"
        target, result = "-", "info"
        if timing.erm_verdict is not None:  # representation modes have a target over ERM
            lower, upper = timing.vs_erm_interval
            target, result = f"<= {module.REPRESENTATION_TARGET}", timing.erm_verdict
            detail = f"[{lower:.2f}, {upper:.2f}]; {detail}"
        rows.append(
            Row("methods", f"{name} / ERM step time", timing.vs_erm, "x", target, result, detail)
        )
        if timing.vs_package is not None:
            median, lower, upper = timing.vs_package
            rows.append(
                Row(
                    "methods",
                    f"{name} / {module.COUNTERPART[name]} step time",
                    median,
                    "x",
                    f"<= {module.TARGET}",
                    timing.verdict,
                    f"[{lower:.2f}, {upper:.2f}]",
                )
            )
    for name, values in cosines.items():
        rows.append(
            Row(
                "methods",
                f"{name}-representation update cosine with exact",
                statistics.mean(values),
                "",
                "-",
                "info",
                f"mean over {len(values)} steps on one batch; first {values[0]:.4f}, "
                f"min {min(values):.4f}",
            )
        )
    return rows


# --- architectures vs LibMTL, and their memory ----------------------------------------------


def architecture_rows(
    ctx: Context, names: tuple[str, ...] | None = None, rounds: int | None = None
) -> list[Row]:
    """Each NYUv2 architecture's step time over LibMTL 1.1.5's same architecture on the same
    model and batch (`architectures_step_time.py`, target <= 1.0), and its peak memory per
    trial (one `trial_worker.py` process each, ERM; on CUDA the GPU rows' setting)."""
    import architectures_step_time as module

    if ctx.cuda:
        size = {key: GPU_SIZE[key] for key in ("batch_size", "height", "width", "backbone")}
        description, timings = module.measure(
            "cuda", ctx.quick, rounds, architectures=names, **size
        )
    else:
        description, timings = module.measure("cpu", ctx.quick, rounds, architectures=names)
    rows = []
    for name, timing in timings.items():
        median, lower, upper = timing.ratio
        rows.append(
            Row(
                "architectures",
                f"{name} / LibMTL {module.LIBMTL_NAMES[name]} step time",
                median,
                "x",
                f"<= {module.TARGET}",
                timing.verdict,
                f"[{lower:.2f}, {upper:.2f}]; {timing.ms_per_step:.1f} against "
                f"{timing.libmtl_ms_per_step:.1f} ms/step; {description}",
            )
        )
    root = data_root(ctx, ctx.gpu_rows)
    for name in timings:
        config = trial_config(ctx, root, "erm", ctx.gpu_rows)
        options = module.QUICK_OPTIONS.get(name, {}) if ctx.quick else {}
        config["model"].update(architecture=name, architecture_options=options)
        result = timed_worker(ctx, config)
        peak = "cuda_peak_mb" if ctx.cuda else "peak_rss_mb"
        where = "torch.cuda.max_memory_allocated" if ctx.cuda else "peak RSS, one process"
        rows.append(
            Row(
                "memory",
                f"peak {'GPU memory' if ctx.cuda else 'RSS'} per trial, architecture {name}",
                result[peak],
                "MiB",
                "-",
                "info",
                f"{setting_text(config, root)}, ERM, {where}",
            )
        )
    return rows


# --- audit throughput -----------------------------------------------------------------------


def audit_rows(ctx: Context) -> list[Row]:
    import audit_throughput as module

    result = module.measure(pairs=2**19 if ctx.quick else 2**21)
    return [
        Row(
            "audit",
            "fixed-delta audit throughput (1 core)",
            result["pairs_per_s"],
            "pairs/s",
            f">= {module.TARGET:.0e}",
            verdict(result["pairs_per_s"] >= module.TARGET),
            f"{result['pairs']:.3g} pairs in {result['seconds']:.3f} s (sampling included); "
            f"plain Python loop {result['loop_pairs_per_s']:.3g} pairs/s "
            f"({result['speedup']:.1f}x)",
        )
    ]


# --- analysis load --------------------------------------------------------------------------


def analysis_rows(ctx: Context) -> list[Row]:
    import analysis_load as module

    trials = 100 if ctx.quick else 1000
    root = ctx.workdir / "analysis"
    generated = module.generate(root, trials, 654)
    result = module.measure(root)
    per_thousand = result["total_s"] * 1000 / trials
    passed = per_thousand <= module.TARGET_SECONDS
    detail = (
        f"load {result['load_s']:.2f} s + audit {result['audit_s']:.2f} s; generating took "
        f"{generated:.0f} s (not timed)"
    )
    if ctx.quick:
        detail = f"{trials} trials (--quick), x10 = {per_thousand:.1f} s for 1000; " + detail
    return [
        Row(
            "analysis",
            f"load + audit {trials} generated trials",
            result["total_s"],
            "s",
            f"<= {module.TARGET_SECONDS:g} s / 1000",
            verdict(passed) + (" (scaled)" if ctx.quick else ""),
            detail,
        )
    ]


# --- sweep efficiency -----------------------------------------------------------------------


def sweep_rows(ctx: Context) -> list[Row]:
    name = "sweep efficiency, local Ray (busy / wall x slots)"
    if importlib.util.find_spec(SWEEP_EFFICIENCY_MODULE) is None:
        return [
            Row(
                "sweep",
                name,
                None,
                "",
                ">= 0.97",
                "not available",
                "benchmarks/sweep_efficiency.py is not in this checkout",
            )
        ]
    module = importlib.import_module(SWEEP_EFFICIENCY_MODULE)
    result = module.measure(trial_seconds=8.0 if ctx.quick else 30.0)
    return [
        Row(
            "sweep",
            name,
            result["ratio"],
            "",
            f">= {module.TARGET}",
            verdict(result["ratio"] >= module.TARGET),
            f"{result['trials']} trials of {result['mean_trial_s']:.1f} s on "
            f"{result['slots']} slots, wall {result['wall_s']:.1f} s; idle slot-s: "
            f"{result['idle_start_s']:.1f} before the first trial (actor start, imports), "
            f"{result['idle_between_s']:.1f} between, {result['idle_end_s']:.1f} after the last",
        )
    ]


# --- one process per trial: memory, GPU throughput, packing ---------------------------------


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


def warm_up_gpu(device: torch.device, seconds: float = 3.0) -> None:
    """Keep the GPU busy with matrix products for `seconds`, so that the first worker timed
    after an idle spell does not meet it at idle clocks."""
    a = torch.randn(4096, 4096, device=device)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize(device)
    del a
    torch.cuda.empty_cache()


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


def packing_rows(ctx: Context) -> list[Row]:
    if not ctx.cuda:
        return [
            Row("gpu", f"GPU utilisation, {k} ERM trial(s) packed", None, "%", "-", "needs a GPU")
            for k in PACKED_TRIALS
        ]
    root = data_root(ctx, gpu=True)
    seconds = 10.0 if ctx.quick else 30.0
    rows = []
    for count in PACKED_TRIALS:
        start_at = time.time() + 60.0  # every worker set up and warmed up by then
        sampler = UtilisationSampler(ctx.device, start_at, seconds)
        sampler.start()
        config = trial_config(ctx, root, "erm", gpu=True)
        job = functools.partial(
            run_worker, config, WORKER_WARMUP_STEPS, seconds=seconds, start_at=start_at
        )
        results = _parallel([job] * count)
        sampler.join()
        utilisation = sampler.mean()
        rows.append(
            Row(
                "gpu",
                f"GPU utilisation, {count} ERM trial(s) packed",
                utilisation,
                "%",
                "-",
                "info" if utilisation is not None else "no reading",
                f"aggregate {sum(r['images_per_s'] for r in results):.1f} img/s over "
                f"{seconds:.0f} s; peak GPU memory per trial "
                f"{max(r['cuda_peak_mb'] for r in results):.0f} MiB",
            )
        )
    return rows


def _parallel(jobs: list[Callable[[], dict]]) -> list[dict]:
    results: list[dict] = [{}] * len(jobs)

    def target(index: int) -> None:
        results[index] = jobs[index]()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(not result for result in results):
        raise RuntimeError("a packed trial worker failed")
    return results


class UtilisationSampler(threading.Thread):
    """GPU utilisation (%) every `period` s inside [start_at, start_at + seconds] (NVML through
    torch.cuda.utilization, else nvidia-smi), as (time.time(), percent) samples; `mean()` is
    None without any reading."""

    def __init__(
        self, device: torch.device, start_at: float, seconds: float, period: float = 0.5
    ) -> None:
        super().__init__(daemon=True)
        self.index = device.index or 0
        self.start_at, self.seconds, self.period = start_at, seconds, period
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self.index))
        except Exception:  # no NVML bindings (pynvml), or NVML failed: ask nvidia-smi
            query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            try:
                lines = subprocess.run(
                    [*query, "-i", str(self.index)], capture_output=True, text=True, check=True
                ).stdout.split()
            except (OSError, subprocess.CalledProcessError):
                return None
            return float(lines[0]) if lines else None

    def run(self) -> None:
        time.sleep(max(0.0, self.start_at - time.time()))
        while time.time() < self.start_at + self.seconds and not self.stopped.is_set():
            value = self.read()
            if value is not None:
                self.samples.append((time.time(), value))
            self.stopped.wait(self.period)

    def mean(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        """Mean utilisation of the samples taken in [start, end]."""
        values = [value for at, value in self.samples if start <= at <= end]
        return statistics.mean(values) if values else None


# --- fidelity (not in the default run) -----------------------------------------------------


def fidelity_rows(ctx: Context) -> list[Row]:
    import fidelity as module

    size = module.QUICK if ctx.quick else module.FULL
    return module.fidelity_rows(size, ctx.workdir / "fidelity")


# --- table ----------------------------------------------------------------------------------

SECTIONS: dict[str, Callable[[Context], list[Row]]] = {
    "relif": relif_rows,
    "relif-ops": relif_op_count_rows,
    "methods": methods_rows,
    "audit": audit_rows,
    "analysis": analysis_rows,
    "sweep": sweep_rows,
    "memory": memory_and_throughput_rows,
    "architectures": architecture_rows,
    "packing": packing_rows,
    "fidelity": fidelity_rows,
}
DEFAULT_SECTIONS = [name for name in SECTIONS if name != "fidelity"]
"""The full run: every section but fidelity (up to 15 minutes of sweeps; `--only fidelity`)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: minutes on 2 CPUs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(SECTIONS),
        help="run these sections only (fidelity runs only when named here)",
    )
    parser.add_argument("--compile", action="store_true", help="GPU rows with torch.compile")
    args = parser.parse_args(argv)
    name = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = torch.device("cpu" if name == "auto" else name)
    torch.set_num_threads(1)
    info = machine(device)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        context = Context(args.quick, device, Path(tmp), args.compile)
        for section in args.only or DEFAULT_SECTIONS:
            rows += SECTIONS[section](context)
    return emit(rows, info, args.quick, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
