"""What ReLiF costs a training step: the `relif` suite (ERM + ReLiF step time over ERM's,
interleaved) and the `relif-ops` suite (the ATen calls and device kernel launches of one
regulariser forward + backward: on a GPU each costs host time, and both counts are
deterministic for a torch version, so `tests/test_benchmarks.py` holds them to their targets)."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.harness import Context, interleaved_times, ratio_with_interval
from benchmarks.workers import GPU_FAST_PATH, TIMING_SQUASH_BAND, TOY_IMAGE
from relif_ray.config import ExperimentConfig, ReLiFConfig
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2
from relif_ray.engine import TrainingRun
from relif_ray.relif.regularizer import ReLiFRegularizer


def measure_step(config: dict, rounds: int) -> dict[str, float]:
    """Median seconds per step of ERM and ERM + ReLiF (`config` with ReLiF off and on: the
    same model, data and batch), the median per-round ratio and its interval."""
    relif = {"warmup_steps": 0, "squash_constants": TIMING_SQUASH_BAND}
    configs = {name: {**config, "relif": {**relif, "enabled": name == "relif"}}
               for name in ("erm", "relif")}  # fmt: skip
    runs = {name: TrainingRun(ExperimentConfig.from_dict(c)) for name, c in configs.items()}
    steps = {name: (lambda run=run: run.train_steps(1)) for name, run in runs.items()}
    times = interleaved_times(steps, rounds, 3, config["device"] == "cuda")
    ratio, lower, upper = ratio_with_interval(times, "relif", "erm")
    erm, relif = (statistics.median(times[name]) for name in ("erm", "relif"))
    return {"ratio": ratio, "low": lower, "high": upper, "erm_s": erm, "relif_s": relif}


def relif_suite(ctx: Context) -> None:
    """The dense NYUv2 model (a CPU-sized stand-in for ResNet-50 at 288x384 unless on CUDA,
    with the GPU rows' fast path) and the paper's clinical LSTM (2 x 256)."""
    size = "real" if ctx.cuda else ctx.size
    rounds = 60 if size == "real" else 20
    image = {"toy": TOY_IMAGE, "demo": (64, 80), "real": (96, 128)}[size]
    backbone, (height, width) = "resnet18", image
    if ctx.cuda:
        backbone, height, width = "resnet50", 288, 384
    batch, patients = {"toy": (4, 12), "demo": (16, 40), "real": (64, 120)}[size]
    nyuv2 = write_synthetic_nyuv2(ctx.workdir / f"relif-nyuv2-{height}x{width}", train=32, val=2,
                                  height=height, width=width, seed=0)  # fmt: skip
    mimic3 = write_synthetic_mimic3(ctx.workdir / f"mimic3-{patients}", patients=patients, seed=0)
    settings = {  # label: data, model, batch, train fields, shape
        "dense": ({"dataset": "nyuv2", "root": str(nyuv2)}, {"backbone": backbone,
                  "head_channels": 128}, 8, GPU_FAST_PATH if ctx.gpu_rows else {},
                  f"{backbone} {height}x{width}"),
        "clinical LSTM": ({"dataset": "mimic3", "root": str(mimic3)}, {"hidden_size": 256,
                          "num_layers": 2}, batch, {}, "LSTM 2x256"),
    }  # fmt: skip
    for label, (data, model, batch_size, train, shape) in settings.items():
        with ctx.step(f"ERM+ReLiF / ERM step time, {label}"):
            train = {"epochs": 1000, "batch_size": batch_size, **train}
            config = {"device": ctx.device.type, "data": data, "model": model, "train": train}
            m = measure_step(config, rounds)
            detail = (f"[{m['low']:.3f}, {m['high']:.3f}]; {shape}, batch {batch_size}; ERM "
                      f"{1e3 * m['erm_s']:.1f} ms, ReLiF {1e3 * m['relif_s']:.1f} ms; {rounds} "
                      "rounds")  # fmt: skip
            ctx.judged("ERM+ReLiF / ERM step time", f"ERM+ReLiF / ERM step time, {label}",
                       m["ratio"], "x", detail, (m["low"], m["high"]))  # fmt: skip


# --- the regularizer's ATen calls and kernel launches -----------------------------------------


@dataclass(frozen=True)
class OpSetting:
    """One regularizer call's shape: tasks (those in `squashed` have unbounded scores), batch
    size, representation width, and its counts before the regularizer's rewrite for the GPU
    (commit 024f0cd; torch 2.14.1)."""

    name: str
    tasks: tuple[str, ...]
    squashed: tuple[str, ...]
    batch_size: int
    width: int
    calls_before: int
    kernels_before: int


OP_SETTINGS = (
    OpSetting("NYUv2", ("seg", "depth", "normal"), ("depth", "normal"), 8, 2048, 971, 297),
    OpSetting("clinical", ("mortality", "decompensation", "length_of_stay", "phenotype"), (),
              64, 256, 975, 297),
)  # fmt: skip
"""NYUv2: ResNet-50's pooled representation, batch 8, depth and normal squashed with the ERM
band; clinical: the LSTM's representation (hidden 256), batch 64, four probability scores."""


def regularizer_steps(setting: OpSetting, device: torch.device | None = None):  # noqa: ANN201
    """(inputs, step): `inputs()` draws a fresh random batch of scores, masks and
    representation on `device` (default the CPU); `step(batch)` runs forward + backward."""
    device = device or torch.device("cpu")
    constants = {task: [0.0, 10.0] for task in setting.squashed}
    config = ReLiFConfig(enabled=True, warmup_steps=0, squash_constants=constants)
    regularizer = ReLiFRegularizer(config, list(setting.tasks)).to(device)
    generator = torch.Generator().manual_seed(0)
    is_probability = {task: task not in setting.squashed for task in setting.tasks}

    def inputs() -> tuple[dict, torch.Tensor]:
        scores = {}
        for task in setting.tasks:
            scale = 10.0 if task in setting.squashed else 1.0
            score = torch.rand(setting.batch_size, generator=generator) * scale
            valid = torch.rand(setting.batch_size, generator=generator) > 0.2
            scores[task] = (score.to(device).requires_grad_(), valid.to(device))
        representation = torch.randn((setting.batch_size, setting.width), generator=generator)
        return scores, representation.to(device).requires_grad_()

    def step(batch: tuple[dict, torch.Tensor]) -> None:
        loss, _ = regularizer(*batch, is_probability)
        loss.backward()

    return inputs, step


@contextlib.contextmanager
def cuda_like_algorithms() -> Iterator[None]:
    """Deterministic algorithms off, as in a CUDA run (the engine turns them on for CPU runs,
    and on the CPU they take other ATen paths: 836 calls rather than 602 for NYUv2)."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)


def aten_calls(setting: OpSetting, warm_steps: int = 3) -> int:
    """ATen calls (nested ones included, torch.profiler) of one warm forward + backward."""
    inputs, step = regularizer_steps(setting)
    with cuda_like_algorithms():
        for _ in range(warm_steps):  # scales, controller and the cached constants are set
            step(inputs())
        batch = inputs()
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            step(batch)
    return sum(1 for event in profiler.events() if event.name.startswith("aten::"))


class _DeviceKernels(TorchDispatchMode):
    """Counts the operations that make or write a tensor on the device, views excluded (each
    would be a kernel launch on a GPU)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device, self.count = device, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        result = func(*args, **(kwargs or {}))
        outputs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        if not func.is_view and any(t.device == self.device for t in outputs):
            self.count += 1
        return result


def device_kernels(setting: OpSetting, warm_steps: int = 3) -> int:
    """Kernel launches of one warm forward + backward on a GPU, counted without one: on the
    "meta" device (shapes only) every operation that makes or writes a tensor, views excluded.
    (ATen calls on host numbers launch nothing.)"""
    meta = torch.device("meta")
    inputs, step = regularizer_steps(setting, meta)
    with cuda_like_algorithms():
        for _ in range(warm_steps):
            step(inputs())
        batch = inputs()
        with _DeviceKernels(meta) as kernels:
            step(batch)
    return kernels.count


def relif_ops_suite(ctx: Context) -> None:
    """Both counts of each setting, made on the CPU whatever the device."""
    how = {"ATen calls": "nested calls included (torch.profiler)",
           "kernel launches": "operations on device tensors, views excluded, counted on the "
           "meta device"}  # fmt: skip
    for setting in OP_SETTINGS:
        shape = (f"{len(setting.tasks)} tasks, batch {setting.batch_size}, representation "
                 f"{setting.width}; torch {torch.__version__}")  # fmt: skip
        counted = {"ATen calls": (aten_calls(setting), setting.calls_before),
                   "kernel launches": (device_kernels(setting), setting.kernels_before),
                   }  # fmt: skip
        for what, (count, before) in counted.items():
            detail = (f"forward + backward, {how[what]}; {before} before the rewrite "
                      f"({before / count:.2f}x); {shape}")  # fmt: skip
            name = f"ReLiF regularizer {what} per step, {setting.name}"
            ctx.judged(f"ReLiF {what}, {setting.name}", name, count, "", detail)
